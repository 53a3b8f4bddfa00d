"""The native decoder takes every well-formed record and leaves every other one to the per-record decoder; without
it, the per-record decoder takes them all and decodes batches the same."""

import numpy as np
import pytest

from conftest import load_sidecar
from yt8m.data.format import batch_decode
from yt8m.data.format.batch_decode import PackedRecords, decode_packed
from yt8m.data.format.decode import RecordError, decode_video_batch
from yt8m.data.format.encode import encode_video_example
from yt8m.data.format.tfrecord import read_records

needs_native = pytest.mark.skipif(batch_decode.native is None, reason="the native extension is not built")

WANTED = [(b"mean_rgb", 1024, 0), (b"mean_audio", 128, 1024)]


def video(labels=(1, 2), video_id="abcd", rgb_size=1024, id_key="id") -> bytes:
    rng = np.random.default_rng(len(labels))
    features = {"mean_rgb": rng.standard_normal(rgb_size).astype(np.float32),
                "mean_audio": rng.standard_normal(128).astype(np.float32)}
    return encode_video_example(video_id, list(labels), features, id_key=id_key)


def decode(payloads, num_classes=3862):
    out = np.zeros((len(payloads), 1152), np.float32)
    return decode_packed(PackedRecords.join(payloads), WANTED, num_classes, out), out


@needs_native
@pytest.mark.parametrize("name", ["video/train00.tfrecord", "video_gzip/train00.tfrecord.gz"])
def test_tensorflow_written_records_all_take_the_native_decoder(fixtures_dir, name):
    path = fixtures_dir / name
    records = load_sidecar(path)["records"]
    decoded, out = decode([payload for _, payload in read_records(str(path))])
    assert decoded.done.all()
    assert decoded.video_ids == [r["id"] for r in records]
    rows = [row for row, r in enumerate(records) for _ in r["labels"]]
    assert decoded.label_rows.tolist() == rows
    assert decoded.label_values.tolist() == [label for r in records for label in r["labels"]]
    expected = np.stack([np.array(r["mean_rgb"] + r["mean_audio"], np.float32) for r in records])
    assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))


@needs_native
def test_records_it_cannot_take_are_left_undone_and_the_rest_decoded():
    payloads = [video(), video(labels=(3862,)), video(labels=()), video(rgb_size=1000), video(video_id="é"),
                video(labels=(-1,)), video(id_key="video_id"), video()[:-3], b"", video(labels=(3861, 0))]
    decoded, _ = decode(payloads)
    assert decoded.done.tolist() == [True, False, True, False, True, False, True, False, False, True]
    assert decoded.video_ids[4] == "é" and decoded.video_ids[6] == "abcd"
    assert list(zip(decoded.label_rows.tolist(), decoded.label_values.tolist())) == [
        (0, 1), (0, 2), (4, 1), (4, 2), (6, 1), (6, 2), (9, 3861), (9, 0)]


@needs_native
def test_labels_of_three_byte_varints_are_read_when_num_classes_allows():
    decoded, _ = decode([video(labels=(20000, 5))], num_classes=30000)
    assert decoded.done.all() and decoded.label_values.tolist() == [20000, 5]
    assert not decode([video(labels=(20000,))], num_classes=3862)[0].done.any()


@needs_native
def test_ids_of_mixed_lengths_and_non_ascii_text_are_decoded_exactly():
    ids = ["abcd", "ab", "é\u4e2d", "a\x00", "wxyz"]
    decoded, _ = decode([video(video_id=video_id) for video_id in ids])
    assert decoded.done.all() and decoded.video_ids == ids
    same_length = ["ab\x00", "abc", "xyz"]
    assert decode([video(video_id=video_id) for video_id in same_length])[0].video_ids == same_length


@needs_native
def test_damaged_records_decode_as_the_record_by_record_parser_decodes_them(fixtures_dir):
    """Random byte changes in real records: the batch decoder gives exactly what decode_video gives, or the
    same error; whatever the native decoder takes, it takes right."""
    from yt8m.data.format.decode import decode_video

    payloads = [payload for _, payload in read_records(str(fixtures_dir / "video" / "train00.tfrecord"))][:40]
    rng = np.random.default_rng(5)
    damaged = []
    for _ in range(400):
        payload = bytearray(payloads[rng.integers(len(payloads))])
        # Mostly the first and last bytes, where the headers, id and labels lie, some in the floats.
        for _ in range(rng.integers(1, 3)):
            spot = int(rng.choice([rng.integers(0, 40), rng.integers(len(payload) - 40, len(payload)),
                                   rng.integers(0, len(payload))]))
            payload[spot] = int(rng.integers(0, 256))
        damaged.append(bytes(payload))
    names, sizes = ["mean_rgb", "mean_audio"], [1024, 128]
    taken = 0
    for payload in damaged:
        try:
            expected = decode_video(payload, names, sizes, 3862)
        except RecordError as err:
            with pytest.raises(RecordError) as caught:
                decode_video_batch([payloads[0], payload], names, sizes, 3862)
            assert str(caught.value) == str(err) and caught.value.batch_index == 1
            continue
        batch = decode_video_batch([payloads[0], payload], names, sizes, 3862)
        assert batch.video_ids[1] == expected[0] and batch.labels.lists()[1] == expected[1].tolist()
        assert np.array_equal(batch.features[1].view(np.uint32), expected[2].view(np.uint32))
        taken += bool(decode([payload])[0].done[0])
    assert taken > 50  # it still takes records whose changed bytes leave them well-formed


def test_an_empty_batch_decodes_to_nothing():
    batch = decode_video_batch([], ["mean_rgb", "mean_audio"], [1024, 128], 3862)
    assert batch.video_ids == [] and batch.features.shape == (0, 1152) and batch.labels.lists() == []


@needs_native
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, np.float32(np.nan) * -1])
@pytest.mark.parametrize("feature, index", [("mean_rgb", 0), ("mean_rgb", 1023), ("mean_audio", 77)])
def test_a_non_finite_value_leaves_the_record_to_the_per_record_decoder(bad, feature, index):
    """Every float position of either feature, NaN of either sign and both infinities; the other records of the
    batch are still decoded, their floats intact (the check rides along their copy)."""
    rng = np.random.default_rng(index)
    features = {"mean_rgb": rng.standard_normal(1024).astype(np.float32),
                "mean_audio": rng.standard_normal(128).astype(np.float32)}
    features[feature][index] = bad
    extreme = {"mean_rgb": np.full(1024, np.finfo(np.float32).max, np.float32),
               "mean_audio": np.full(128, -np.finfo(np.float32).smallest_subnormal, np.float32)}
    payloads = [video(), encode_video_example("nan0", [1], features), encode_video_example("max0", [2], extreme)]
    decoded, out = decode(payloads)
    assert decoded.done.tolist() == [True, False, True]
    assert np.array_equal(out[2].view(np.uint32), np.concatenate([extreme["mean_rgb"], extreme["mean_audio"]])
                          .view(np.uint32))


def test_without_the_native_decoder_batches_decode_the_same(fixtures_dir, monkeypatch):
    """Fixture records and records it leaves to the per-record decoder, and a bad record's error, with the native
    decoder and with the per-record decoder alone (an install without a C compiler)."""
    payloads = [payload for name in ("video/train00.tfrecord", "video_2017/train00.tfrecord")
                for _, payload in read_records(str(fixtures_dir / name))]
    payloads += [video(labels=()), video(video_id="é"), video(labels=(3861, 0))]
    bad = payloads[:3] + [video(labels=(3862,))]
    names, sizes = ["mean_rgb", "mean_audio"], [1024, 128]
    results = []
    for native in (batch_decode.native, None):
        monkeypatch.setattr(batch_decode, "native", native)
        batch = decode_video_batch(payloads, names, sizes, 3862)
        with pytest.raises(RecordError) as caught:
            decode_video_batch(bad, names, sizes, 3862)
        results.append((batch.video_ids, batch.labels.lists(), batch.features.view(np.uint32).tolist(),
                        str(caught.value), caught.value.batch_index))
    assert results[0] == results[1]
    assert len(results[0][0]) == len(payloads) and results[0][4] == 3

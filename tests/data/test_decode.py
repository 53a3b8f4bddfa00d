"""Tests of the Example / SequenceExample wire encoders and decoders against TensorFlow-written fixtures."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import as_float32, load_sidecar, manifest_totals
from yt8m.data.format.encode import encode_frame_example, encode_video_example
from yt8m.data.format.tfrecord import read_records
from yt8m.data.format.wire_scan import iter_fields

VIDEO_FILES = ["video/train00.tfrecord", "video/train01.tfrecord", "video/train02.tfrecord",
               "video_2017/train00.tfrecord", "video_gzip/train00.tfrecord.gz"]
FRAME_FILES = ["frame/train00.tfrecord", "frame/train01.tfrecord",
               "segment/validate00.tfrecord", "segment/validate01.tfrecord"]
SEGMENT_KEYS = ("segment_start_times", "segment_end_times", "segment_labels", "segment_scores")


def map_layout(payload: bytes) -> list[tuple[int, list[bytes]]]:
    """Each top-level field with the raw bytes of its map entries, sorted.

    TensorFlow leaves map order unspecified (the fixtures differ file to file), so this is the byte
    layout up to the order of map entries: every entry, key and value, must match byte for byte.
    """
    layout = []
    for number, _, (start, end) in iter_fields(payload):
        entries = sorted(payload[s:e] for _, _, (s, e) in iter_fields(payload, start, end))
        layout.append((number, entries))
    return layout


def encode_video_record(record: dict, id_key: str) -> bytes:
    features = {"mean_rgb": as_float32(record["mean_rgb"]), "mean_audio": as_float32(record["mean_audio"])}
    labels = record["labels"] if record["labels_present"] else None
    return encode_video_example(record["id"], labels, features, id_key=id_key)


def encode_frame_record(record: dict, id_key: str) -> bytes:
    frames = {name: np.asarray(record[name], dtype=np.uint8).reshape(record["num_frames"], -1)
              for name in ("rgb", "audio")}
    segments = {key: record[key] for key in SEGMENT_KEYS if key in record} or None
    return encode_frame_example(record["id"], record["labels"], frames, segments, id_key=id_key)


@pytest.mark.parametrize("name", VIDEO_FILES + FRAME_FILES)
def test_encoders_match_tensorflow_layout(fixtures_dir, name):
    path = fixtures_dir / name
    sidecar = load_sidecar(path)
    encode = encode_frame_record if sidecar["kind"] in ("frame", "segment") else encode_video_record
    for (_, stored), record in zip(read_records(str(path)), sidecar["records"], strict=True):
        mine = encode(record, sidecar["id_feature"])
        assert len(mine) == len(stored)
        assert map_layout(mine) == map_layout(stored), f"{name} record {record['index']}"


# ---------------------------------------------------------------------------------------------- decoding

import pickle  # noqa: E402

from yt8m.data.format.decode import (  # noqa: E402
    LabelIds,
    RecordError,
    VideoBatch,
    decode_frame,
    decode_video,
    decode_video_batch,
    dequantize,
)
from yt8m.data.format.encode import encode_varint  # noqa: E402
from yt8m.data.format.example_parse import parse_record  # noqa: E402
from yt8m.data.format.tfrecord import TFRecordWriter, expand_pattern  # noqa: E402
from yt8m.data.format.wire_scan import WireFormatError  # noqa: E402

NAMES = ["mean_rgb", "mean_audio"]
SIZES = [1024, 128]
FRAME_NAMES = ["rgb", "audio"]
FRAME_SIZES = [1024, 128]


def bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def expected_frames(record: dict) -> np.ndarray:
    return np.concatenate([np.asarray(record[name], dtype=np.uint8).reshape(record["num_frames"], size)
                           for name, size in zip(FRAME_NAMES, FRAME_SIZES)], axis=1)


def as_lists(batch: VideoBatch) -> tuple[list[str], list[list[int]], np.ndarray]:
    return batch.video_ids, batch.labels.lists(), batch.features


@pytest.mark.parametrize("name", VIDEO_FILES)
def test_decode_video_matches_sidecar_bit_for_bit(fixtures_dir, name):
    path = fixtures_dir / name
    sidecar = load_sidecar(path)
    payloads = [payload for _, payload in read_records(str(path))]
    ids, labels, features = as_lists(decode_video_batch(payloads, NAMES, SIZES, 3862))
    for row, (payload, record) in enumerate(zip(payloads, sidecar["records"], strict=True)):
        expected = np.concatenate([as_float32(record["mean_rgb"]), as_float32(record["mean_audio"])])
        video_id, video_labels, video_features = decode_video(payload, NAMES, SIZES, 3862)
        assert video_id == ids[row] == record["id"]
        assert video_labels.dtype == np.int64 and video_labels.tolist() == labels[row] == record["labels"]
        assert np.array_equal(bits(video_features), bits(expected))
        assert np.array_equal(bits(features[row]), bits(expected))


def test_batch_of_mixed_layouts_matches_sidecars(fixtures_dir):
    """One batch over records of all video files shuffled: key orders, id keys and label counts vary
    from record to record, as in real shards."""
    pairs = []
    for name in VIDEO_FILES:
        path = fixtures_dir / name
        pairs += zip((p for _, p in read_records(str(path))), load_sidecar(path)["records"], strict=True)
    order = np.random.default_rng(11).permutation(len(pairs))
    payloads = [pairs[i][0] for i in order]
    records = [pairs[i][1] for i in order]
    ids, labels, features = as_lists(decode_video_batch(payloads, ["mean_audio", "mean_rgb"], [128, 1024], 3862))
    assert ids == [r["id"] for r in records] and labels == [r["labels"] for r in records]
    expected = np.stack([np.concatenate([as_float32(r["mean_audio"]), as_float32(r["mean_rgb"])]) for r in records])
    assert np.array_equal(bits(features), bits(expected))


def test_extreme_floats_survive(fixtures_dir):
    path = fixtures_dir / "video/train00.tfrecord"
    payload = [p for _, p in read_records(str(path))][70]
    _, _, features = decode_video(payload, NAMES, SIZES, 3862)
    found = set(bits(features).tolist())
    for value in (-0.0, 3.4028235e38, -3.4028235e38, 1e-40, -1.4e-45, 1.1754944e-38):
        assert int(bits([value])[0]) in found, value


def test_absent_labels_read_as_none(fixtures_dir):
    payload = [p for _, p in read_records(str(fixtures_dir / "video/train02.tfrecord"))][92]
    assert "labels" not in parse_record(payload)["features"]
    assert decode_video(payload, NAMES, SIZES, 3862)[1].tolist() == []


@pytest.mark.parametrize("name", FRAME_FILES)
def test_decode_frame_matches_sidecar(fixtures_dir, name):
    path = fixtures_dir / name
    for (_, payload), record in zip(read_records(str(path)), load_sidecar(path)["records"], strict=True):
        expected = expected_frames(record)
        for max_frames in (300, 1000, 2):
            video_id, labels, frames, num_frames = decode_frame(payload, FRAME_NAMES, FRAME_SIZES, 3862, max_frames)
            assert video_id == record["id"] and labels.tolist() == record["labels"]
            assert num_frames == min(record["num_frames"], max_frames) == len(frames)
            assert frames.dtype == np.uint8 and np.array_equal(frames, expected[:max_frames])


@pytest.mark.parametrize("name", FRAME_FILES)
def test_parse_record_keeps_every_frame_and_segment_field(fixtures_dir, name):
    path = fixtures_dir / name
    for (_, payload), record in zip(read_records(str(path)), load_sidecar(path)["records"], strict=True):
        parsed = parse_record(payload)
        assert parsed["message"] == "SequenceExample"
        context = parsed["context"]
        assert context["id"] == [record["id"].encode()] and context["labels"].tolist() == record["labels"]
        for key in SEGMENT_KEYS:
            assert (key in context) == (key in record)
            if key in record:
                assert np.array_equal(context[key], np.asarray(record[key], dtype=context[key].dtype))
        for feature in FRAME_NAMES:
            frames = parsed["feature_lists"][feature]
            assert len(frames) == record["num_frames"]
            assert [list(values[0]) for values in frames] == record[feature]


def test_dequantize_follows_yt8m_formula():
    values = np.array([[0, 1, 127, 128, 254, 255]], dtype=np.uint8)
    expected = values.astype(np.float32) * np.float32(4 / 255) + np.float32(4 / 512 - 2)
    result = dequantize(values)
    assert result.dtype == np.float32 and np.array_equal(bits(result), bits(expected))
    assert abs(result[0, 0] - (-2 + 4 / 512)) < 1e-6 and abs(result[0, -1] - (2 + 4 / 512)) < 1e-6
    assert np.allclose(dequantize(values, 1.0, 0.0), values / 255 + 1 / 512)
    padded = np.zeros((3, 6), np.float32)
    assert dequantize(values, out=padded[1:2]) is not None and np.array_equal(bits(padded[1:2]), bits(expected))
    assert not padded[0].any() and not padded[2].any()


def test_label_ids_to_multi_hot():
    hot = LabelIds.from_lists([[3, 0, 3], [], [4]]).multi_hot(5)
    assert hot.dtype == bool
    assert hot.tolist() == [[1, 0, 0, 1, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        LabelIds.from_lists([[5]]).multi_hot(5)


# Hand-built wire bytes: the other valid encodings TensorFlow does not write.

def field(number: int, wire: int, body: bytes) -> bytes:
    key = encode_varint(number << 3 | wire)
    return key + (encode_varint(len(body)) + body if wire == 2 else body)


UNKNOWN = (field(9, 0, encode_varint(300)) + field(10, 1, b"\x01" * 8) + field(11, 5, b"\x02" * 4)
           + field(12, 2, b"skip me") + encode_varint(13 << 3 | 3) + field(1, 0, b"\x05") + encode_varint(13 << 3 | 4))


def unusual_video(video_id: str, labels: list, rgb: np.ndarray, audio: np.ndarray) -> bytes:
    """Unpacked floats and int64s, split packed chunks, value before key, unknown fields of every wire
    type at every level, a repeated features field, a duplicate key and a oneof switching kind."""
    unpacked_floats = b"".join(field(1, 5, v.tobytes()) for v in rgb[:10]) + UNKNOWN
    float_list = unpacked_floats + field(1, 2, rgb[10:500].tobytes()) + field(1, 2, rgb[500:].tobytes())
    rgb_feature = field(3, 2, field(1, 0, b"\x01")) + field(2, 2, float_list) + UNKNOWN
    labels_list = b"".join(field(1, 0, encode_varint(v)) for v in labels[:1]) + field(1, 2, b"".join(
        encode_varint(v) for v in labels[1:]))
    entries = [
        field(2, 2, rgb_feature) + UNKNOWN + field(1, 2, b"mean_rgb"),
        field(1, 2, b"labels") + field(2, 2, field(3, 2, labels_list)),
        field(1, 2, b"mean_audio") + field(2, 2, field(2, 2, field(1, 2, np.zeros(128, "<f4").tobytes()))),
    ]
    first = b"".join(field(1, 2, entry) for entry in entries)
    second = (field(1, 2, field(1, 2, b"mean_audio") + field(2, 2, field(2, 2, field(1, 2, audio.tobytes()))))
              + UNKNOWN + field(1, 2, field(1, 2, b"id") + field(2, 2, field(1, 2, field(1, 2, video_id.encode())))))
    return UNKNOWN + field(1, 2, first) + field(5, 2, b"x") + field(1, 2, second)


def test_full_wire_rules_decode_like_the_canonical_layout():
    rng = np.random.default_rng(7)
    rgb = rng.standard_normal(1024).astype("<f4")
    audio = rng.standard_normal(128).astype("<f4")
    labels = [3861, 5, 300, 5]
    unusual = unusual_video("wxyz", labels, rgb, audio)
    canonical = encode_video_example("wxyz", labels, {"mean_rgb": rgb, "mean_audio": audio})
    for payload in (unusual, canonical):
        video_id, decoded_labels, features = decode_video(payload, NAMES, SIZES, 3862)
        assert video_id == "wxyz" and decoded_labels.tolist() == labels
        assert np.array_equal(bits(features), bits(np.concatenate([rgb, audio])))
    ids, batch_labels, batch_features = as_lists(decode_video_batch([canonical, unusual], NAMES, SIZES, 3862))
    assert ids == ["wxyz", "wxyz"] and batch_labels == [labels, labels]
    assert np.array_equal(batch_features[0], batch_features[1])


def unusual_frames(frames: np.ndarray, labels: bytes) -> bytes:
    """Context after the feature lists, unknown fields in every frame's Feature, labels as given."""
    frame_features = [field(1, 2, field(1, 2, row.tobytes())) + UNKNOWN for row in frames]
    feature_list = b"".join(field(1, 2, f) for f in frame_features)
    context = field(1, 2, field(1, 2, b"id") + field(2, 2, field(1, 2, field(1, 2, b"abc")))) + field(
        1, 2, field(1, 2, b"labels") + field(2, 2, field(3, 2, labels)))
    return field(2, 2, field(1, 2, field(2, 2, feature_list) + field(1, 2, b"f"))) + field(1, 2, context)


def test_unusual_frame_layout_and_negative_int64():
    frames = np.arange(3 * 4, dtype=np.uint8).reshape(3, 4)
    payload = unusual_frames(frames, field(1, 0, encode_varint(-1)))
    parsed = parse_record(payload)
    assert parsed["context"]["labels"].tolist() == [-1]
    assert [values[0] for values in parsed["feature_lists"]["f"]] == [row.tobytes() for row in frames]
    with pytest.raises(RecordError, match="labels.*found -1"):
        decode_frame(payload, ["f"], [4], 10)
    video_id, labels, decoded, num_frames = decode_frame(unusual_frames(frames, b""), ["f"], [4], 10)
    assert (video_id, labels.tolist(), num_frames) == ("abc", [], 3) and np.array_equal(decoded, frames)


def video(features=None, labels=(1, 2), **kwargs) -> bytes:
    default = {"mean_rgb": np.zeros(1024, np.float32), "mean_audio": np.ones(128, np.float32)}
    return encode_video_example("abcd", list(labels), default if features is None else features, **kwargs)


@pytest.mark.parametrize("payload, pattern", [
    (video({"mean_rgb": np.zeros(1024, np.float32)}), r"'mean_audio': expected float_list of 128 values, found none"),
    (video({"mean_rgb": np.zeros(1000, np.float32), "mean_audio": np.zeros(128, np.float32)}),
     r"'mean_rgb': expected float_list of 1024 values, found float_list of 1000 values"),
    (video(labels=(1, 3862)), r"'labels': expected label ids in \[0, 3862\).*found 3862"),
    (video(labels=(-5,)), r"'labels'.*found -5"),
    (encode_video_example("abcd", [1], {"mean_rgb": np.zeros(1024), "mean_audio": np.zeros(128)}, id_key="video_id")
     .replace(b"video_id", b"video_xx"), r"no 'id' or 'video_id' feature"),
])
def test_decode_video_errors_name_field_expected_and_found(payload, pattern):
    with pytest.raises(RecordError, match=pattern):
        decode_video(payload, NAMES, SIZES, 3862)
    with pytest.raises(RecordError, match=pattern) as caught:
        decode_video_batch([video(), payload], NAMES, SIZES, 3862)
    assert caught.value.batch_index == 1
    located = caught.value.at("gs://bucket/shard.tfrecord", 4711)
    assert isinstance(located, RecordError)
    assert str(located).startswith("gs://bucket/shard.tfrecord: record at byte offset 4711: ")
    assert located.field == caught.value.field and located.offset == 4711


def test_decode_frame_errors():
    frames = {"rgb": np.zeros((3, 1024), np.uint8), "audio": np.zeros((3, 128), np.uint8)}
    payload = encode_frame_example("abcd", [1], frames)
    with pytest.raises(RecordError, match=r"feature list 'rgb', frame 0: expected 1000 bytes, found 1024 bytes"):
        decode_frame(payload, ["rgb"], [1000], 3862)
    with pytest.raises(RecordError, match=r"feature list 'depth': .*missing"):
        decode_frame(payload, ["rgb", "depth"], [1024, 8], 3862)
    # A second feature_lists field merges into the first (protobuf rules): rgb has 3 frames, audio 2.
    context_only = len(encode_frame_example("abcd", [1], {})) - 2  # minus the empty feature_lists field
    audio_lists = encode_frame_example("abcd", [1], {"audio": frames["audio"][:2]})[context_only:]
    uneven = encode_frame_example("abcd", [1], {"rgb": frames["rgb"]}) + audio_lists
    with pytest.raises(RecordError, match=r"same number of frames.*'rgb': 3, 'audio': 2"):
        decode_frame(uneven, FRAME_NAMES, FRAME_SIZES, 3862)
    with pytest.raises(RecordError, match="labels"):
        decode_frame(payload, FRAME_NAMES, FRAME_SIZES, 1)


def test_malformed_bytes_raise_wire_format_error():
    payload = video()
    with pytest.raises(WireFormatError):
        decode_video(payload[:-7], NAMES, SIZES, 3862)
    with pytest.raises(WireFormatError):
        parse_record(b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_round_trip_all_three_formats_in_memory_filesystem(compression):
    rng = np.random.default_rng(3)
    root = f"memory://roundtrip-{compression}"
    videos = [(f"v{i:03d}", rng.integers(0, 3862, i % 4).tolist(), rng.standard_normal(1152).astype(np.float32))
              for i in range(20)]
    with TFRecordWriter(f"{root}/video.tfrecord", compression) as writer:
        for video_id, labels, features in videos:
            writer.write(encode_video_example(video_id, labels if labels else None,
                                              {"mean_rgb": features[:1024], "mean_audio": features[1024:]},
                                              id_key="video_id"))
    frames = {"rgb": rng.integers(0, 256, (310, 1024), dtype=np.uint8),
              "audio": rng.integers(0, 256, (310, 128), dtype=np.uint8)}
    segments = {"segment_start_times": [300, 5], "segment_labels": [7, 7], "segment_scores": [1.0, 0.0]}
    with TFRecordWriter(f"{root}/frame.tfrecord", compression) as writer:
        writer.write(encode_frame_example("f1", [7, 2], frames))
        writer.write(encode_frame_example("s1", [7], frames, segments=segments))
    paths = expand_pattern(f"{root}/*.tfrecord")
    frame_path, video_path = paths
    payloads = [p for _, p in read_records(video_path)]
    for payload, (video_id, labels, features) in zip(payloads, videos, strict=True):
        decoded_id, decoded_labels, decoded = decode_video(payload, NAMES, SIZES, 3862)
        assert (decoded_id, decoded_labels.tolist()) == (video_id, labels)
        assert np.array_equal(bits(decoded), bits(features))
    (_, plain), (_, rated) = read_records(frame_path)
    for payload in (plain, rated):
        _, _, decoded, num_frames = decode_frame(payload, FRAME_NAMES, FRAME_SIZES, 3862)
        assert num_frames == 300 and np.array_equal(decoded, np.concatenate([frames["rgb"], frames["audio"]], 1)[:300])
    context = parse_record(rated)["context"]
    assert {key: context[key].tolist() for key in segments} == segments
    assert "segment_start_times" not in parse_record(plain)["context"]


# ---------------------------------------------------------------------------------------------- real YT8M shards


def read_all(pattern: str) -> list[bytes]:
    return [payload for path in expand_pattern(pattern) for _, payload in read_records(path)]


def test_real_2018_validate_shards(realdata_dir):
    expected = manifest_totals("yt8m_2018_video_validate/validate")
    payloads = read_all(str(realdata_dir / "yt8m_2018_video_validate/validate*.tfrecord"))
    ids, labels, features = as_lists(decode_video_batch(payloads, NAMES, SIZES, 3862))
    flat = [label for video_labels in labels for label in video_labels]
    assert len(ids) == expected["records"] and len(set(ids)) == len(ids)
    assert len(flat) == expected["labels_total"] and round(len(flat) / len(ids), 2) == 3.01
    assert (min(flat), max(flat)) == (expected["label_min"], expected["label_max"])
    assert features.shape == (len(ids), 1152) and -1.993 < features.min() and features.max() < 2.009
    assert ids[0] == expected["first_id"] and labels[0] == expected["first_labels"]
    for row in range(0, len(payloads), 97):  # the batch path against the record-by-record parser
        parsed = parse_record(payloads[row])["features"]
        assert parsed["id"] == [ids[row].encode()] and parsed["labels"].tolist() == labels[row]
        assert np.array_equal(bits(features[row]), bits(np.concatenate([parsed["mean_rgb"], parsed["mean_audio"]])))


def test_real_2017_validate_and_test_shards(realdata_dir):
    expected = manifest_totals("yt8m_2017_video/validatea")
    validate = read_all(str(realdata_dir / "yt8m_2017_video/validatea*.tfrecord"))
    ids, labels, _ = as_lists(decode_video_batch(validate, NAMES, SIZES, 4716))
    assert len(ids) == expected["records"] and all(len(video_id) == 11 for video_id in ids)
    assert sum(map(len, labels)) == expected["labels_total"]
    assert max(map(max, filter(None, labels))) == expected["label_max"]
    with pytest.raises(RecordError, match="labels"):
        decode_video_batch(validate, NAMES, SIZES, 3862)
    expected = manifest_totals("yt8m_2017_video/testa")
    test = read_all(str(realdata_dir / "yt8m_2017_video/testa*.tfrecord"))
    ids, labels, _ = as_lists(decode_video_batch(test, NAMES, SIZES, 4716))
    assert len(ids) == expected["records"] and labels == [[]] * len(ids) and ids[0] == expected["first_id"]
    assert sorted(parse_record(test[0])["features"]) == ["mean_audio", "mean_rgb", "video_id"]


def test_real_frame_level_video_matches_pickle(realdata_dir):
    with open(realdata_dir / "yt8m_2018_frame_pkl/paddlevideo_example.pkl", "rb") as fh:
        original = pickle.load(fh, encoding="bytes")
    (_, payload), = read_records(str(realdata_dir / "yt8m_2018_frame_tfrecord/SjJ3_derived_from_paddlevideo_example.tfrecord"))
    video_id, labels, frames, num_frames = decode_frame(payload, FRAME_NAMES, FRAME_SIZES, 3862)
    assert (video_id, labels.tolist(), num_frames) == ("SjJ3", [11], 170) == (
        "SjJ3", original[b"label"], int(original[b"nframes"]))
    assert np.array_equal(frames, np.concatenate([original[b"feature"], original[b"audio"]], axis=1))
    encoded = encode_frame_example("SjJ3", [11], {"rgb": original[b"feature"], "audio": original[b"audio"]})
    assert map_layout(encoded) == map_layout(payload)


# ---------------------------------------------------------------------------------------------- bad values


@pytest.mark.parametrize("value, shown", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_non_finite_features_are_an_error_naming_feature_and_index(value, shown):
    audio = np.ones(128, np.float32)
    audio[[40, 90]] = value
    payload = video({"mean_rgb": np.zeros(1024, np.float32), "mean_audio": audio})
    pattern = rf"feature 'mean_audio': expected finite values, found {shown} at index 40"
    with pytest.raises(RecordError, match=pattern) as caught:
        decode_video(payload, NAMES, SIZES, 3862)
    assert caught.value.field == "mean_audio"
    with pytest.raises(RecordError, match=pattern) as caught:
        decode_video_batch([video(), video(), payload, video()], NAMES, SIZES, 3862)
    assert caught.value.batch_index == 2


def nested_groups(depth: int) -> bytes:
    """`depth` groups (field 7) inside one another: an unknown field that protobuf skips, put before an Example."""
    return encode_varint(7 << 3 | 3) * depth + encode_varint(7 << 3 | 4) * depth


def test_nested_groups_are_skipped_to_protobufs_limit_and_an_error_beyond_it():
    payload = video()
    for depth in (1, 100):
        video_id, _, _ = decode_video(nested_groups(depth) + payload, NAMES, SIZES, 3862)
        assert video_id == "abcd"
    for depth in (101, 100_000):  # 100,000: a RecursionError before, in the recursive scanner
        with pytest.raises(WireFormatError, match=r"groups nested more than 100 deep at byte 101"):
            decode_video(nested_groups(depth) + payload, NAMES, SIZES, 3862)
        with pytest.raises(WireFormatError, match="nested more than 100 deep") as caught:
            decode_video_batch([payload, nested_groups(depth) + payload], NAMES, SIZES, 3862)
        assert caught.value.batch_index == 1
    with pytest.raises(WireFormatError, match="group 7 is not closed"):
        decode_video(encode_varint(7 << 3 | 3) * 3 + encode_varint(7 << 3 | 4) * 2 + payload, NAMES, SIZES, 3862)
    with pytest.raises(WireFormatError, match="unexpected end of group 8"):
        decode_video(encode_varint(7 << 3 | 3) + encode_varint(8 << 3 | 4) + payload, NAMES, SIZES, 3862)


@pytest.mark.parametrize("label, num_classes, hint", [(4501, 3862, True), (3862, 3862, True), (4716, 3862, False),
                                                      (200, 100, False), (4716, 4716, False)])
def test_a_2017_label_read_with_2018_classes_says_the_fix(label, num_classes, hint):
    with pytest.raises(RecordError, match=f"found {label}") as caught:
        decode_video(video(labels=(1, label)), NAMES, SIZES, num_classes)
    assert str(caught.value).endswith("; 2017 data has 4,716 classes (--num_classes 4716)") == hint


def test_real_2017_shard_with_default_classes_says_the_fix(realdata_dir):
    from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset, make_loader
    path = realdata_dir / "yt8m_2017_video" / "validatea0.tfrecord"
    with pytest.raises(RecordError, match=r"found 4\d{3}; 2017 data has 4,716 classes \(--num_classes 4716\)$"):
        list(make_loader(YT8MDataset(str(path), FeatureSpec(NAMES, SIZES, False), batch_size=1024), 0))


def test_batch_decoding_can_leave_bad_records_out():
    """on_error gets each bad record; the good ones move up into the first rows, their labels with them."""
    def features(value: float) -> dict:
        return {"mean_rgb": np.full(1024, value, np.float32), "mean_audio": np.full(128, value, np.float32)}
    nan = features(0.0)
    nan["mean_rgb"][3] = np.nan
    payloads = [encode_video_example("a", [1, 2], features(1.0)), encode_video_example("b", [3], nan),
                encode_video_example("c", [], features(3.0)), encode_video_example("d", [9999], features(4.0)),
                encode_video_example("e", [5, 5], features(5.0))]
    errors = []
    out = np.full((5, 1152), -7.0, np.float32)
    batch = decode_video_batch(payloads, NAMES, SIZES, 3862, out=out, on_error=errors.append)
    assert [(err.batch_index, err.field) for err in errors] == [(1, "mean_rgb"), (3, "labels")]
    assert batch.video_ids == ["a", "c", "e"] and batch.labels.lists() == [[1, 2], [], [5, 5]]
    assert batch.features.shape == (3, 1152) and np.shares_memory(batch.features, out)
    assert batch.features[:, 0].tolist() == [1.0, 3.0, 5.0] and (batch.features == batch.features[:, :1]).all()


def test_record_id_key_tells_2017_from_2018_records():
    from yt8m.data.format.decode import record_id_key
    assert record_id_key(video(), sequence=False) == "id"
    assert record_id_key(video(id_key="video_id"), sequence=False) == "video_id"
    frames = {"rgb": np.zeros((2, 4), np.uint8)}
    assert record_id_key(encode_frame_example("x", [1], frames, id_key="video_id"), sequence=True) == "video_id"
    assert record_id_key(b"\x0a\xff", sequence=False) is None


def test_inspect_of_deeply_nested_groups_is_a_one_line_error_naming_file_and_offset(tmp_path):
    import subprocess
    import sys
    path = tmp_path / "nested.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        writer.write(video())
        writer.write(nested_groups(5000) + video())
    offset = 16 + len(video())
    for command in (["inspect", str(path)], ["bench", "read", str(path)]):
        result = subprocess.run([sys.executable, "-m", "yt8m", *command], capture_output=True, text=True)
        errors = [line for line in result.stderr.splitlines() if " INFO " not in line]
        assert result.returncode == 1 and len(errors) == 1, result.stderr
        assert errors[0].startswith(f"yt8m {command[0]}: error: {path}: record at byte offset {offset}: groups nested "
                                    "more than 100 deep")

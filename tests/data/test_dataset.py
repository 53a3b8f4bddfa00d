"""Tests of YT8MDataset: batches against the fixture sidecars, rank x worker splits, shuffling, cache, errors."""

from __future__ import annotations

import logging
import re
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import as_float32, load_sidecar
from yt8m.config import config_from_dict
from yt8m.data.format.decode import RecordError
from yt8m.data.format.encode import encode_frame_example, encode_video_example
from yt8m.data.format.tfrecord import CorruptRecordError, TFRecordWriter
from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset, make_loader
from yt8m.data.reading.read_plan import ReadOptions, reader_shares

VIDEO_SPEC = FeatureSpec(["mean_rgb", "mean_audio"], [1024, 128], frame_features=False)
FRAME_SPEC = FeatureSpec(["rgb", "audio"], [1024, 128], frame_features=True)
SMALL_SPEC = FeatureSpec(["mean_rgb", "mean_audio"], [4, 2], frame_features=False, num_classes=10)


def read_all(dataset, num_workers: int = 0) -> list[dict]:
    return list(make_loader(dataset, num_workers))


def ids_of(batches: list[dict]) -> list[str]:
    return [video_id for batch in batches for video_id in batch.video_ids]


def multi_hot(labels: list[int], num_classes: int) -> np.ndarray:
    row = np.zeros(num_classes, np.float32)
    row[labels] = 1.0
    return row


def sidecar_records(paths: list[Path]) -> list[dict]:
    return [record for path in paths for record in load_sidecar(path)["records"]]


def write_small_shards(folder: Path, shard_sizes: list[int], prefix: str = "part") -> list[str]:
    """Shards of tiny video-level records whose features encode the record's global index."""
    folder.mkdir(parents=True, exist_ok=True)
    ids, index = [], 0
    for shard, size in enumerate(shard_sizes):
        with TFRecordWriter(str(folder / f"{prefix}-{shard:03d}.tfrecord")) as writer:
            for _ in range(size):
                ids.append(f"v{index:04d}")
                features = {"mean_rgb": np.full(4, index, np.float32), "mean_audio": np.arange(2, dtype=np.float32)}
                writer.write(encode_video_example(ids[-1], [index % 10], features))
                index += 1
    return ids


def test_feature_spec_from_flag_values():
    spec = config_from_dict(FeatureSpec, {"feature_names": "rgb, audio", "feature_sizes": "1024,128",
                                          "frame_features": True, "max_frames": 120, "num_classes": 4716})
    assert spec == FeatureSpec(["rgb", "audio"], [1024, 128], True, 120, 4716)
    assert spec.feature_size == 1152
    with pytest.raises(ValueError, match="feature_sizes"):
        config_from_dict(FeatureSpec, {"feature_names": "rgb,audio", "feature_sizes": "1024"})
    with pytest.raises(ValueError, match="feature_sizes"):
        FeatureSpec(["rgb", "audio"], [1024]).checked()


def test_video_batches_match_sidecars(fixtures_dir):
    paths = sorted((fixtures_dir / "video").glob("train*.tfrecord"))
    batches = read_all(YT8MDataset(str(fixtures_dir / "video" / "train*.tfrecord"), VIDEO_SPEC, batch_size=64))
    records = sidecar_records(paths)
    assert [len(b.video_ids) for b in batches[:-1]] == [64] * (len(batches) - 1)
    assert ids_of(batches) == [r["id"] for r in records]
    features = torch.cat([b.features for b in batches]).numpy()
    labels = torch.cat([b.labels for b in batches]).numpy()
    assert features.dtype == np.float32 and labels.dtype == bool
    assert features.shape == (len(records), 1152) and labels.shape == (len(records), 3862)
    expected = np.stack([as_float32(r["mean_rgb"] + r["mean_audio"]) for r in records])
    np.testing.assert_array_equal(features.view(np.uint32), expected.view(np.uint32))
    np.testing.assert_array_equal(labels, np.stack([multi_hot(r["labels"], 3862) for r in records]))
    assert all(b.num_frames is None for b in batches)


def test_gzip_shards_read_like_plain_ones(fixtures_dir):
    path = fixtures_dir / "video_gzip" / "train00.tfrecord.gz"
    batches = read_all(YT8MDataset(str(path), VIDEO_SPEC, batch_size=1000))
    records = load_sidecar(path)["records"]
    assert ids_of(batches) == [r["id"] for r in records]
    expected = np.stack([as_float32(r["mean_rgb"] + r["mean_audio"]) for r in records])
    np.testing.assert_array_equal(batches[0].features.numpy().view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("max_frames", [300, 40])
def test_frame_batches_are_padded_truncated_uint8_as_stored(fixtures_dir, max_frames):
    paths = sorted((fixtures_dir / "frame").glob("train*.tfrecord"))
    spec = FeatureSpec(["rgb", "audio"], [1024, 128], frame_features=True, max_frames=max_frames)
    batches = read_all(YT8MDataset(str(fixtures_dir / "frame" / "train*.tfrecord"), spec, batch_size=3))
    records = iter(sidecar_records(paths))
    for batch in batches:
        num_frames = batch.num_frames
        assert num_frames.dtype == torch.int64 and batch.features.dtype == torch.uint8
        assert batch.features.shape == (len(batch.video_ids), int(num_frames.max()), 1152)
        for row, video_id in enumerate(batch.video_ids):
            record = next(records)
            kept = min(record["num_frames"], max_frames)
            assert video_id == record["id"] and int(num_frames[row]) == kept
            frames = np.concatenate([record["rgb"], record["audio"]], axis=1)[:kept]
            np.testing.assert_array_equal(batch.features[row, :kept].numpy(), np.asarray(frames, np.uint8))
            assert not batch.features[row, kept:].any()
            np.testing.assert_array_equal(batch.labels[row].numpy(), multi_hot(record["labels"], 3862))
    assert next(records, None) is None


@pytest.mark.parametrize("files,readers", [(7, 4), (3, 4), (2, 5), (1, 3), (4, 4)])
def test_reader_shares_partition_every_record(files, readers):
    paths = [f"f{i}" for i in range(files)]
    owners: dict = {}
    for reader in range(readers):
        for path, stride, phase, _ in reader_shares(paths, reader, readers):
            for record in range(phase, 60, stride):
                owners.setdefault((path, record), []).append(reader)
    assert sorted(owners) == [(path, record) for path in paths for record in range(60)]
    assert all(len(found) == 1 for found in owners.values())


@pytest.mark.parametrize("shard_sizes", [[13, 7, 11, 9, 5], [23, 18]], ids=["shards>=readers", "shards<readers"])
@pytest.mark.parametrize("cache_in_memory", [False, True], ids=["stream", "cache"])
def test_ranks_times_workers_read_every_record_exactly_once(tmp_path, shard_sizes, cache_in_memory):
    ids = write_small_shards(tmp_path, shard_sizes)
    seen = []
    for rank in range(2):
        options = ReadOptions(shuffle=True, seed=1, rank=rank, world_size=2, cache_in_memory=cache_in_memory)
        dataset = YT8MDataset(str(tmp_path / "*.tfrecord"), SMALL_SPEC, 4, options)
        seen += ids_of(read_all(dataset, num_workers=2))
    assert sorted(seen) == ids


def test_cache_filled_inside_plain_dataloader_workers_is_complete(tmp_path):
    ids = write_small_shards(tmp_path, [9, 8, 7])
    dataset = YT8MDataset(str(tmp_path / "*.tfrecord"), SMALL_SPEC, 4, ReadOptions(cache_in_memory=True))
    batches = list(DataLoader(dataset, batch_size=None, num_workers=2))
    assert sorted(ids_of(batches)) == ids
    assert all(b.labels.shape == (len(b.video_ids), 10) for b in batches)


def test_shuffle_is_seeded_and_changes_with_epoch_and_seed(tmp_path):
    ids = write_small_shards(tmp_path, [40, 40, 40])

    def order(seed: int, epoch: int, num_workers: int = 0) -> list[str]:
        dataset = YT8MDataset(str(tmp_path / "*.tfrecord"), SMALL_SPEC, 16,
                              ReadOptions(shuffle=True, seed=seed, shuffle_buffer=32))
        dataset.set_epoch(epoch)
        return ids_of(read_all(dataset, num_workers))

    first = order(seed=5, epoch=0)
    assert sorted(first) == ids and first != ids
    assert order(seed=5, epoch=0) == first
    assert order(seed=5, epoch=1) != first
    assert order(seed=6, epoch=0) != first
    in_workers = order(seed=5, epoch=0, num_workers=2)
    assert sorted(in_workers) == ids and order(seed=5, epoch=0, num_workers=2) == in_workers
    assert order(seed=5, epoch=1, num_workers=2) != in_workers


def test_evaluation_order_is_fixed_with_workers(tmp_path):
    ids = write_small_shards(tmp_path, [10, 10, 10, 10])
    dataset = YT8MDataset(str(tmp_path / "*.tfrecord"), SMALL_SPEC, batch_size=4)
    assert ids_of(read_all(dataset)) == ids
    with_workers = ids_of(read_all(dataset, num_workers=2))
    assert sorted(with_workers) == ids and with_workers == ids_of(read_all(dataset, num_workers=2))


@pytest.mark.parametrize("cache_in_memory", [False, True])
def test_drop_remainder_yields_only_full_batches(tmp_path, cache_in_memory):
    write_small_shards(tmp_path, [10, 9])
    pattern = str(tmp_path / "*.tfrecord")
    kept = read_all(YT8MDataset(pattern, SMALL_SPEC, 4, ReadOptions(cache_in_memory=cache_in_memory)))
    dropped = read_all(YT8MDataset(pattern, SMALL_SPEC, 4,
                                   ReadOptions(drop_remainder=True, cache_in_memory=cache_in_memory)))
    assert [len(b.video_ids) for b in kept] == [4, 4, 4, 4, 3]
    assert [len(b.video_ids) for b in dropped] == [4, 4, 4, 4]


def test_cache_serves_the_same_batches_as_streaming(fixtures_dir):
    pattern = str(fixtures_dir / "video" / "train*.tfrecord")
    streamed = read_all(YT8MDataset(pattern, VIDEO_SPEC, batch_size=50))
    cached_dataset = YT8MDataset(pattern, VIDEO_SPEC, 50, ReadOptions(cache_in_memory=True))
    cached = read_all(cached_dataset)
    assert len(cached) == len(streamed)
    for mine, theirs in zip(cached, streamed):
        assert mine.video_ids == theirs.video_ids
        assert torch.equal(mine.features, theirs.features) and torch.equal(mine.labels, theirs.labels)
    shuffled = read_all(YT8MDataset(pattern, VIDEO_SPEC, 50, ReadOptions(shuffle=True, cache_in_memory=True)))
    assert sorted(ids_of(shuffled)) == sorted(ids_of(streamed)) and ids_of(shuffled) != ids_of(streamed)


def test_memory_filesystem_round_trip():
    folder = f"memory://yt8m-{uuid.uuid4().hex}"
    features = {"mean_rgb": np.array([0.5, -1.0, 2.0, 0.0], np.float32), "mean_audio": np.ones(2, np.float32)}
    with TFRecordWriter(f"{folder}/a.tfrecord") as writer:
        writer.write(encode_video_example("abcd", [3, 9], features))
        writer.write(encode_video_example("efgh", None, features))
    (batch,) = read_all(YT8MDataset(f"{folder}/*.tfrecord", SMALL_SPEC, batch_size=8))
    assert batch.video_ids == ["abcd", "efgh"]
    np.testing.assert_array_equal(batch.features[1].numpy(), [0.5, -1.0, 2.0, 0.0, 1.0, 1.0])
    np.testing.assert_array_equal(batch.labels.numpy(), [multi_hot([3, 9], 10), multi_hot([], 10)])


@pytest.mark.parametrize("shard_before", [0, 3])
def test_decode_errors_name_file_record_and_field(tmp_path, shard_before):
    """Also when the batch began in another shard (decoded piece by piece, one per file)."""
    if shard_before:
        write_small_shards(tmp_path, [shard_before])
    path = tmp_path / "part-999.tfrecord"
    good = {"mean_rgb": np.zeros(4, np.float32), "mean_audio": np.zeros(2, np.float32)}
    with TFRecordWriter(str(path)) as writer:
        writer.write(encode_video_example("good", [1], good))
        writer.write(encode_video_example("bad", [1], {**good, "mean_audio": np.zeros(3, np.float32)}))
    second_record_offset = 16 + len(encode_video_example("good", [1], good))
    with pytest.raises(RecordError) as caught:
        read_all(YT8MDataset(str(tmp_path / "*.tfrecord"), SMALL_SPEC, batch_size=8))
    assert f"{path}: record at byte offset {second_record_offset}:" in str(caught.value)
    assert "mean_audio" in str(caught.value)


@pytest.mark.parametrize("batch_size", [1, 5, 7, 64])
def test_in_order_batches_are_whole_across_files_and_reader_buffers(tmp_path, batch_size):
    """Records of 300 KB (a 1 MB reader buffer holds three) in shards of 10, 3 and 8: every batch is full but
    the last, in file order, each record intact."""
    folder = tmp_path / "big"
    folder.mkdir()
    spec = FeatureSpec(["mean_rgb", "mean_audio"], [75_000, 2], frame_features=False, num_classes=10)
    index = 0
    for shard, size in enumerate([10, 3, 8]):
        with TFRecordWriter(str(folder / f"part-{shard}.tfrecord")) as writer:
            for _ in range(size):
                features = {"mean_rgb": np.full(75_000, index, np.float32), "mean_audio": np.ones(2, np.float32)}
                writer.write(encode_video_example(f"v{index:02d}", [index % 10], features))
                index += 1
    batches = read_all(YT8MDataset(str(folder / "*.tfrecord"), spec, batch_size=batch_size))
    sizes = [len(batch.video_ids) for batch in batches]
    assert sizes == [batch_size] * (21 // batch_size) + ([21 % batch_size] if 21 % batch_size else [])
    assert ids_of(batches) == [f"v{i:02d}" for i in range(21)]
    features = torch.cat([batch.features for batch in batches])
    assert torch.equal(features[:, :75_000], torch.arange(21, dtype=torch.float32)[:, None].expand(21, 75_000))
    labels = torch.cat([batch.labels for batch in batches])
    assert labels.nonzero()[:, 1].tolist() == [i % 10 for i in range(21)]


def test_label_out_of_range_is_an_error(tmp_path):
    path = tmp_path / "labels.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        writer.write(encode_video_example("high", [10], {"mean_rgb": np.zeros(4), "mean_audio": np.zeros(2)}))
    with pytest.raises(RecordError, match="labels"):
        read_all(YT8MDataset(str(path), SMALL_SPEC, batch_size=8))


def test_corrupt_shard_fails_or_is_skipped_with_a_warning(fixtures_dir, caplog):
    path = fixtures_dir / "corrupt" / "video_bad_data_crc.tfrecord"
    bad_index = load_sidecar(path)["corruption"]["bad_record_index"]
    with pytest.raises(CorruptRecordError, match="bad_data_crc"):
        read_all(YT8MDataset(str(path), VIDEO_SPEC, batch_size=8))
    dataset = YT8MDataset(str(path), VIDEO_SPEC, 8, ReadOptions(skip_corrupt=True))
    with caplog.at_level(logging.WARNING):
        batches = read_all(dataset)
    assert len(ids_of(batches)) == bad_index
    assert dataset.skipped_files == 1 and dataset.skipped_records == 0
    assert any("video_bad_data_crc" in message for message in caplog.messages)


def test_invalid_arguments_are_rejected(fixtures_dir):
    pattern = str(fixtures_dir / "video" / "train00.tfrecord")
    with pytest.raises(ValueError, match="rank"):
        YT8MDataset(pattern, VIDEO_SPEC, 8, ReadOptions(rank=2, world_size=2))
    segments = FeatureSpec(["rgb", "audio"], [1024, 128], frame_features=True, segment_labels=True)
    with pytest.raises(ValueError, match="rated segments are streamed"):
        YT8MDataset(pattern, segments, 8, ReadOptions(cache_in_memory=True))
    with pytest.raises(ValueError, match="no files match"):
        YT8MDataset(str(fixtures_dir / "nothing*.tfrecord"), VIDEO_SPEC, batch_size=8)



def test_check_first_record_decodes_the_first_files_first_record_and_counts_nothing(tmp_path):
    """Whatever this rank would read (here rank 1 of 2 reads part-001 only), and leaving the dataset's counts alone."""
    write_small_shards(tmp_path, [3, 4])
    pattern = str(tmp_path / "*.tfrecord")
    dataset = YT8MDataset(pattern, SMALL_SPEC, 8, ReadOptions(shuffle=True, rank=1, world_size=2, record_bytes=True))
    dataset.check_first_record()
    assert not dataset.read_stats
    assert ids_of(read_all(dataset)) and dataset.read_stats.record_bytes > 0
    wrong = FeatureSpec(["mean_rgb", "mean_audio"], [4, 3], frame_features=False, num_classes=10)
    first_file = re.escape(str(tmp_path / "part-000.tfrecord"))
    with pytest.raises(RecordError, match=f"^{first_file}: record at byte offset 0: feature 'mean_audio'"):
        YT8MDataset(pattern, wrong, 8, ReadOptions(rank=1, world_size=2)).check_first_record()

# ---------------------------------------------------------------------------------------------- bad records


def small_features(index: int) -> dict:
    return {"mean_rgb": np.full(4, index, np.float32), "mean_audio": np.arange(2, dtype=np.float32)}


def bad_video_records() -> list[tuple[str, bytes]]:
    """(field the error names, payload) of each kind of record that fails to decode under SMALL_SPEC."""
    nan = small_features(0)
    nan["mean_rgb"][2] = np.nan
    good = encode_video_example("bad", [1], small_features(0))
    return [("mean_rgb", encode_video_example("bad", [1], nan)),
            ("mean_audio", encode_video_example("bad", [1], {**small_features(0), "mean_audio": np.zeros(3)})),
            ("mean_audio", encode_video_example("bad", [1], {"mean_rgb": np.zeros(4)})),
            ("labels", encode_video_example("bad", [10], small_features(0))),
            ("", good[:-3])]  # bad wire data: the record ends inside its last field


def write_shards_with_bad_records(folder: Path) -> tuple[list[str], list[tuple[str, int, str]]]:
    """Three shards of good records with the bad ones spread among them, the last shard cut inside a record.
    Returns the good ids and (path, offset, field) of each bad record."""
    folder.mkdir(parents=True, exist_ok=True)
    bad = iter(bad_video_records())
    ids, bad_at, index = [], [], 0
    for shard, size in enumerate([9, 8, 7]):
        path = folder / f"part-{shard}.tfrecord"
        offset = 0
        with TFRecordWriter(str(path)) as writer:
            for position in range(size):
                if position % 3 == 1 and (bad_record := next(bad, None)) is not None:
                    name, payload = bad_record
                    bad_at.append((str(path), offset, name))
                else:
                    ids.append(f"v{index:03d}")
                    payload = encode_video_example(ids[-1], [index % 10], small_features(index))
                    index += 1
                writer.write(payload)
                offset += 16 + len(payload)
    path.write_bytes(path.read_bytes()[:-5])  # the last record of the last shard is cut: the file is skipped
    return ids[:-1], bad_at


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_corrupt_skips_bad_records_and_counts_them(tmp_path, caplog, shuffle, num_workers):
    ids, bad_at = write_shards_with_bad_records(tmp_path)
    assert len(bad_at) == 5
    dataset = YT8MDataset(str(tmp_path / "*.tfrecord"), SMALL_SPEC, 4, ReadOptions(shuffle=shuffle, skip_corrupt=True))
    with caplog.at_level(logging.WARNING):
        batches = read_all(dataset, num_workers)
    read = ids_of(batches)
    assert (sorted(read) if shuffle or num_workers else read) == ids
    short = [len(batch.video_ids) for batch in batches if len(batch.video_ids) < 4]
    assert len(short) <= max(num_workers, 1), "only each reader's last batch is short"
    for batch in batches:  # each video's features and label still belong to it
        indexes = [int(video_id[1:]) for video_id in batch.video_ids]
        assert batch.features[:, 0].tolist() == indexes
        assert batch.labels.nonzero()[:, 1].tolist() == [index % 10 for index in indexes]
    assert (dataset.skipped_files, dataset.skipped_records) == (1, 5)
    assert dataset.read_stats.id_key_files.keys() == {"id"}
    if num_workers == 0:  # a worker's warnings go to its own stderr
        for path, offset, field in bad_at:
            assert any(f"{path}: record at byte offset {offset}: " in message and field in message
                       and message.endswith("; skipping this record") for message in caplog.messages)


def test_without_skip_corrupt_the_first_bad_record_is_an_error(tmp_path):
    _, bad_at = write_shards_with_bad_records(tmp_path)
    path, offset, field = bad_at[0]
    with pytest.raises(RecordError, match=f"{re.escape(path)}: record at byte offset {offset}: feature '{field}'"):
        read_all(YT8MDataset(str(tmp_path / "*.tfrecord"), SMALL_SPEC, batch_size=4))


def test_skipped_counts_reach_the_cache_and_add_up_over_epochs(tmp_path):
    ids, _ = write_shards_with_bad_records(tmp_path)
    for num_workers in (0, 2):
        dataset = YT8MDataset(str(tmp_path / "*.tfrecord"), SMALL_SPEC, 4,
                              ReadOptions(skip_corrupt=True, cache_in_memory=True))
        for _ in range(2):
            assert sorted(ids_of(read_all(dataset, num_workers))) == ids
        assert (dataset.skipped_files, dataset.skipped_records) == (1, 5)
    streamed = YT8MDataset(str(tmp_path / "*.tfrecord"), SMALL_SPEC, 4, ReadOptions(skip_corrupt=True))
    loader = make_loader(streamed, 2)
    for _ in range(2):
        assert sorted(ids_of(list(loader))) == ids
    assert (loader.read_stats.skipped_files, loader.read_stats.skipped_records) == (2, 10)


def frame_record(video_id: str, num_frames: int, labels=(1,), rgb_size: int = 4) -> bytes:
    frames = {"rgb": np.full((num_frames, rgb_size), 3, np.uint8), "audio": np.full((num_frames, 2), 5, np.uint8)}
    return encode_frame_example(video_id, list(labels), frames)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_frame_level_skip_corrupt_skips_bad_videos_and_keeps_batches_full(tmp_path, num_workers):
    spec = FeatureSpec(["rgb", "audio"], [4, 2], frame_features=True, num_classes=10)
    path = tmp_path / "frames.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        for index in range(12):
            if index == 2:
                writer.write(frame_record("bad2", 3, rgb_size=5))
            elif index == 7:
                writer.write(frame_record("bad7", 3, labels=(11,)))
            else:
                writer.write(frame_record(f"f{index:02d}", index % 4))
    dataset = YT8MDataset(str(path), spec, 3, ReadOptions(skip_corrupt=True))
    batches = read_all(dataset, num_workers)
    assert sorted(ids_of(batches)) == [f"f{index:02d}" for index in range(12) if index not in (2, 7)]
    if num_workers == 0:  # (two workers share the file: each has its own last batch)
        assert [len(batch.video_ids) for batch in batches] == [3, 3, 3, 1]
    assert (dataset.skipped_files, dataset.skipped_records) == (0, 2)
    with pytest.raises(RecordError, match=r"frames.tfrecord: record at byte offset \d+: feature list 'rgb', frame 0"):
        read_all(YT8MDataset(str(path), spec, batch_size=3), num_workers)


def test_a_batch_of_only_0_frame_videos_has_one_zero_frame(tmp_path):
    spec = FeatureSpec(["rgb", "audio"], [4, 2], frame_features=True, num_classes=10)
    path = tmp_path / "empty_videos.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        for index, num_frames in enumerate([0, 0, 0, 2]):
            writer.write(frame_record(f"e{index}", num_frames))
    first, second = read_all(YT8MDataset(str(path), spec, batch_size=3))
    assert first.features.shape == (3, 1, 6) and not first.features.any()
    assert first.num_frames.tolist() == [0, 0, 0]
    assert second.features.shape == (1, 2, 6) and second.num_frames.tolist() == [2]


@pytest.mark.parametrize("make_bad, error_type", [
    (lambda path: path.write_bytes(b"not a TFRecord file"), CorruptRecordError),
    (lambda path: _write_one(path, {"mean_rgb": np.zeros(4), "mean_audio": np.zeros(3)}), RecordError),
    (lambda path: _write_one(path, {"mean_rgb": np.full(4, np.inf), "mean_audio": np.zeros(2)}), RecordError),
], ids=["unframed", "wrong-size", "infinite"])
def test_a_data_error_in_a_worker_is_raised_as_it_is_in_process(tmp_path, make_bad, error_type):
    """Same type, same one-line message: not torch's re-creation with the worker's traceback in it."""
    write_small_shards(tmp_path, [5, 6])
    make_bad(tmp_path / "part-zz.tfrecord")
    errors = []
    for num_workers in (0, 1, 2):
        with pytest.raises(error_type) as caught:
            read_all(YT8MDataset(str(tmp_path / "*.tfrecord"), SMALL_SPEC, batch_size=4), num_workers)
        errors.append(caught.value)
    assert [type(error) for error in errors] == [error_type] * 3
    assert len({str(error) for error in errors}) == 1 and "\n" not in str(errors[0])
    assert str(errors[0]).startswith(str(tmp_path / "part-zz.tfrecord"))


def _write_one(path: Path, features: dict) -> None:
    with TFRecordWriter(str(path)) as writer:
        writer.write(encode_video_example("bad", [1], features))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shards_mixing_2017_and_2018_ids_get_one_warning_naming_both(tmp_path, caplog, num_workers):
    spec = SMALL_SPEC
    for name, id_key in (("a-2018.tfrecord", "id"), ("b-2017.tfrecord", "video_id"), ("c-2018.tfrecord", "id")):
        with TFRecordWriter(str(tmp_path / name)) as writer:
            for index in range(3):
                writer.write(encode_video_example(f"{name}{index}", [1], small_features(index), id_key=id_key))
    with caplog.at_level(logging.WARNING):
        dataset = YT8MDataset(str(tmp_path / "*.tfrecord"), spec, batch_size=2)
        read_all(dataset, num_workers)
        read_all(dataset, num_workers)
    warnings = [message for message in caplog.messages if "mix" in message]
    assert len(warnings) == 1
    assert "'id'" in warnings[0] and "'video_id'" in warnings[0] and str(tmp_path / "b-2017.tfrecord") in warnings[0]
    assert str(tmp_path / "a-2018.tfrecord") in warnings[0] or str(tmp_path / "c-2018.tfrecord") in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        read_all(YT8MDataset(str(tmp_path / "[ac]-2018.tfrecord"), spec, batch_size=2), num_workers)
    assert not caplog.messages

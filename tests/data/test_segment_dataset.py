"""Segment mode of YT8MDataset: each rated 2019 segment is an example (frames, labels rated present, label weights
rated either way), read from the TensorFlow-written fixtures as their sidecars list them; and the reading errors
through the CLI, naming file and record."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import load_sidecar
from yt8m.data.format.decode import SegmentRatings
from yt8m.data.format.encode import encode_frame_example
from yt8m.data.format.tfrecord import TFRecordWriter
from yt8m.data.reading.batch_build import DecodedSegment, finish_batch, segment_batch, segment_examples
from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset, make_loader
from yt8m.data.reading.read_plan import ReadOptions

SEGMENT_SPEC = FeatureSpec(["rgb", "audio"], [1024, 128], frame_features=True, segment_labels=True)


def expected_segments(paths: list[Path]) -> dict[str, dict]:
    """Segment id -> what the sidecars say its example holds: one per distinct rated start, in file order."""
    expected = {}
    for path in paths:
        for record in load_sidecar(path)["records"]:
            frames = np.concatenate([np.asarray(record["rgb"]).reshape(-1, 1024),
                                     np.asarray(record["audio"]).reshape(-1, 128)], axis=1)
            ratings = zip(record["segment_start_times"], record["segment_labels"], record["segment_scores"])
            for start, label, score in ratings:
                segment = expected.setdefault(f"{record['id']}:{start}", {
                    "present": set(), "rated": set(), "frames": np.asarray(frames[start:start + 5], np.uint8)})
                segment["rated"].add(label)
                if score == 1:
                    segment["present"].add(label)
    return expected


def read_segments(dataset: YT8MDataset, num_workers: int = 0) -> dict[str, dict]:
    found = {}
    for batch in make_loader(dataset, num_workers):
        assert batch.features.shape[1:] == (5, 1152) and batch.features.dtype == torch.uint8
        assert batch.num_frames.tolist() == [5] * len(batch.video_ids)
        assert batch.labels.dtype == batch.label_weights.dtype == torch.bool
        for row, segment_id in enumerate(batch.video_ids):
            assert segment_id not in found
            found[segment_id] = {"present": set(np.flatnonzero(batch.labels[row].numpy()).tolist()),
                                 "rated": set(np.flatnonzero(batch.label_weights[row].numpy()).tolist()),
                                 "frames": batch.features[row].numpy()}
    return found


@pytest.mark.parametrize("shuffle,num_workers", [(False, 0), (True, 2)])
def test_each_rated_segment_of_the_fixtures_is_one_example(fixtures_dir, shuffle, num_workers):
    paths = sorted((fixtures_dir / "segment").glob("validate*.tfrecord"))
    dataset = YT8MDataset(str(fixtures_dir / "segment" / "validate*.tfrecord"), SEGMENT_SPEC, 4,
                          ReadOptions(shuffle=shuffle, shuffle_buffer=3))
    found, expected = read_segments(dataset, num_workers), expected_segments(paths)
    assert sorted(found) == sorted(expected)
    # wG1j: segments past frame 300 (max_frames does not cut them) and the pair (320, 1962) rated twice alike;
    # eGkT: two classes rated at start 40; ZIpS has no ratings and gives no example.
    assert {"wG1j:320", "wG1j:355", "eGkT:40", "YmLL:0"} <= set(found)
    assert not any(segment_id.startswith("ZIpS:") for segment_id in found)
    assert found["eGkT:40"]["rated"] == {407, 3861} and found["eGkT:40"]["present"] == {407}
    assert found["wG1j:320"]["rated"] == {1962} and found["wG1j:320"]["present"] == set()
    for segment_id, segment in expected.items():
        assert found[segment_id]["present"] == segment["present"], segment_id
        assert found[segment_id]["rated"] == segment["rated"], segment_id
        np.testing.assert_array_equal(found[segment_id]["frames"], segment["frames"])


def test_the_segments_of_every_rank_together_are_every_segment_once(fixtures_dir):
    pattern = str(fixtures_dir / "segment" / "validate*.tfrecord")
    shares = [list(read_segments(YT8MDataset(pattern, SEGMENT_SPEC, 2, ReadOptions(rank=rank, world_size=2))))
              for rank in range(2)]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == sorted(read_segments(YT8MDataset(pattern, SEGMENT_SPEC, 2)))


def test_segment_size_sets_the_frames_of_an_example(fixtures_dir):
    spec = FeatureSpec(["rgb", "audio"], [1024, 128], frame_features=True, segment_labels=True, segment_size=3)
    batch = next(iter(YT8MDataset(str(fixtures_dir / "segment" / "validate00.tfrecord"), spec, 16)))
    assert batch.features.shape == (len(batch.video_ids), 3, 1152)
    assert batch.num_frames.tolist() == [3] * len(batch.video_ids)


def test_segment_mode_needs_frame_features():
    with pytest.raises(ValueError, match="segment_labels reads the segments of frame-level data"):
        YT8MDataset("unused", FeatureSpec(["mean_rgb"], [1024], frame_features=False, segment_labels=True), 16)



def test_a_decoded_segment_is_read_by_name_and_round_trips_through_its_batch():
    frames = np.arange(12 * 6, dtype=np.uint8).reshape(12, 6)
    ratings = SegmentRatings(np.array([5, 0, 5]), np.array([3, 1, 7]), np.array([1, 1, 0], np.float32))
    segments = segment_examples("vid", frames, ratings, segment_size=5, record_bytes=100)
    assert [(segment.segment_id, segment.present, segment.rated, segment.record_bytes) for segment in segments] == [
        ("vid:0", [1], [1], 100), ("vid:5", [3], [3, 7], 0)]  # the record's bytes counted once
    np.testing.assert_array_equal(segments[1].frames, frames[5:10])
    spec = FeatureSpec(["rgb", "audio"], [4, 2], frame_features=True, num_classes=10, segment_labels=True)
    batch = finish_batch(segment_batch(segments, spec), spec.num_classes)
    for row, segment in enumerate(segments):
        found = DecodedSegment(batch.video_ids[row], np.flatnonzero(batch.labels[row].numpy()).tolist(),
                               np.flatnonzero(batch.label_weights[row].numpy()).tolist(), batch.features[row].numpy(),
                               segment.record_bytes)
        assert found._replace(frames=None) == segment._replace(frames=None)
        np.testing.assert_array_equal(found.frames, segment.frames)

# --- errors through the CLI ------------------------------------------------------------------------------------


def write_segment_shard(path: Path, videos: list[tuple[int, list[int], list[int]]]) -> list[int]:
    """Videos of (frames, starts, classes), every rating 1, 4+2 features; the records' byte offsets."""
    offsets, offset = [], 0
    with TFRecordWriter(str(path)) as writer:
        for index, (num_frames, starts, classes) in enumerate(videos):
            frames = {"rgb": np.full((num_frames, 4), index, np.uint8), "audio": np.zeros((num_frames, 2), np.uint8)}
            segments = {"segment_start_times": starts, "segment_labels": classes, "segment_scores": [1.0] * len(starts)}
            payload = encode_frame_example(f"v{index}", [1], frames, segments=segments)
            writer.write(payload)
            offsets.append(offset)
            offset += len(payload) + 16
    return offsets


def run_train(pattern: Path, train_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """`yt8m train` on segments in a process of its own (training commands change process-wide settings)."""
    return subprocess.run([sys.executable, "-m", "yt8m", "train", "--train_data_pattern", str(pattern), "--train_dir", str(train_dir), "--frame_features",
            "--segment_labels", "--model", "FrameLevelLogisticModel", "--feature_names", "rgb,audio",
            "--feature_sizes", "4,2", "--num_classes", "10", "--batch_size", "4", "--num_epochs", "1",
            "--num_readers", "0", *extra], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("bad_video,message", [
    ((12, [0, 5, 10], [1, 2, 3]), r"segment 2 \(start 10, class 3\) ends at frame 15, past the video's 12 frames"),
    ((20, [0, 5], [1, 10]), r"segment_labels': expected class ids in \[0, 10\) \(num_classes\), found 10"),
])
def test_a_bad_segment_record_is_an_error_naming_file_and_offset_or_is_skipped(tmp_path, bad_video, message):
    shard = tmp_path / "segments.tfrecord"
    offsets = write_segment_shard(shard, [(20, [0, 5], [1, 2]), bad_video, (10, [5], [4])])
    failed = run_train(shard, tmp_path / "run")
    assert failed.returncode == 1
    error = failed.stderr.strip().splitlines()[-1]
    assert error.startswith(f"yt8m train: error: {shard}: record at byte offset {offsets[1]}: ")
    assert re.search(message, error)

    spec = FeatureSpec(["rgb", "audio"], [4, 2], frame_features=True, num_classes=10, segment_labels=True)
    skipping = YT8MDataset(str(shard), spec, 4, ReadOptions(skip_corrupt=True))
    assert [batch.video_ids for batch in skipping] == [["v0:0", "v0:5", "v2:5"]]
    assert skipping.skipped_records == 1

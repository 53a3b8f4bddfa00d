"""Decoding 2019 segment ratings: the TensorFlow-written segment fixtures as their sidecars list them, and a clear
error for each malformed rating."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import load_sidecar
from yt8m.data.format.decode import RecordError, decode_segment_ratings, decode_segment_video
from yt8m.data.format.encode import encode_frame_example
from yt8m.data.format.tfrecord import read_records

NAMES, SIZES = ["rgb", "audio"], [1024, 128]


@pytest.mark.parametrize("name", ["validate00", "validate01"])
def test_fixture_ratings_and_frames_are_read_as_stored(fixtures_dir, name):
    path = fixtures_dir / "segment" / f"{name}.tfrecord"
    sidecar = load_sidecar(path)
    for (_, payload), record in zip(read_records(str(path)), sidecar["records"], strict=True):
        video_id, ratings = decode_segment_ratings(payload, 3862)
        same_id, frames, same = decode_segment_video(payload, NAMES, SIZES, 3862, 5)
        stored = list(dict.fromkeys(zip(record["segment_start_times"], record["segment_labels"],
                                        record["segment_scores"])))  # a pair rated twice alike counts once
        assert video_id == same_id == record["id"]
        assert list(zip(ratings.start_times.tolist(), ratings.labels.tolist(), ratings.scores.tolist())) == stored
        assert all(np.array_equal(a, b) for a, b in zip(ratings, same))
        # Every frame, also past max_frames (300): wG1j has rated segments starting at 320 and 355.
        assert frames.shape == (record["num_frames"], 1152)
        assert np.array_equal(frames[:, :1024], np.asarray(record["rgb"], np.uint8).reshape(-1, 1024))
        assert np.array_equal(frames[:, 1024:], np.asarray(record["audio"], np.uint8).reshape(-1, 128))


def frame_record(num_frames: int, starts, labels, scores) -> bytes:
    frames = {"rgb": np.zeros((num_frames, 4), np.uint8)}
    segments = {"segment_start_times": starts, "segment_labels": labels, "segment_scores": scores}
    return encode_frame_example("vid1", [1], frames, segments=segments)


@pytest.mark.parametrize("starts, labels, scores, message", [
    ([0, 5], [1, 10], [1.0, 0.0], r"segment_labels.*\[0, 10\).*found 10 \(segment 1, start 5\)"),
    ([0], [-1], [1.0], r"segment_labels.*found -1"),
    ([0, 5], [1, 2], [1.0, 0.5], r"segment_scores.*ratings 0 or 1, found 0.5 \(segment 1, start 5\)"),
    ([0], [1], [float("nan")], r"segment_scores.*found nan"),
    ([-5], [1], [1.0], r"segment_start_times.*>= 0, found -5"),
    ([0, 0], [3, 3], [1.0, 0.0], r"segment 1 \(start 0, class 3\) is rated both 0 and 1"),
])
def test_malformed_ratings_are_errors_naming_the_segment(starts, labels, scores, message):
    with pytest.raises(RecordError, match=message):
        decode_segment_ratings(frame_record(20, starts, labels, scores), 10)


def test_a_segment_past_the_last_frame_is_an_error_naming_it():
    payload = frame_record(12, [0, 5, 10], [1, 2, 3], [1.0, 1.0, 0.0])
    with pytest.raises(RecordError, match=r"segment 2 \(start 10, class 3\) ends at frame 15, past the video's 12 "
                                          r"frames \(--segment_size 5\)"):
        decode_segment_video(payload, ["rgb"], [4], 10, 5)
    assert len(decode_segment_video(payload, ["rgb"], [4], 10, 2)[1]) == 12


def test_lists_of_different_lengths_are_an_error():
    payload = encode_frame_example("v", [], {"rgb": np.zeros((10, 4), np.uint8)})
    assert len(decode_segment_ratings(payload, 10)[1].labels) == 0
    with pytest.raises(ValueError, match="equal lengths"):  # the encoder refuses to write such a record
        frame_record(10, [0, 5], [1], [1.0])

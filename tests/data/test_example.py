"""Tests of the Example / SequenceExample wire encoders and decoders against TensorFlow-written fixtures."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import as_float32, load_sidecar
from yt8m.data.example import encode_frame_example, encode_video_example, iter_fields
from yt8m.data.tfrecord import read_records

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

"""Protobuf wire encoding of YT8M tf.train.Example / SequenceExample records, laid out as TensorFlow writes them
(packed float and int64 lists, one bytes value per frame): for synthetic data, fixtures and tests."""

from __future__ import annotations

import functools
from typing import Mapping, Optional, Sequence

import numpy as np

from yt8m.data.format import wire

SEGMENT_FIELDS = {
    "segment_start_times": wire.KIND_INT64,
    "segment_end_times": wire.KIND_INT64,
    "segment_labels": wire.KIND_INT64,
    "segment_scores": wire.KIND_FLOAT,
}
REQUIRED_SEGMENT_FIELDS = ("segment_start_times", "segment_labels", "segment_scores")


def encode_varint(value: int) -> bytes:
    """Base-128 varint; negative int64 values take ten bytes (two's complement), as protobuf writes them."""
    value &= wire.UINT64_MASK
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | wire.WIRE_LEN) + encode_varint(len(payload)) + payload


def _bytes_feature(values: Sequence[bytes]) -> bytes:
    return _len_field(wire.KIND_BYTES, b"".join(_len_field(wire.LIST_VALUE, v) for v in values))


def _float_feature(values: np.ndarray) -> bytes:
    data = np.ascontiguousarray(values, dtype="<f4").tobytes()
    return _len_field(wire.KIND_FLOAT, _len_field(wire.LIST_VALUE, data) if data else b"")


def _int64_feature(values: Sequence[int]) -> bytes:
    packed = b"".join(encode_varint(int(v)) for v in values)
    return _len_field(wire.KIND_INT64, _len_field(wire.LIST_VALUE, packed) if packed else b"")


def _map_entry(key: str, value: bytes) -> bytes:
    return _len_field(wire.MAP_ENTRY, _len_field(wire.ENTRY_KEY, key.encode()) + _len_field(wire.ENTRY_VALUE, value))


def _as_vector(name: str, values: object, dtype: type) -> np.ndarray:
    array: np.ndarray = np.asarray(values, dtype=dtype)
    if array.ndim != 1:
        raise ValueError(f"feature {name!r} must be one-dimensional, got shape {array.shape}")
    return array


def _context_entries(video_id: str, labels: Optional[Sequence[int]], id_key: str) -> list[bytes]:
    if id_key not in ("id", "video_id"):
        raise ValueError(f"id_key must be 'id' or 'video_id', got {id_key!r}")
    entries = [_map_entry(id_key, _bytes_feature([video_id.encode()]))]
    if labels is not None:
        entries.append(_map_entry("labels", _int64_feature(_as_vector("labels", labels, np.int64).tolist())))
    return entries


def encode_video_example(video_id: str, labels: Optional[Sequence[int]], features: Mapping[str, np.ndarray],
                         id_key: str = "id") -> bytes:
    """A serialized video-level tf.train.Example: id, labels (int64_list) and float_list features.

    `labels=None` writes no labels feature at all, as in YT8M test shards; `[]` writes an empty list.
    """
    entries = _context_entries(video_id, labels, id_key)
    entries += [_map_entry(name, _float_feature(_as_vector(name, values, np.float32)))
                for name, values in features.items()]
    return _len_field(wire.EXAMPLE_FEATURES, b"".join(entries))


def _segment_entries(segments: Mapping[str, Sequence]) -> list[bytes]:
    unknown = sorted(set(segments) - set(SEGMENT_FIELDS))
    missing = [name for name in REQUIRED_SEGMENT_FIELDS if name not in segments]
    if unknown or missing:
        raise ValueError(f"segments: unknown fields {unknown}, missing fields {missing}")
    lengths = {name: len(values) for name, values in segments.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"segment fields must have equal lengths, got {lengths}")
    entries = []
    for name, values in segments.items():
        if SEGMENT_FIELDS[name] == wire.KIND_FLOAT:
            entries.append(_map_entry(name, _float_feature(_as_vector(name, values, np.float32))))
        else:
            entries.append(_map_entry(name, _int64_feature(_as_vector(name, values, np.int64).tolist())))
    return entries


@functools.lru_cache(maxsize=64)
def frame_header(size: int) -> np.ndarray:
    """The bytes before each frame's data in a FeatureList of one-value BytesList Features (uint8 array)."""
    bytes_list = encode_varint(wire.LIST_VALUE << 3 | wire.WIRE_LEN) + encode_varint(size)
    feature = encode_varint(wire.KIND_BYTES << 3 | wire.WIRE_LEN) + encode_varint(len(bytes_list) + size)
    entry = encode_varint(wire.LIST_VALUE << 3 | wire.WIRE_LEN) + encode_varint(len(feature) + len(bytes_list) + size)
    header = np.frombuffer(entry + feature + bytes_list, dtype=np.uint8)
    header.flags.writeable = False
    return header


def _frame_feature_list(name: str, frames: np.ndarray) -> bytes:
    """FeatureList of one bytes Feature per frame, built as one array: every frame has the same header."""
    if frames.ndim != 2 or frames.dtype != np.uint8:
        raise ValueError(f"frames {name!r} must be a uint8 array [frames, size], got {frames.dtype} {frames.shape}")
    num_frames, size = frames.shape
    header = frame_header(size)
    rows = np.empty((num_frames, len(header) + size), dtype=np.uint8)
    rows[:, :len(header)] = header
    rows[:, len(header):] = frames
    return rows.tobytes()


def encode_frame_example(video_id: str, labels: Optional[Sequence[int]], frames: Mapping[str, np.ndarray],
                         segments: Optional[Mapping[str, Sequence]] = None, id_key: str = "id") -> bytes:
    """A serialized frame-level tf.train.SequenceExample.

    Context: id, labels and, for 2019 segment-rated data, segment_start_times / segment_labels /
    segment_scores (and optionally segment_end_times). Feature lists: one bytes Feature per frame.
    """
    counts = {name: len(values) for name, values in frames.items()}
    if len(set(counts.values())) > 1:
        raise ValueError(f"every frame feature needs the same number of frames, got {counts}")
    context = _context_entries(video_id, labels, id_key)
    if segments is not None:
        context += _segment_entries(segments)
    lists = [_map_entry(name, _frame_feature_list(name, np.asarray(values))) for name, values in frames.items()]
    return (_len_field(wire.SEQUENCE_CONTEXT, b"".join(context))
            + _len_field(wire.SEQUENCE_FEATURE_LISTS, b"".join(lists)))

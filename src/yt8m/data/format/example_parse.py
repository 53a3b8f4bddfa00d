"""tf.train.Example / SequenceExample messages parsed without TensorFlow: their features and feature lists (any
valid wire form, TensorFlow's layout first), and `parse_record`, everything a record holds, for inspection."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from yt8m.data.format.layout import uniform_frames, walk_entries
from yt8m.data.format.wire import (
    ENTRY_KEY,
    ENTRY_VALUE,
    EXAMPLE_FEATURES,
    KIND_BYTES,
    KIND_FLOAT,
    KIND_INT64,
    LIST_VALUE,
    MAP_ENTRY,
    SEQUENCE_CONTEXT,
    SEQUENCE_FEATURE_LISTS,
    WIRE_FIXED32,
    WIRE_LEN,
    WIRE_VARINT,
)
from yt8m.data.format.wire_scan import WireFormatError, iter_fields, read_varint

# Why a hand-written scanner and not the `protobuf` package: upb parses a 4.7 kB YT8M Example in about
# 1 us, but getting its 1152 floats out of the repeated-field containers into numpy costs about 9 us
# more per record (measured here), while copying the packed little-endian bytes costs a fraction of a
# microsecond. Video-level batches are decoded by the native decoder (batch_decode.py, _native.c);
# layout.py reads the layout TensorFlow writes one map entry at a time (contexts, single records, and the
# records a batch leaves over); anything else goes through the complete parser (`_parse_features_full`), which
# also produces every error. The layout path pays where the per-record decoder is the whole path (no C decoder): a
# real 2018 video record takes 17 us through it against 32 us through the complete parser alone (300 records of
# validate0000, best of 5), a 300-frame record 44 against 51 us.

KIND_NAMES = {KIND_BYTES: "bytes_list", KIND_FLOAT: "float_list", KIND_INT64: "int64_list"}
_FLOAT32_LE = np.dtype("<f4")

# A Feature's values, which its kind decides: a list of bytes (bytes_list; an empty list where no kind is set), a
# float32 array (float_list), a list of ints (int64_list). Any: no annotation ties them to the kind beside them, and
# the decoders, reading them by that kind, pay no isinstance check or cast() call per feature.
FeatureValues = Any
Features = dict[bytes, tuple[int, FeatureValues]]  # feature name -> (kind, values)


def _to_int64(value: int) -> int:
    return value - (1 << 64) if value >> 63 else value


def _packed_varints(data: bytes, start: int, end: int) -> list[int]:
    values = []
    pos = start
    while pos < end:
        byte = data[pos]
        if byte < 0x80:
            values.append(byte)
            pos += 1
        elif pos + 1 < end and data[pos + 1] < 0x80:  # two bytes: every YT8M label id
            values.append((byte & 0x7F) | (data[pos + 1] << 7))
            pos += 2
        else:
            value, pos = read_varint(data, pos, end)
            values.append(_to_int64(value))
    return values


def _packed_floats(data: bytes, start: int, end: int) -> np.ndarray:
    if (end - start) % 4:
        raise WireFormatError(f"packed float list of {end - start} bytes is not a multiple of 4")
    return np.frombuffer(data, _FLOAT32_LE, (end - start) // 4, start)  # positional: keywords cost 0.3 us


def _parse_list(kind: int, data: bytes, start: int, end: int) -> FeatureValues:
    """Values of a BytesList / FloatList / Int64List, packed or not."""
    if kind == KIND_BYTES:
        return [data[s:e] for s, e in _len_fields(data, start, end, LIST_VALUE)]
    chunks: list = []
    for number, wire, value in iter_fields(data, start, end):
        if number != LIST_VALUE:
            continue
        if kind == KIND_FLOAT and wire in (WIRE_LEN, WIRE_FIXED32):
            chunks.append(_packed_floats(data, *value))
        elif kind == KIND_INT64 and wire == WIRE_LEN:
            chunks.extend(_packed_varints(data, *value))
        elif kind == KIND_INT64 and wire == WIRE_VARINT:
            chunks.append(_to_int64(value))
    if kind == KIND_FLOAT:
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    return chunks


def _len_fields(data: bytes, start: int, end: int, wanted: int) -> list[tuple[int, int]]:
    """Regions of the length-delimited occurrences of field `wanted`; other fields are skipped as unknown."""
    return [value for number, wire, value in iter_fields(data, start, end) if number == wanted and wire == WIRE_LEN]


def _joined(data: bytes, regions: list[tuple[int, int]]) -> tuple[bytes, int, int]:
    """Repeated occurrences of an embedded message merge, which is what parsing their concatenation does."""
    if len(regions) == 1:
        return (data, *regions[0])
    joined = b"".join(data[s:e] for s, e in regions)
    return joined, 0, len(joined)


def _parse_feature(data: bytes, start: int, end: int) -> tuple[int, FeatureValues]:
    """A Feature's oneof: the last kind seen wins; repeats of the same kind merge."""
    kind = 0
    regions: list[tuple[int, int]] = []
    for number, wire, value in iter_fields(data, start, end):
        if wire != WIRE_LEN or number not in (KIND_BYTES, KIND_FLOAT, KIND_INT64):
            continue
        if number != kind:
            kind, regions = number, []  # setting another member of a oneof clears the previous one
        regions.append(value)
    if kind == 0:
        return 0, []
    return kind, _parse_list(kind, *_joined(data, regions))


def _parse_map(data: bytes, start: int, end: int) -> dict[bytes, tuple[bytes, int, int]]:
    """A map<string, message> field's entries: key -> the value message's bytes; the last duplicate key wins."""
    entries = {}
    for entry_start, entry_end in _len_fields(data, start, end, MAP_ENTRY):
        key = b""
        regions = []
        for number, wire, value in iter_fields(data, entry_start, entry_end):
            if wire != WIRE_LEN:
                continue
            if number == ENTRY_KEY:
                key = data[value[0]:value[1]]
            elif number == ENTRY_VALUE:
                regions.append(value)
        entries[key] = _joined(data, regions) if regions else (b"", 0, 0)
    return entries


def _parse_features_full(data: bytes, start: int, end: int) -> Features:
    return {key: _parse_feature(*value) for key, value in _parse_map(data, start, end).items()}


def _region_values(data: bytes, kind: int, start: int, end: int) -> FeatureValues:
    if kind == KIND_FLOAT:
        return _packed_floats(data, start, end)
    if kind == KIND_INT64:
        return _packed_varints(data, start, end)
    return [data[start:end]]


def parse_features(data: bytes, start: int, end: int) -> Features:
    entries = walk_entries(data, start, end)
    if entries is None:
        return _parse_features_full(data, start, end)
    return {key: (kind, _region_values(data, kind, s, e)) for key, (kind, s, e) in entries.items()}


def top_level(data: bytes) -> dict[int, tuple[bytes, int, int]]:
    """The message fields of an Example (1) / SequenceExample (1, 2), each merged over its occurrences."""
    regions: dict[int, list[tuple[int, int]]] = {}
    for number, wire, value in iter_fields(data):
        if wire == WIRE_LEN and number in (SEQUENCE_CONTEXT, SEQUENCE_FEATURE_LISTS):
            regions.setdefault(number, []).append(value)
    return {number: _joined(data, found) for number, found in regions.items()}


def example_features(payload: bytes) -> Features:
    top = top_level(payload)
    return parse_features(*top[EXAMPLE_FEATURES]) if EXAMPLE_FEATURES in top else {}


def describe(kind: int, values: FeatureValues) -> str:
    return f"{KIND_NAMES[kind]} of {len(values)} values" if kind else "a Feature with no kind set"


def sequence_example(payload: bytes) -> tuple[Features, dict[bytes, tuple[bytes, int, int]]]:
    """(context features, feature list name -> FeatureList bytes region)."""
    top = top_level(payload)
    context = parse_features(*top[SEQUENCE_CONTEXT]) if SEQUENCE_CONTEXT in top else {}
    lists = _parse_map(*top[SEQUENCE_FEATURE_LISTS]) if SEQUENCE_FEATURE_LISTS in top else {}
    return context, lists


def feature_list(data: bytes, start: int, end: int) -> list[tuple[int, FeatureValues]]:
    return [_parse_feature(data, s, e) for s, e in _len_fields(data, start, end, LIST_VALUE)]


def _as_stored(kind: int, values: FeatureValues) -> FeatureValues:
    return np.array(values, dtype=np.int64) if kind == KIND_INT64 else values


def _stored_frames(data: bytes, start: int, end: int) -> list:
    """Each frame's values; YT8M's one bytes value per frame is sliced from one array at once."""
    first = next(iter_fields(data, start, end), None)
    if first is not None and first[0] == LIST_VALUE and first[1] == WIRE_LEN:
        kind, values = _parse_feature(data, *first[2])
        if kind == KIND_BYTES and len(values) == 1:
            uniform = uniform_frames(data, start, end, len(values[0]))
            if uniform is not None:
                return [[row.tobytes()] for row in uniform]
    return [_as_stored(*frame) for frame in feature_list(data, start, end)]


def parse_record(payload: bytes, sequence: Optional[bool] = None) -> dict:
    """Everything a record holds, as stored: for inspection and tests, not for the training hot path.

    Example: {"message": "Example", "features": {name: values}}; SequenceExample: {"message":
    "SequenceExample", "context": {name: values}, "feature_lists": {name: [values of each frame]}}.
    Values: float32 array (float_list), int64 array (int64_list), list of bytes (bytes_list, and an
    empty list for a Feature with no kind set). With `sequence=None` a record is a SequenceExample
    when it holds at least one feature list: an Example and a SequenceExample without feature lists
    are the same bytes (real 2018 video-level shards even carry an empty feature_lists field).
    """
    context, lists = sequence_example(payload)
    features = {key.decode(errors="backslashreplace"): _as_stored(*value) for key, value in context.items()}
    if sequence is False or (sequence is None and not lists):
        return {"message": "Example", "features": features}
    feature_lists = {key.decode(errors="backslashreplace"): _stored_frames(*region) for key, region in lists.items()}
    return {"message": "SequenceExample", "context": features, "feature_lists": feature_lists}

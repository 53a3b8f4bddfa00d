"""The reference Python decoder of tf.train.Example / SequenceExample records, YT8M style, without TensorFlow:
any valid wire form, every error of a record (file, offset, field); batches of video records go through C first."""

from __future__ import annotations

import itertools
from typing import Callable, Iterator, NamedTuple, Optional, Sequence

import numpy as np

from yt8m.data.batch_decode import FastDecoded, PackedRecords, decode_packed, decode_packed_frames
from yt8m.data.encode import frame_header
from yt8m.data.wire import (UINT64_MASK, ENTRY_KEY, ENTRY_VALUE, EXAMPLE_FEATURES, ID_KEYS, KIND_BYTES, KIND_FLOAT, KIND_INT64,
                            LABELS_KEY, LIST_VALUE, MAP_ENTRY, SEGMENT_LABELS_KEY, SEGMENT_SCORES_KEY,
                            SEGMENT_START_TIMES_KEY, SEQUENCE_CONTEXT, SEQUENCE_FEATURE_LISTS, WIRE_FIXED32,
                            WIRE_FIXED64, WIRE_GROUP_END, WIRE_GROUP_START, WIRE_LEN, WIRE_VARINT)

CLASSES_2018, CLASSES_2017 = 3862, 4716  # the vocabularies of the 2018 (and 2019) and the 2017 releases
MAX_GROUP_DEPTH = 100  # protobuf's default recursion limit


# ---------------------------------------------------------------------------------------------- errors


class RecordError(ValueError):
    """A record that does not hold what the reader expects; the message names the field.

    Readers call `error.at(path, offset)` for the same error naming the file and the record's offset.
    """

    def __init__(self, message: str, field: Optional[str] = None):
        super().__init__(message)
        self.detail = message
        self.field = field
        self.path: Optional[str] = None
        self.offset: Optional[int] = None
        self.batch_index: Optional[int] = None

    def at(self, path: str, offset: int) -> "RecordError":
        located = type(self)(f"{path}: record at byte offset {offset}: {self.detail}", self.field)
        located.detail, located.path, located.offset = self.detail, path, offset
        return located


class WireFormatError(RecordError):
    """Bytes that are not a valid protobuf message."""


# ---------------------------------------------------------------------------------------------- wire scanning


def read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it); raises WireFormatError past `end` or beyond ten bytes."""
    result = 0
    shift = 0
    while pos < end and shift < 70:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & UINT64_MASK, pos
        shift += 7
    raise WireFormatError(f"malformed varint ending at byte {pos}")


def _field_value(data: bytes, pos: int, end: int, wire: int) -> tuple[object, int]:
    """(value, position after it) of a field that is not a group, whose key ends at `pos` (as in iter_fields)."""
    if wire == WIRE_VARINT:
        return read_varint(data, pos, end)
    if wire == WIRE_LEN:
        size, pos = read_varint(data, pos, end)
        return (pos, pos + size), pos + size
    if wire == WIRE_FIXED32:
        return (pos, pos + 4), pos + 4
    if wire == WIRE_FIXED64:
        return (pos, pos + 8), pos + 8
    raise WireFormatError(f"invalid wire type {wire} at byte {pos}")


def _skip_group(data: bytes, pos: int, end: int, number: int) -> int:
    """The position after the end of group `number`, whose start key ends at `pos`. Iterative, not recursive:
    nested groups are counted, and more than MAX_GROUP_DEPTH of them is an error, as in protobuf."""
    open_groups = [number]
    while pos < end:
        key, pos = read_varint(data, pos, end)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise WireFormatError(f"field number 0 at byte {pos}")
        if wire == WIRE_GROUP_START:
            if len(open_groups) == MAX_GROUP_DEPTH:
                raise WireFormatError(f"groups nested more than {MAX_GROUP_DEPTH} deep at byte {pos}")
            open_groups.append(field)
        elif wire == WIRE_GROUP_END:
            if field != open_groups.pop():
                raise WireFormatError(f"unexpected end of group {field} at byte {pos}")
            if not open_groups:
                return pos
        else:
            pos = _field_value(data, pos, end, wire)[1]
            if pos > end:
                raise WireFormatError(f"field {field} runs past the end of its message ({pos} > {end})")
    raise WireFormatError(f"group {number} is not closed")


def iter_fields(data: bytes, start: int = 0, end: Optional[int] = None) -> Iterator[tuple[int, int, object]]:
    """Every field of the message in data[start:end] as (number, wire type, value), in wire order.

    Value: an int for varints, (start, end) offsets into `data` for length-delimited, fixed32 and
    fixed64 fields, and the start offset for a (skipped) group.
    """
    pos, end = start, len(data) if end is None else end
    while pos < end:
        key, pos = read_varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireFormatError(f"field number 0 at byte {pos}")
        if wire == WIRE_GROUP_START:
            value, pos = pos, _skip_group(data, pos, end, number)
        elif wire == WIRE_GROUP_END:
            raise WireFormatError(f"unexpected end of group {number} at byte {pos}")
        else:
            value, pos = _field_value(data, pos, end, wire)
        if pos > end:
            raise WireFormatError(f"field {number} runs past the end of its message ({pos} > {end})")
        yield number, wire, value


# ---------------------------------------------------------------------------------------------- decoding
#
# Why a hand-written scanner and not the `protobuf` package: upb parses a 4.7 kB YT8M Example in about
# 1 us, but getting its 1152 floats out of the repeated-field containers into numpy costs about 9 us
# more per record (measured here), while copying the packed little-endian bytes costs a fraction of a
# microsecond. Video-level batches are decoded by the native decoder (batch_decode.py, _native.c);
# `_entry_header` reads the layout TensorFlow writes one map entry at a time (contexts, single records, and the
# records a batch leaves over); anything else goes through the complete parser (`_parse_features_full`), which
# also produces every error. The layout path pays where the per-record decoder is the whole path (no C decoder): a
# real 2018 video record takes 17 us through it against 32 us through the complete parser alone (300 records of
# validate0000, best of 5), a 300-frame record 44 against 51 us.

_KIND_NAMES = {KIND_BYTES: "bytes_list", KIND_FLOAT: "float_list", KIND_INT64: "int64_list"}
_FLOAT32_LE = np.dtype("<f4")

Features = dict  # feature name (bytes) -> (kind, values): list[bytes] | float32 array | list[int]
Region = tuple  # (kind, start, end): a list's packed values (or its one bytes value) in the record


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


def _parse_list(kind: int, data: bytes, start: int, end: int) -> object:
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


def _parse_feature(data: bytes, start: int, end: int) -> tuple[int, object]:
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


def _short_varint(data: bytes, pos: int) -> Optional[tuple[int, int]]:
    """(value, position after) of a one- or two-byte varint at `pos`; None for a longer one."""
    value = data[pos]
    if value < 0x80:
        return value, pos + 1
    if data[pos + 1] < 0x80:
        return (value & 0x7F) | (data[pos + 1] << 7), pos + 2
    return None


def _entry_header(data: bytes, pos: int) -> Optional[tuple[int, bytes, int, int]]:
    """(header size, key, kind, content size) of the Features map entry at `pos`, if TensorFlow's layout.

    That layout: key field then value field; the Feature one kind field holding one packed list (or
    exactly one bytes value); every size a one- or two-byte varint ending where its message ends. The
    content (packed values, or the bytes value) follows the header. None for anything else: the full
    parser reads it. Tags are literals (0x0A/0x12/0x1A: fields 1/2/3, length-delimited).
    """
    try:
        entry = _short_varint(data, pos + 1)
        if entry is None:
            return None
        entry_end = sum(entry)
        at = entry[1]
        key_end = at + 2 + data[at + 1]
        if data[pos] != 0x0A or data[at] != 0x0A or data[at + 1] >= 0x80 or data[key_end] != 0x12:
            return None
        key = data[at + 2:key_end]
        value = _short_varint(data, key_end + 1)
        if value is None or sum(value) != entry_end:
            return None
        kind_tag = data[value[1]]
        if kind_tag not in (0x0A, 0x12, 0x1A):
            return None
        listed = _short_varint(data, value[1] + 1)
        if listed is None or sum(listed) != entry_end:
            return None
        size, at = listed
        if size == 0:
            # An empty list; an empty BytesList has no value to point at, so the full parser takes it.
            return None if kind_tag == 0x0A else (at - pos, key, kind_tag >> 3, 0)
        content = _short_varint(data, at + 1)
        if data[at] != 0x0A or content is None or sum(content) != entry_end:
            return None
        size, at = content
        return at - pos, key, kind_tag >> 3, size
    except IndexError:
        return None


def _walk_entries(data: bytes, start: int, end: int) -> Optional[dict[bytes, Region]]:
    """A Features map in TensorFlow's layout as key -> (kind, content start, content end); else None."""
    entries = {}
    pos = start
    while pos < end:
        header = _entry_header(data, pos)
        if header is None:
            return None
        size, key, kind, length = header
        entries[key] = (kind, pos + size, pos + size + length)
        pos += size + length
    return entries if pos == end else None


def _region_values(data: bytes, kind: int, start: int, end: int) -> object:
    if kind == KIND_FLOAT:
        return _packed_floats(data, start, end)
    if kind == KIND_INT64:
        return _packed_varints(data, start, end)
    return [data[start:end]]


def _parse_features(data: bytes, start: int, end: int) -> Features:
    entries = _walk_entries(data, start, end)
    if entries is None:
        return _parse_features_full(data, start, end)
    return {key: (kind, _region_values(data, kind, s, e)) for key, (kind, s, e) in entries.items()}


def _top_level(data: bytes) -> dict[int, tuple[bytes, int, int]]:
    """The message fields of an Example (1) / SequenceExample (1, 2), each merged over its occurrences."""
    regions: dict[int, list[tuple[int, int]]] = {}
    for number, wire, value in iter_fields(data):
        if wire == WIRE_LEN and number in (SEQUENCE_CONTEXT, SEQUENCE_FEATURE_LISTS):
            regions.setdefault(number, []).append(value)
    return {number: _joined(data, found) for number, found in regions.items()}


def _example_features(payload: bytes) -> Features:
    top = _top_level(payload)
    return _parse_features(*top[EXAMPLE_FEATURES]) if EXAMPLE_FEATURES in top else {}


def _describe(kind: int, values: object) -> str:
    return f"{_KIND_NAMES[kind]} of {len(values)} values" if kind else "a Feature with no kind set"


def _video_id(features: Features) -> str:
    found = features.get(ID_KEYS[0]) or features.get(ID_KEYS[1])
    if found is None:
        raise RecordError("no 'id' or 'video_id' feature", "id")
    kind, values = found
    if kind != KIND_BYTES or len(values) != 1:
        raise RecordError(f"feature 'id': expected bytes_list of 1 value, found {_describe(kind, values)}", "id")
    try:
        return values[0].decode()
    except UnicodeDecodeError as err:
        raise RecordError(f"feature 'id': expected UTF-8 text, found {values[0][:40]!r}", "id") from err


def _labels(features: Features, num_classes: int) -> list[int]:
    """Labels as stored (order and repeats kept); an absent `labels` feature means none."""
    found = features.get(LABELS_KEY)
    if found is None:
        return []
    kind, values = found
    if kind not in (KIND_INT64, 0):
        raise RecordError(f"feature 'labels': expected int64_list, found {_describe(kind, values)}", "labels")
    if values and (min(values) < 0 or max(values) >= num_classes):
        bad = next(v for v in values if not 0 <= v < num_classes)
        hint = ""
        if num_classes == CLASSES_2018 and bad < CLASSES_2017:
            hint = f"; 2017 data has 4,716 classes (--num_classes {CLASSES_2017})"
        raise RecordError(f"feature 'labels': expected label ids in [0, {num_classes}) (num_classes), "
                          f"found {bad}{hint}", "labels")
    return values


def _float_values(features: Features, name: str, size: int) -> np.ndarray:
    """The values of a feature the record holds, checked: a float_list of `size` finite values."""
    kind, values = features[name.encode()]
    if kind != KIND_FLOAT or len(values) != size:
        raise RecordError(f"feature {name!r}: expected float_list of {size} values, found {_describe(kind, values)}",
                          name)
    finite = np.isfinite(values)
    if not finite.all():
        index = int(np.argmin(finite))
        raise RecordError(f"feature {name!r}: expected finite values, found {values[index]} at index {index}", name)
    return values


def _decode_video_full(payload: bytes, feature_names: Sequence[str], feature_sizes: Sequence[int],
                       num_classes: int, out: np.ndarray) -> tuple[str, list[int]]:
    """Any valid encoding; every RecordError of video-level decoding comes from here."""
    features = _example_features(payload)
    column = 0
    for name, size in zip(feature_names, feature_sizes):
        if name.encode() not in features:
            raise _missing_feature(payload, f"feature {name!r}: expected float_list of {size} values", name, False)
        out[column:column + size] = _float_values(features, name, size)
        column += size
    return _video_id(features), _labels(features, num_classes)


class LabelIds(NamedTuple):
    """The label ids of a batch of videos as stored (order and repeats kept): video i's are
    values[offsets[i]:offsets[i + 1]]. A few kilobytes where a multi-hot batch takes megabytes."""

    values: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_lists(cls, labels_list: Sequence[Sequence[int]]) -> "LabelIds":
        counts = [len(labels) for labels in labels_list]
        values = np.fromiter(itertools.chain.from_iterable(labels_list), dtype=np.int64, count=sum(counts))
        return cls(values, np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64))

    @classmethod
    def concat(cls, pieces: Sequence["LabelIds"]) -> "LabelIds":
        """The videos of `pieces`, one after another."""
        if not pieces:
            return cls(np.zeros(0, np.int64), np.zeros(1, np.int64))
        shifts = np.cumsum([0] + [len(piece.values) for piece in pieces[:-1]])
        offsets = [pieces[0].offsets[:1]] + [piece.offsets[1:] + shift for piece, shift in zip(pieces, shifts)]
        return cls(np.concatenate([piece.values for piece in pieces]), np.concatenate(offsets).astype(np.int64))

    def lists(self) -> list[list[int]]:
        bounds = self.offsets.tolist()
        return [self.values[start:end].tolist() for start, end in zip(bounds, bounds[1:])]

    def multi_hot(self, num_classes: int, out: Optional[np.ndarray] = None) -> np.ndarray:
        """bool [videos, num_classes], True at each label id (repeats count once); `out`, if given, must be
        that array zero-filled, and is filled and returned."""
        if self.values.size and (self.values.min() < 0 or self.values.max() >= num_classes):
            raise ValueError(f"label ids must lie in [0, {num_classes}), found {self.values.min()}..{self.values.max()}")
        counts = np.diff(self.offsets)
        if out is None:
            out = np.zeros((len(counts), num_classes), dtype=bool)
        out[np.repeat(np.arange(len(counts)), counts), self.values] = True
        return out


class VideoBatch(NamedTuple):
    """Decoded video-level records: ids, label ids as stored, float32 features [N, sum of feature sizes]."""

    video_ids: list[str]
    labels: LabelIds
    features: np.ndarray


def decode_video_batch(payloads: Sequence[bytes] | PackedRecords, feature_names: Sequence[str],
                       feature_sizes: Sequence[int], num_classes: int, out: Optional[np.ndarray] = None,
                       on_error: Optional[Callable[[RecordError], None]] = None) -> VideoBatch:
    """decode_video over many records (payloads, or PackedRecords as a reader fills them), the features written
    into `out` when given (a C-contiguous float32 array of shape [N, sum of sizes]).

    The hot path of video-level reading: the native decoder takes every well-formed record (batch_decode.py),
    the rest are decoded (or their errors raised) record by record. A RecordError raised here has
    `batch_index` set to the position of the bad payload, so the caller can name its file and offset
    with `error.at(...)`. With `on_error`, a bad record is passed to it (`batch_index` set) and left out
    instead: the batch then holds fewer videos, its features the first rows of `out`.
    """
    shape = (len(payloads), sum(feature_sizes))
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {shape}")
    packed = payloads if isinstance(payloads, PackedRecords) else PackedRecords.join(payloads)
    fast = decode_packed(packed, _wanted(feature_names, feature_sizes), num_classes, out)

    def decode_row(row: int, payload: bytes) -> tuple[str, list[int]]:
        return _decode_video_full(payload, feature_names, feature_sizes, num_classes, out[row])

    video_ids, labels, kept = _with_leftovers(packed, fast, decode_row, on_error)
    return VideoBatch(video_ids, labels, out if kept is None else _kept_rows(out, kept))


class FrameBatch(NamedTuple):
    """Decoded frame-level records: ids, label ids as stored, uint8 frames [N, frames, sum of sizes] zero-padded
    after each video's `num_frames` (int64 [N])."""

    video_ids: list[str]
    labels: LabelIds
    frames: np.ndarray
    num_frames: np.ndarray


def decode_frame_batch(payloads: PackedRecords, feature_names: Sequence[str], feature_sizes: Sequence[int],
                       num_classes: int, max_frames: int, out: np.ndarray, num_frames: np.ndarray,
                       on_error: Optional[Callable[[RecordError], None]] = None) -> FrameBatch:
    """decode_frame over many records into `out` (C-contiguous uint8 [N, F, sum of sizes], F >= max_frames): each
    video's first max_frames frames, zeros after them, with its frame count in `num_frames` (int64 [N]).

    The native decoder takes every well-formed record (no Python work per frame); the rest go through decode_frame,
    which gives the same bytes or raises the error. Errors and `on_error` as in decode_video_batch.
    """
    if out.dtype != np.uint8 or out.ndim != 3 or len(out) != len(payloads) or out.shape[1] < max_frames or \
            out.shape[2] != sum(feature_sizes) or not out.flags.c_contiguous or num_frames.shape != (len(out),):
        raise ValueError(f"out must be a C-contiguous uint8 array [{len(payloads)}, >= {max_frames}, "
                         f"{sum(feature_sizes)}] and num_frames int64 [{len(payloads)}]")
    fast = decode_packed_frames(payloads, _wanted(feature_names, feature_sizes), num_classes, max_frames, out,
                                num_frames)

    def decode_row(row: int, payload: bytes) -> tuple[str, list[int]]:
        video_id, labels, frames, count = decode_frame(payload, feature_names, feature_sizes, num_classes, max_frames)
        out[row, :count] = frames
        out[row, count:] = 0
        num_frames[row] = count
        return video_id, labels.tolist()

    video_ids, labels, kept = _with_leftovers(payloads, fast, decode_row, on_error)
    if kept is None:
        return FrameBatch(video_ids, labels, out, num_frames)
    return FrameBatch(video_ids, labels, _kept_rows(out, kept), _kept_rows(num_frames, kept))


def _wanted(feature_names: Sequence[str], feature_sizes: Sequence[int]) -> list[tuple[bytes, int, int]]:
    """(key, size, first column) per feature, for the native decoder."""
    if len(set(feature_names)) != len(feature_names):
        raise ValueError(f"feature names repeat: {list(feature_names)}")
    columns = np.cumsum([0, *feature_sizes[:-1]]).tolist()
    return [(name.encode(), size, column) for name, size, column in zip(feature_names, feature_sizes, columns)]


def _with_leftovers(packed: PackedRecords, fast: FastDecoded, decode_row: Callable[[int, bytes], tuple[str, list[int]]],
                    on_error: Optional[Callable[[RecordError], None]]
                    ) -> tuple[list[str], LabelIds, Optional[np.ndarray]]:
    """The batch's ids and labels: the native decoder's, and those of `decode_row(row, payload)` for each record it
    left (which writes the row's features). Returns the rows kept (bool) where on_error took some, else None."""
    video_ids, rows, values = fast.video_ids, fast.label_rows, fast.label_values
    leftover = np.flatnonzero(~fast.done).tolist()
    bad_rows: list[int] = []
    if leftover:
        more_rows: list[int] = []
        more_values: list[int] = []
        for row in leftover:
            try:
                video_ids[row], labels = decode_row(row, packed.payload(row))
            except RecordError as err:
                err.batch_index = row
                if on_error is None:
                    raise
                on_error(err)
                bad_rows.append(row)
                continue
            more_rows.extend([row] * len(labels))
            more_values.extend(labels)
        rows = np.concatenate([rows, np.array(more_rows, np.int64)])
        values = np.concatenate([values, np.array(more_values, np.int64)])
        order = np.argsort(rows, kind="stable")  # stable: each video's labels stay in stored order
        rows, values = rows[order], values[order]
    if not bad_rows:
        offsets = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=len(packed)))]).astype(np.int64)
        return video_ids, LabelIds(values, offsets), None
    keep = np.ones(len(packed), bool)
    keep[bad_rows] = False
    new_rows = (np.cumsum(keep) - 1)[rows]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(new_rows, minlength=int(keep.sum())))]).astype(np.int64)
    kept_ids = [video_id for video_id, kept in zip(video_ids, keep.tolist()) if kept]
    return kept_ids, LabelIds(values, offsets), keep


def _kept_rows(array: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The rows of `array` where `keep`, moved up in place: the first rows of the same memory."""
    kept = int(keep.sum())
    array[:kept] = array[keep]
    return array[:kept]


def record_id_key(payload: bytes, sequence: bool) -> Optional[str]:
    """The id key a record uses: "id" (2018 and later) or "video_id" (2017), as the decoders look them up; None
    where it has neither or does not parse (its decoding says why)."""
    try:
        features = _sequence_example(payload)[0] if sequence else _example_features(payload)
    except RecordError:
        return None
    return next((key.decode() for key in ID_KEYS if key in features), None)


def decode_id_and_labels(payload: bytes, num_classes: int) -> tuple[str, list[int]]:
    """A record's video id and labels as stored, without its features: an Example's features and a SequenceExample's
    context are the same field, so either kind of record reads alike. Raises RecordError naming the field."""
    features = _sequence_example(payload)[0]
    return _video_id(features), _labels(features, num_classes)


def decode_video(payload: bytes, feature_names: Sequence[str], feature_sizes: Sequence[int],
                 num_classes: int) -> tuple[str, np.ndarray, np.ndarray]:
    """(video id, int64 labels as stored, float32 features concatenated in `feature_names` order).

    The id comes from `id` (2018+) or `video_id` (2017); absent labels mean none. Raises RecordError
    naming the field for a missing feature, a wrong size or type, or a label id outside [0, num_classes).
    One record is parsed on its own, in Python: decode_video_batch's call into C pays off over many.
    """
    features = np.empty(sum(feature_sizes), dtype=np.float32)
    video_id, labels = _decode_video_full(payload, feature_names, feature_sizes, num_classes, features)
    return video_id, np.array(labels, dtype=np.int64), features


def _sequence_example(payload: bytes) -> tuple[Features, dict[bytes, tuple[bytes, int, int]]]:
    """(context features, feature list name -> FeatureList bytes region)."""
    top = _top_level(payload)
    context = _parse_features(*top[SEQUENCE_CONTEXT]) if SEQUENCE_CONTEXT in top else {}
    lists = _parse_map(*top[SEQUENCE_FEATURE_LISTS]) if SEQUENCE_FEATURE_LISTS in top else {}
    return context, lists


def _feature_list(data: bytes, start: int, end: int) -> list[tuple[int, object]]:
    return [_parse_feature(data, s, e) for s, e in _len_fields(data, start, end, LIST_VALUE)]


def _uniform_frames(data: bytes, start: int, end: int, size: int) -> Optional[np.ndarray]:
    """uint8 [frames, size] view when every frame of the FeatureList is TensorFlow's one-value layout.

    Then every frame is the same header plus its bytes, so the list is one [frames, header + size]
    array whose header columns are checked at once. None otherwise.
    """
    header = frame_header(size)
    stride = len(header) + size
    if (end - start) % stride:
        return None
    rows = np.frombuffer(data, np.uint8, end - start, start).reshape(-1, stride)
    return rows[:, len(header):] if (rows[:, :len(header)] == header).all() else None


def _frame_bytes(name: str, data: bytes, start: int, end: int, size: int) -> np.ndarray:
    """uint8 [frames, size] of a FeatureList that must hold one `size`-byte value per frame."""
    uniform = _uniform_frames(data, start, end, size)
    if uniform is not None:
        return uniform
    frames = _feature_list(data, start, end)
    out = np.empty((len(frames), size), dtype=np.uint8)
    for index, (kind, values) in enumerate(frames):
        if kind != KIND_BYTES or len(values) != 1 or len(values[0]) != size:
            found = f"{len(values[0])} bytes" if kind == KIND_BYTES and len(values) == 1 else _describe(kind, values)
            raise RecordError(f"feature list {name!r}, frame {index}: expected {size} bytes, found {found}", name)
        out[index] = np.frombuffer(values[0], np.uint8)
    return out


def decode_frame(payload: bytes, feature_names: Sequence[str], feature_sizes: Sequence[int], num_classes: int,
                 max_frames: int = 300) -> tuple[str, np.ndarray, np.ndarray, int]:
    """(video id, int64 labels, uint8 [T, sum of sizes], T) with T = min(frames in the video, max_frames).

    Each named feature list is read as one bytes value per frame; the lists are concatenated in order
    along the feature axis. Raises RecordError for a missing list, a frame of the wrong size, lists
    of different lengths, or a label id outside [0, num_classes).
    """
    context, lists = _sequence_example(payload)
    video_id = _video_id(context)
    labels = _labels(context, num_classes)
    frames = _frame_matrix(payload, lists, feature_names, feature_sizes, max_frames)
    return video_id, np.array(labels, dtype=np.int64), frames, len(frames)


def _frame_matrix(payload: bytes, lists: dict[bytes, tuple[bytes, int, int]], feature_names: Sequence[str],
                  feature_sizes: Sequence[int], max_frames: Optional[int]) -> np.ndarray:
    """uint8 [T, sum of sizes]: the named feature lists of the record `payload` side by side, T = min(frames,
    max_frames)."""
    per_feature = []
    for name, size in zip(feature_names, feature_sizes):
        region = lists.get(name.encode())
        if region is None:
            raise _missing_feature(payload, f"feature list {name!r}: expected {size} bytes per frame", name, True)
        per_feature.append(_frame_bytes(name, *region, size))
    counts = {name: len(frames) for name, frames in zip(feature_names, per_feature)}
    if len(set(counts.values())) > 1:
        raise RecordError(f"feature lists: expected the same number of frames in each, found {counts}",
                          ",".join(feature_names))
    num_frames = next(iter(counts.values()), 0)
    num_frames = num_frames if max_frames is None else min(num_frames, max_frames)
    out = np.empty((num_frames, sum(feature_sizes)), dtype=np.uint8)
    column = 0
    for frames, size in zip(per_feature, feature_sizes):
        out[:, column:column + size] = frames[:num_frames]
        column += size
    return out


def _missing_feature(payload: bytes, expected: str, name: str, frame_level: bool) -> RecordError:
    """A wanted feature the record lacks: what the record holds, and the flags that read it."""
    context, lists = _sequence_example(payload)
    floats = {key.decode(errors="backslashreplace"): len(values) for key, (kind, values) in context.items()
              if kind == KIND_FLOAT}
    frames = {key.decode(errors="backslashreplace"): _first_frame_size(*region) for key, region in lists.items()}
    if frames:
        holds = "the record is frame-level, its feature lists " + ", ".join(
            f"{key} ({size} bytes a frame)" for key, size in frames.items())
        flags = ("with " if frame_level else "with --frame_features ") + _feature_flags(frames)
    elif floats:
        holds = "the record is video-level, its features " + ", ".join(
            f"{key} ({size} floats)" for key, size in floats.items())
        flags = ("without --frame_features, with " if frame_level else "with ") + _feature_flags(floats)
    else:
        return RecordError(f"{expected}, found none (missing); the record holds no float features and no feature "
                           "lists", name)
    return RecordError(f"{expected}, found none (missing): {holds}; read it {flags}", name)


def _first_frame_size(data: bytes, start: int, end: int) -> int:
    frames = _feature_list(data, start, end)
    kind, values = frames[0] if frames else (0, [])
    return len(values[0]) if kind == KIND_BYTES and len(values) == 1 else 0


def _feature_flags(sizes: dict[str, int]) -> str:
    return f"--feature_names {','.join(sizes)} --feature_sizes {','.join(map(str, sizes.values()))}"


class SegmentRatings(NamedTuple):
    """A video's 2019 segment ratings as stored, one entry per rated (segment, class) pair: the segment's first
    frame (its start time in seconds), the class rated, and the rating (1.0: the class is present, 0.0: absent)."""

    start_times: np.ndarray  # int64
    labels: np.ndarray  # int64
    scores: np.ndarray  # float32


def _segment_ratings(context: Features, num_classes: int) -> SegmentRatings:
    """The ratings of a SequenceExample's context; none where it has no segment fields. Raises RecordError for
    lists of different lengths, a class outside [0, num_classes), a rating other than 0 or 1, a negative start
    or a (segment, class) pair rated twice."""
    found = {key: context.get(key) for key in (SEGMENT_START_TIMES_KEY, SEGMENT_LABELS_KEY, SEGMENT_SCORES_KEY)}
    expected = {SEGMENT_START_TIMES_KEY: KIND_INT64, SEGMENT_LABELS_KEY: KIND_INT64, SEGMENT_SCORES_KEY: KIND_FLOAT}
    values = {}
    for key, entry in found.items():
        kind, stored = entry if entry is not None else (expected[key], [])
        if kind not in (expected[key], 0):
            raise RecordError(f"feature {key.decode()!r}: expected {_KIND_NAMES[expected[key]]}, found "
                              f"{_describe(kind, stored)}", key.decode())
        values[key] = stored
    lengths = {key.decode(): len(stored) for key, stored in values.items()}
    if len(set(lengths.values())) > 1:
        raise RecordError(f"segment fields: expected one entry per rated segment in each, found lengths {lengths}",
                          "segment_start_times")
    ratings = SegmentRatings(np.array(values[SEGMENT_START_TIMES_KEY], np.int64).reshape(-1),
                             np.array(values[SEGMENT_LABELS_KEY], np.int64).reshape(-1),
                             np.array(values[SEGMENT_SCORES_KEY], np.float32).reshape(-1))
    _check_ratings(ratings, num_classes)
    return _without_repeats(ratings, num_classes)


def _check_ratings(ratings: SegmentRatings, num_classes: int) -> None:
    starts, labels, scores = ratings
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        index = int(np.flatnonzero((labels < 0) | (labels >= num_classes))[0])
        raise RecordError(f"feature 'segment_labels': expected class ids in [0, {num_classes}) (num_classes), found "
                          f"{labels[index]} (segment {index}, start {starts[index]})", "segment_labels")
    bad_scores = np.flatnonzero((scores != 0) & (scores != 1))
    if len(bad_scores):
        index = int(bad_scores[0])
        raise RecordError(f"feature 'segment_scores': expected ratings 0 or 1, found {scores[index]} (segment {index}, "
                          f"start {starts[index]})", "segment_scores")
    if len(starts) and starts.min() < 0:
        index = int(np.argmin(starts))
        raise RecordError(f"feature 'segment_start_times': expected starts >= 0, found {starts[index]} (segment "
                          f"{index})", "segment_start_times")


def _without_repeats(ratings: SegmentRatings, num_classes: int) -> SegmentRatings:
    """The ratings with each (segment, class) pair once: real 2019 records rate some pairs twice alike (validate
    shards hold repeats), which count once; a pair rated both 0 and 1 is a RecordError."""
    starts, labels, scores = ratings
    pairs = starts * num_classes + labels
    if len(set(pairs.tolist())) == len(pairs):  # the common case, without np.unique's sort (a third of the decode)
        return ratings
    _, first, inverse = np.unique(pairs, return_index=True, return_inverse=True)
    conflicting = np.flatnonzero(scores != scores[first][inverse])
    if len(conflicting):
        index = int(conflicting[0])
        raise RecordError(f"segment fields: segment {index} (start {starts[index]}, class {labels[index]}) is rated "
                          "both 0 and 1", "segment_scores")
    keep = np.sort(first)
    return SegmentRatings(starts[keep], labels[keep], scores[keep])


def decode_segment_ratings(payload: bytes, num_classes: int) -> tuple[str, SegmentRatings]:
    """(video id, its segment ratings) of a 2019 segment-rated SequenceExample, frames not decoded."""
    top = _top_level(payload)
    context = _parse_features(*top[SEQUENCE_CONTEXT]) if SEQUENCE_CONTEXT in top else {}
    return _video_id(context), _segment_ratings(context, num_classes)


def decode_segment_video(payload: bytes, feature_names: Sequence[str], feature_sizes: Sequence[int],
                         num_classes: int, segment_size: int) -> tuple[str, np.ndarray, SegmentRatings]:
    """(video id, uint8 [T, sum of sizes] with every frame, segment ratings) of a segment-rated SequenceExample.

    Frames are not cut at max_frames: rated segments may start past frame 300. A segment
    [start, start + segment_size) that ends past the video's last frame is a RecordError naming it.
    """
    context, lists = _sequence_example(payload)
    video_id = _video_id(context)
    ratings = _segment_ratings(context, num_classes)
    frames = _frame_matrix(payload, lists, feature_names, feature_sizes, None)
    beyond = np.flatnonzero(ratings.start_times + segment_size > len(frames))
    if len(beyond):
        index = int(beyond[0])
        raise RecordError(f"feature 'segment_start_times': segment {index} (start {ratings.start_times[index]}, class "
                          f"{ratings.labels[index]}) ends at frame {ratings.start_times[index] + segment_size}, past the "
                          f"video's {len(frames)} frames (--segment_size {segment_size})", "segment_start_times")
    return video_id, frames, ratings


def dequantize(values: np.ndarray, max_quantized_value: float = 2.0, min_quantized_value: float = -2.0,
               out: Optional[np.ndarray] = None) -> np.ndarray:
    """uint8 quantized features back to float32 as the YT8M starter code does, with its float32 rounding:
    q * (max - min) / 255 + (max - min) / 512 + min. `out` (float32, same shape) saves a copy, e.g.
    straight into a padded batch."""
    scalar, bias = quantization_scale_bias(max_quantized_value, min_quantized_value)
    out = np.multiply(values, scalar, out=out, dtype=np.float32)
    return np.add(out, bias, out=out)


def quantization_scale_bias(max_quantized_value: float = 2.0, min_quantized_value: float = -2.0
                            ) -> tuple[np.float32, np.float32]:
    """dequantize's float32 (scale, bias): a value is q * scale + bias, rounded after each operation."""
    quantized_range = max_quantized_value - min_quantized_value
    return np.float32(quantized_range / 255.0), np.float32(quantized_range / 512.0 + min_quantized_value)


def _as_stored(kind: int, values: object) -> object:
    return np.array(values, dtype=np.int64) if kind == KIND_INT64 else values


def _stored_frames(data: bytes, start: int, end: int) -> list:
    """Each frame's values; YT8M's one bytes value per frame is sliced from one array at once."""
    first = next(iter_fields(data, start, end), None)
    if first is not None and first[0] == LIST_VALUE and first[1] == WIRE_LEN:
        kind, values = _parse_feature(data, *first[2])
        if kind == KIND_BYTES and len(values) == 1:
            uniform = _uniform_frames(data, start, end, len(values[0]))
            if uniform is not None:
                return [[row.tobytes()] for row in uniform]
    return [_as_stored(*frame) for frame in _feature_list(data, start, end)]


def parse_record(payload: bytes, sequence: Optional[bool] = None) -> dict:
    """Everything a record holds, as stored: for inspection and tests, not for the training hot path.

    Example: {"message": "Example", "features": {name: values}}; SequenceExample: {"message":
    "SequenceExample", "context": {name: values}, "feature_lists": {name: [values of each frame]}}.
    Values: float32 array (float_list), int64 array (int64_list), list of bytes (bytes_list, and an
    empty list for a Feature with no kind set). With `sequence=None` a record is a SequenceExample
    when it holds at least one feature list: an Example and a SequenceExample without feature lists
    are the same bytes (real 2018 video-level shards even carry an empty feature_lists field).
    """
    context, lists = _sequence_example(payload)
    features = {key.decode(errors="backslashreplace"): _as_stored(*value) for key, value in context.items()}
    if sequence is False or (sequence is None and not lists):
        return {"message": "Example", "features": features}
    feature_lists = {key.decode(errors="backslashreplace"): _stored_frames(*region) for key, region in lists.items()}
    return {"message": "SequenceExample", "context": features, "feature_lists": feature_lists}

"""Whole-batch decoding of video-level Examples laid out as TensorFlow writes them, with numpy array operations.

One round of array operations per map entry replaces a Python loop over each record's fields (hand-written:
protobuf's own parsers leave 1152 floats per record to be copied out one Python object at a time). A record in
any other layout, or with any problem, is left to the per-record decoder in example.py, which has the rules in
full and writes the errors.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch

from yt8m.data.wire import ID_KEYS, KIND_BYTES, KIND_FLOAT, KIND_INT64, LABELS_KEY

# Map entries per record the array walk follows (YT8M videos have 4 or 5); a record with more is left over.
MAX_ENTRIES = 16
# Tags (field number << 3 | wire type 2) of the messages on the way from an Example to a list's values.
_LEN_FIELD_1 = 0x0A
_LEN_FIELD_2 = 0x12
_KIND_TAGS = (0x0A, 0x12, 0x1A)  # Feature.bytes_list / float_list / int64_list


class FastDecoded(NamedTuple):
    """What the array walk decoded: `done[i]` says whether record i was; ids (None where not), and its labels as
    (row, label id) pairs in stored order. Features of done records are written into the caller's array."""

    done: np.ndarray
    video_ids: list[Optional[str]]
    label_rows: np.ndarray
    label_values: np.ndarray


class PackedRecords:
    """A batch's payloads back to back in one uint8 array: record i is data[starts[i]:ends[i]]."""

    def __init__(self, data: np.ndarray, ends: Sequence[int]):
        self.data = data
        self.ends = np.asarray(ends, dtype=np.int64)
        self.starts = np.concatenate([[0], self.ends])[:-1].astype(np.int64)
        self.last = max(len(data) - 1, 0)

    @classmethod
    def join(cls, payloads: Sequence[bytes]) -> "PackedRecords":
        # A bytearray, so the array is writable and torch can gather from it without a copy.
        data = np.frombuffer(bytearray().join(payloads), np.uint8)
        return cls(data, np.cumsum(np.fromiter(map(len, payloads), np.int64, len(payloads))))

    def __len__(self) -> int:
        return len(self.ends)

    def payload(self, index: int) -> bytes:
        return self.data[self.starts[index]:self.ends[index]].tobytes()

    def byte(self, at: np.ndarray) -> np.ndarray:
        """uint8 bytes at `at` (never negative), kept inside the buffer: a row reading past it already fails."""
        return self.data[np.minimum(at, self.last)]

    def varint(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(value, position after, ok) of one- or two-byte varints at `at`; longer ones are not ok."""
        first, second = self.byte(at).astype(np.int64), self.byte(at + 1)
        two = first >= 0x80
        value = np.where(two, (first & 0x7F) | (second.astype(np.int64) << 7), first)
        return value, at + 1 + two, ~two | (second < 0x80)


class _Entries:
    """Per record and per wanted key: where its list's content starts, its size in bytes and its kind."""

    def __init__(self, keys: list[bytes], count: int):
        self.keys = keys
        self.start = np.full((len(keys), count), -1, np.int64)
        self.size = np.zeros((len(keys), count), np.int64)
        self.kind = np.zeros((len(keys), count), np.int64)

    def of(self, key: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        index = self.keys.index(key)
        return self.start[index], self.size[index], self.kind[index]


def _entry_at(buf: PackedRecords, pos: np.ndarray) -> tuple[np.ndarray, ...]:
    """Parse the map entry at `pos` of every row: (ok, entry end, key start, key length, kind, content start,
    content size), where TensorFlow's layout is: key field, value field, the Feature's one kind field holding
    one packed list (or exactly one bytes value), each size ending where its message ends."""
    ok = buf.byte(pos) == _LEN_FIELD_1
    size, at, fine = buf.varint(pos + 1)
    ok &= fine
    entry_end = at + size
    key_length = buf.byte(at + 1)
    ok &= (buf.byte(at) == _LEN_FIELD_1) & (key_length < 0x80)
    key_start = at + 2
    ok &= buf.byte(key_start + key_length) == _LEN_FIELD_2
    size, at, fine = buf.varint(key_start + key_length + 1)
    ok &= fine & (at + size == entry_end)
    kind_tag = buf.byte(at)
    ok &= (kind_tag == _KIND_TAGS[0]) | (kind_tag == _KIND_TAGS[1]) | (kind_tag == _KIND_TAGS[2])
    size, at, fine = buf.varint(at + 1)
    ok &= fine & (at + size == entry_end)
    filled = size > 0
    # An empty bytes list has no value to point at: the per-record decoder takes it.
    ok &= filled | (kind_tag != _KIND_TAGS[0])
    content_size, content_start, fine = buf.varint(at + 1)
    ok &= ~filled | ((buf.byte(at) == _LEN_FIELD_1) & fine & (content_start + content_size == entry_end))
    return (ok, entry_end, key_start, key_length, kind_tag >> 3, np.where(filled, content_start, at),
            np.where(filled, content_size, 0))


def _walk(buf: PackedRecords, keys: list[bytes], ok: np.ndarray, pos: np.ndarray, end: np.ndarray) -> _Entries:
    """Follow every record's map entries at once, noting the wanted keys; `ok` is cleared where a record fails."""
    entries = _Entries(keys, len(pos))
    width = np.arange(max(map(len, keys)))
    patterns = [(index, len(key), np.frombuffer(key, np.uint8)) for index, key in enumerate(keys)]
    active = ok & (pos < end)
    for _ in range(MAX_ENTRIES):
        if not active.any():
            break
        fine, entry_end, key_start, key_length, kind, content_start, content_size = _entry_at(buf, pos)
        fine &= entry_end <= end
        ok &= ~active | fine
        active &= fine
        key_bytes = buf.byte(key_start[:, None] + width)
        for index, length, pattern in patterns:
            hit = active & (key_length == length) & (key_bytes[:, :length] == pattern).all(axis=1)
            ok &= ~(hit & (entries.start[index] >= 0))  # a repeated key: protobuf's last-wins is left to the full path
            entries.start[index] = np.where(hit, content_start, entries.start[index])
            entries.size[index] = np.where(hit, content_size, entries.size[index])
            entries.kind[index] = np.where(hit, kind, entries.kind[index])
        pos = np.where(active, entry_end, pos)
        active &= pos < end
    ok &= ~active  # more entries than MAX_ENTRIES
    return entries


def _body(buf: PackedRecords) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ok, start, end) of each record's Features message: the Example's first field, followed by nothing
    or by the empty field 2 (`12 00`) that real 2018 shards end with."""
    ok = buf.byte(buf.starts) == _LEN_FIELD_1
    size, start, fine = buf.varint(buf.starts + 1)
    end = start + size
    trailer = (end + 2 == buf.ends) & (buf.byte(end) == _LEN_FIELD_2) & (buf.byte(end + 1) == 0)
    ok &= fine & ((end == buf.ends) | trailer)
    return ok, start, end


def _labels(buf: PackedRecords, entries: _Entries, ok: np.ndarray, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, label ids) of the packed int64 labels of the `ok` rows, in stored order; `ok` is cleared for a row
    with labels of another kind, a cut varint, or an id outside [0, num_classes) (its error comes from the full
    path)."""
    start, size, kind = entries.of(LABELS_KEY)
    present = ok & (start >= 0)
    ok &= ~present | (kind == KIND_INT64)
    present &= ok & (size > 0)
    ok &= ~present | (buf.byte(start + size - 1) < 0x80)  # the last varint ends inside the list
    present &= ok
    sizes = np.where(present, size, 0)
    first = np.cumsum(sizes) - sizes
    total = int(sizes.sum())
    offset = np.arange(total)
    values = buf.data[np.repeat(start - first, sizes) + offset].astype(np.int64)
    byte_rows = np.repeat(np.arange(len(sizes)), sizes)
    ends_varint = values < 0x80
    group_starts = np.flatnonzero(np.concatenate(([True], ends_varint[:-1]))) if total else np.zeros(0, np.int64)
    shift = 7 * (offset - np.repeat(group_starts, np.diff(np.append(group_starts, total))))
    labels = np.add.reduceat((values & 0x7F) << np.minimum(shift, 56), group_starts) if total else values
    rows = byte_rows[group_starts]
    bad_rows = rows[labels >= num_classes]
    if total:
        bad_rows = np.union1d(bad_rows, byte_rows[shift > 14])  # four bytes or more: 2^21 and up, or negative
    ok[bad_rows] = False
    keep = ok[rows]
    return rows[keep], labels[keep]


def decode_tf_layout(buf: PackedRecords, wanted: Sequence[tuple[bytes, int, int]], num_classes: int,
                     out: np.ndarray) -> FastDecoded:
    """Decode the records in TensorFlow's layout; `wanted` lists (key, byte size, byte offset in a row of `out`)."""
    ok, pos, end = _body(buf)
    keys = [key for key, _, _ in wanted] + [LABELS_KEY, *ID_KEYS]
    entries = _walk(buf, keys, ok, pos, end)
    for key, size, _ in wanted:
        start, found_size, kind = entries.of(key)
        ok &= (start >= 0) & (kind == KIND_FLOAT) & (found_size == size)
    id_start, id_size, id_kind = entries.of(ID_KEYS[0])
    video_start, video_size, video_kind = entries.of(ID_KEYS[1])
    use_id = id_start >= 0
    id_start, id_size = np.where(use_id, id_start, video_start), np.where(use_id, id_size, video_size)
    ok &= (id_start >= 0) & (np.where(use_id, id_kind, video_kind) == KIND_BYTES)
    video_ids = _copy_rows(buf, entries, wanted, ok, id_start, id_size, out)
    label_rows, label_values = _labels(buf, entries, ok, num_classes)
    return FastDecoded(ok, video_ids, label_rows, label_values)


def _copy_rows(buf: PackedRecords, entries: _Entries, wanted: Sequence[tuple[bytes, int, int]], ok: np.ndarray,
               id_start: np.ndarray, id_size: np.ndarray, out: np.ndarray) -> list[Optional[str]]:
    """Copy the `ok` rows' float lists into `out` and decode their ids (see _video_ids). Each feature is one
    gather of byte windows (index_select over a stride-1 view): 0.33 ms per 1024 rows of 4 KB where a Python
    loop of per-row slice copies takes 0.48 ms, and numpy's fancy indexing 0.64 ms (173k vs 157k examples/s
    read). Being torch, it shares torch's caveat: a process forked after torch ran parallel ops must call
    torch.set_num_threads(1) before this (DataLoader workers do), or its first parallel op hangs."""
    if ok.any():
        joined = torch.from_numpy(buf.data)
        target = torch.from_numpy(out).view(torch.uint8)
        for key, size, offset in wanted:
            windows = joined.as_strided((len(buf.data) - size + 1, size), (1, 1))
            starts = torch.from_numpy(np.where(ok, entries.of(key)[0], 0))  # rows not ok: redone record by record
            target[:, offset:offset + size] = windows.index_select(0, starts)
    return _video_ids(buf, ok, id_start, id_size)


def _video_ids(buf: PackedRecords, ok: np.ndarray, id_start: np.ndarray, id_size: np.ndarray) -> list[Optional[str]]:
    """The `ok` rows' ids (None elsewhere); a row whose id is not UTF-8 is cleared from `ok`.

    Ids of one length in ASCII (every YT8M id) are widened to UCS-4 in one array operation; others are
    decoded one by one.
    """
    rows = np.flatnonzero(ok)
    video_ids: list[Optional[str]] = [None] * len(ok)
    sizes = id_size[rows]
    if len(rows) and (sizes == sizes[0]).all() and sizes[0] > 0:
        chars = buf.data[id_start[rows, None] + np.arange(sizes[0])]
        if ((chars > 0) & (chars < 0x80)).all():  # NUL excluded: numpy strings drop trailing NULs
            for row, video_id in zip(rows.tolist(), chars.astype("<u4").view(f"<U{sizes[0]}")[:, 0].tolist()):
                video_ids[row] = video_id
            return video_ids
    data, id_starts, id_ends = memoryview(buf.data), id_start.tolist(), (id_start + id_size).tolist()
    for row in rows.tolist():
        try:
            video_ids[row] = str(data[id_starts[row]:id_ends[row]], "utf-8")
        except UnicodeDecodeError:
            ok[row] = False
    return video_ids

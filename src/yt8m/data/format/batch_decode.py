"""Whole-batch decoding by the native decoder (_native.c): video-level Examples into one float32 array, frame-level
SequenceExamples into one uint8 array, 2019 segment ratings into arrays.

A record it does not take (anything damaged, repeated, missing or out of range) is left to the per-record decoder
in decode.py, which has the rules in full and writes the errors; without the extension it takes every record.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import numpy as np

from yt8m.optional import load_extension

native, _ = load_extension("yt8m.data.format._native")  # its use is logged by tfrecord, which loads it too

# Byte offsets into a batch's data: an int array (a reader's chunk, a slice of it), or a sequence of ints.
Offsets = Union[np.ndarray, Sequence[int]]


class FastDecoded(NamedTuple):
    """What the native decoder decoded: `done[i]` says whether record i was; ids (None where not), and its labels
    as (row, label id) pairs in stored order. Features of done records are written into the caller's array."""

    done: np.ndarray
    video_ids: list[Optional[str]]
    label_rows: np.ndarray
    label_values: np.ndarray


class PackedRecords:
    """A batch's payloads in one uint8 array: record i is data[starts[i]:ends[i]] (back to back when `starts` is
    not given, as join makes them; a reader's buffer keeps the framing bytes between them)."""

    def __init__(self, data: np.ndarray, ends: Offsets, starts: Optional[Offsets] = None):
        self.data = data
        self.ends = np.ascontiguousarray(ends, dtype=np.int64)
        self.starts = np.ascontiguousarray(np.concatenate([[0], self.ends])[:-1] if starts is None else starts,
                                           dtype=np.int64)

    @classmethod
    def join(cls, payloads: Sequence[bytes]) -> "PackedRecords":
        data = np.frombuffer(b"".join(payloads), np.uint8)
        return cls(data, np.cumsum(np.fromiter(map(len, payloads), np.int64, len(payloads))))

    def __len__(self) -> int:
        return len(self.ends)

    def payload(self, index: int) -> bytes:
        return self.data[self.starts[index]:self.ends[index]].tobytes()


def decode_packed(buf: PackedRecords, wanted: Sequence[tuple[bytes, int, int]], num_classes: int,
                  out: np.ndarray) -> FastDecoded:
    """Decode the video-level records the native decoder takes (none without it) into float32 `out` [N, width];
    `wanted` lists (key, float count, first column in `out`)."""
    if native is None:
        return _nothing_decoded(len(buf))
    keys, sizes, columns = _wanted_arrays(wanted)
    done, id_start, id_size = _record_arrays(len(buf))
    labels = native.decode_examples(buf.data, buf.starts, buf.ends, keys, sizes, columns, num_classes, out, done,
                                    id_start, id_size)
    return _decoded(buf, done, id_start, id_size, labels)


def decode_packed_frames(buf: PackedRecords, wanted: Sequence[tuple[bytes, int, int]], num_classes: int,
                         max_frames: int, out: np.ndarray, num_frames: np.ndarray) -> FastDecoded:
    """Decode the frame-level records the native decoder takes (none without it) into uint8 `out` [N, frames, width]:
    each video's first `max_frames` frames, zeros after them, and its frame count into `num_frames`; `wanted` lists
    (feature list key, bytes per frame, first column)."""
    if native is None:
        return _nothing_decoded(len(buf))
    keys, sizes, columns = _wanted_arrays(wanted)
    done, id_start, id_size = _record_arrays(len(buf))
    labels = native.decode_sequence_examples(buf.data, buf.starts, buf.ends, keys, sizes, columns, num_classes,
                                             max_frames, out, num_frames, done, id_start, id_size)
    return _decoded(buf, done, id_start, id_size, labels)


class PackedRatings(NamedTuple):
    """The 2019 segment ratings the native decoder read: `done[i]` says whether record i was; ids (None where not);
    one entry per rated pair in stored order (repeats kept): its record, segment start, class and rating (0 or 1)."""

    done: np.ndarray
    video_ids: list[Optional[str]]
    rows: np.ndarray
    starts: np.ndarray
    classes: np.ndarray
    ratings: np.ndarray


def decode_packed_ratings(buf: PackedRecords, num_classes: int) -> PackedRatings:
    """The segment ratings of the records the native decoder takes (none without it), frames not read."""
    done, id_start, id_size = _record_arrays(len(buf))
    columns = [b""] * 4
    if native is not None:
        columns = native.decode_segment_ratings(buf.data, buf.starts, buf.ends, num_classes, done, id_start, id_size)
    done = done.view(bool)
    video_ids = _video_ids(buf, done, id_start, id_size)
    rows, starts, classes, ratings = (np.frombuffer(column, np.int64) for column in columns)
    keep = done[rows]  # _video_ids undid the rows whose id is not UTF-8
    return PackedRatings(done, video_ids, rows[keep], starts[keep], classes[keep], ratings[keep])


def _nothing_decoded(count: int) -> FastDecoded:
    return FastDecoded(np.zeros(count, bool), [None] * count, np.empty(0, np.int64), np.empty(0, np.int64))


def _wanted_arrays(wanted: Sequence[tuple[bytes, int, int]]) -> tuple[tuple[bytes, ...], np.ndarray, np.ndarray]:
    return (tuple(key for key, _, _ in wanted), np.array([size for _, size, _ in wanted], np.int64),
            np.array([column for _, _, column in wanted], np.int64))


def _record_arrays(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(done flags, id starts, id sizes) for the native decoder to fill."""
    return np.zeros(count, np.uint8), np.zeros(count, np.int64), np.zeros(count, np.int64)


def _decoded(buf: PackedRecords, done: np.ndarray, id_start: np.ndarray, id_size: np.ndarray,
             labels: tuple[bytes, bytes]) -> FastDecoded:
    done = done.view(bool)
    video_ids = _video_ids(buf, done, id_start, id_size)
    rows, values = (np.frombuffer(column, np.int64) for column in labels)
    keep = done[rows]  # _video_ids undid the rows whose id is not UTF-8
    return FastDecoded(done, video_ids, rows[keep], values[keep])


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
    # ndarray.data: the array's memoryview (numpy's stubs give an array the buffer protocol from Python 3.12 only)
    data, id_starts, id_ends = buf.data.data, id_start.tolist(), (id_start + id_size).tolist()
    for row in rows.tolist():
        try:
            video_ids[row] = str(data[id_starts[row]:id_ends[row]], "utf-8")
        except UnicodeDecodeError:
            ok[row] = False
    return video_ids

"""The layout TensorFlow writes, read without the complete parser: Features map entries one header at a time, and
feature lists whose every frame is one bytes value (example_parse.py falls back to the complete parser otherwise)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from yt8m.data.format.encode import frame_header

Region = tuple  # (kind, start, end): a list's packed values (or its one bytes value) in the record


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


def walk_entries(data: bytes, start: int, end: int) -> Optional[dict[bytes, Region]]:
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


def uniform_frames(data: bytes, start: int, end: int, size: int) -> Optional[np.ndarray]:
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

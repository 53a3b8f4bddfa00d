"""The protobuf wire format read by hand: the errors of a record that does not hold what a reader expects
(RecordError, naming file, offset and field; WireFormatError), and a scanner of its varints and fields."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from yt8m.data.format.wire import (
    UINT64_MASK,
    WIRE_FIXED32,
    WIRE_FIXED64,
    WIRE_GROUP_END,
    WIRE_GROUP_START,
    WIRE_LEN,
    WIRE_VARINT,
)

MAX_GROUP_DEPTH = 100  # protobuf's default recursion limit

# A field's value, which its wire type decides: an int (a varint's value, a group's start offset) or the (start, end)
# offsets of its bytes (length-delimited, fixed32, fixed64). Any: no annotation ties it to the wire type yielded
# beside it, and the parsers, reading it by that wire type, pay no isinstance check or cast() call per field.
FieldValue = Any


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


def _read_key(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, position after it) of the field key at `pos`; field number 0 is invalid."""
    key, pos = read_varint(data, pos, end)
    if key >> 3 == 0:
        raise WireFormatError(f"field number 0 at byte {pos}")
    return key >> 3, key & 7, pos


def _field_value(data: bytes, pos: int, end: int, wire: int) -> tuple[FieldValue, int]:
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
        field, wire, pos = _read_key(data, pos, end)
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


def iter_fields(data: bytes, start: int = 0, end: Optional[int] = None) -> Iterator[tuple[int, int, FieldValue]]:
    """Every field of the message in data[start:end] as (number, wire type, value), in wire order.

    Value: an int for varints, (start, end) offsets into `data` for length-delimited, fixed32 and
    fixed64 fields, and the start offset for a (skipped) group.
    """
    pos, end = start, len(data) if end is None else end
    value: FieldValue
    while pos < end:
        number, wire, pos = _read_key(data, pos, end)
        if wire == WIRE_GROUP_START:
            value, pos = pos, _skip_group(data, pos, end, number)
        elif wire == WIRE_GROUP_END:
            raise WireFormatError(f"unexpected end of group {number} at byte {pos}")
        else:
            value, pos = _field_value(data, pos, end, wire)
        if pos > end:
            raise WireFormatError(f"field {number} runs past the end of its message ({pos} > {end})")
        yield number, wire, value


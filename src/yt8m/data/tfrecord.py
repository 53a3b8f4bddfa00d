"""TFRecord framing: read and write record streams with verified masked CRC-32C, plain or GZIP.

Paths go through fsspec (local, gs://, s3://, memory://); patterns may be comma-separated globs.
"""

from __future__ import annotations

import gzip
import logging
import struct
import zlib
from typing import BinaryIO, Callable, Iterator, Optional

import crc32c
import fsspec

logger = logging.getLogger(__name__)

HEADER_SIZE = 12  # uint64 length + uint32 masked CRC of the length
FOOTER_SIZE = 4  # uint32 masked CRC of the payload
_MASK_DELTA = 0xA282EAD8
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK_SIZE = 1 << 20
_LENGTH_HEADER = struct.Struct("<QI")
_UINT32 = struct.Struct("<I")
_UINT64 = struct.Struct("<Q")


class CorruptRecordError(ValueError):
    """A record whose CRC does not match or that ends early; `offset` is TensorFlow's for the same error."""

    def __init__(self, path: str, offset: int, problem: str, detail: str = ""):
        self.path = path
        self.offset = offset
        self.problem = problem
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"{path}: {problem} at {offset}{suffix}")


def masked_crc32c(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _has_glob(part: str) -> bool:
    return any(ch in part for ch in "*?[")


def _expand_one(glob: str) -> list[str]:
    try:
        fs, stripped = fsspec.core.url_to_fs(glob)
    except ImportError as err:  # e.g. gs:// without gcsfs
        raise ValueError(f"cannot read {glob!r}: {err}") from err
    if _has_glob(stripped):
        found = [path for path, info in fs.glob(stripped, detail=True).items() if info.get("type") == "file"]
    else:
        found = [stripped] if fs.isfile(stripped) else []
    is_local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
    return [path if is_local else fs.unstrip_protocol(path) for path in found]


def expand_pattern(pattern: str) -> list[str]:
    """All files matched by a comma-separated list of paths or globs, sorted and without repeats.

    Raises ValueError naming the glob when one of them matches nothing, so a typo never reads less data.
    """
    globs = [part.strip() for part in pattern.split(",") if part.strip()]
    if not globs:
        raise ValueError(f"empty file pattern {pattern!r}")
    paths: set[str] = set()
    for glob in globs:
        found = _expand_one(glob)
        if not found:
            where = "" if glob == pattern.strip() else f" (in pattern {pattern!r})"
            raise ValueError(f"no files match {glob!r}{where}")
        paths.update(found)
    return sorted(paths)


def _is_plain_tfrecord(head: bytes) -> bool:
    if len(head) < HEADER_SIZE:
        return False
    length_crc = _UINT32.unpack_from(head, 8)[0]
    return masked_crc32c(head[:8]) == length_crc


class _GzipStream:
    """readinto() over a GZIP file that, unlike gzip.GzipFile, hands out everything decompressed before
    a cut or damaged spot and only then raises, so the records before the damage are still read."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # 16: expect the gzip header and trailer
        self._pending = memoryview(b"")
        self._error: Optional[Exception] = None

    def _decompress_more(self) -> bool:
        """Fill the pending output; False at the clean end of the stream."""
        while not self._pending:
            if self._error is not None:
                raise self._error
            if self._inflate.eof:  # a member ended: another may follow (concatenated gzip files)
                data = self._inflate.unused_data or self._raw.read(_CHUNK_SIZE)
                if not data:
                    return False
                self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            elif self._inflate.unconsumed_tail:  # input left over when the output limit below was reached
                data = self._inflate.unconsumed_tail
            else:
                data = self._raw.read(_CHUNK_SIZE)
                if not data:
                    self._error = EOFError("the GZIP stream ends before its end marker")
                    continue
            try:
                self._pending = memoryview(self._inflate.decompress(data, _CHUNK_SIZE))
            except zlib.error as err:
                self._error = err
        return True

    def readinto(self, view: memoryview) -> int:
        if not self._decompress_more():
            return 0
        count = min(len(view), len(self._pending))
        view[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


def _record_stream(raw: BinaryIO) -> BinaryIO:
    """The uncompressed record stream: GZIP is recognized by its magic bytes, whatever the file's name.

    A plain file whose first length happens to start with the GZIP magic is told apart by its valid length CRC.
    """
    head = raw.read(HEADER_SIZE)
    raw.seek(0)
    if head[:2] == _GZIP_MAGIC and not _is_plain_tfrecord(head):
        return _GzipStream(raw)
    return raw


def _refill(stream: BinaryIO, view: memoryview, pos: int, fill: int, needed: int,
            path: str, offset: int) -> tuple[memoryview, int]:
    """Move the unread bytes view[pos:fill] to the front and read more, until `needed` bytes or the end.

    Reading into one reused buffer avoids allocating (and page-faulting) a fresh chunk per read.
    A damaged GZIP stream is a corrupt record at `offset`, the first record not read whole.
    """
    tail = bytes(view[pos:fill])
    if needed > len(view):
        view = memoryview(bytearray(max(needed, 2 * len(view))))
    view[:len(tail)] = tail
    fill = len(tail)
    while fill < needed:
        try:
            count = stream.readinto(view[fill:])
        except (EOFError, zlib.error) as err:
            raise CorruptRecordError(path, offset, "corrupted record", f"GZIP stream: {err}") from err
        if not count:
            break
        fill += count
    return view, fill


def _scan_records(stream: BinaryIO, path: str, borrowed: bool) -> Iterator[tuple[int, bytes]]:
    # The hot loop of every reader: CRC checks inlined (masked as in masked_crc32c) and the functions it
    # calls bound to locals, as calls and global lookups are a good part of its time per record.
    read_header, read_crc = _LENGTH_HEADER.unpack_from, _UINT32.unpack_from
    crc32, mask_delta = crc32c.crc32c, _MASK_DELTA
    view = memoryview(bytearray(_CHUNK_SIZE))
    pos = fill = base = 0  # view[pos:fill] holds unread bytes; base is the stream offset of view[0]
    known_lengths: dict[int, int] = {}  # length -> its masked CRC, as verified
    while True:
        if fill - pos < HEADER_SIZE:
            view, fill = _refill(stream, view, pos, fill, HEADER_SIZE, path, base + pos)
            base, pos = base + pos, 0
            if fill < HEADER_SIZE:
                if fill == 0:
                    return
                raise CorruptRecordError(path, base, "truncated record",
                                         f"{fill} bytes left, a record header takes {HEADER_SIZE}")
        length, length_crc = read_header(view, pos)
        if known_lengths.get(length) != length_crc:  # records of a file share a few lengths: check each once
            crc = crc32(view[pos:pos + 8])
            if (((crc >> 15) | (crc << 17)) + mask_delta) & 0xFFFFFFFF != length_crc:
                raise CorruptRecordError(path, base + pos, "corrupted record", "length CRC mismatch")
            known_lengths[length] = length_crc
        record_size = HEADER_SIZE + length + FOOTER_SIZE
        if pos + record_size > fill:
            view, fill = _refill(stream, view, pos, fill, record_size, path, base + pos)
            base, pos = base + pos, 0
            if record_size > fill:
                raise CorruptRecordError(path, base, "truncated record",
                                         f"payload of {length} bytes, {fill - HEADER_SIZE} left in the file")
        end = pos + HEADER_SIZE + length
        payload = view[pos + HEADER_SIZE:end] if borrowed else bytes(view[pos + HEADER_SIZE:end])
        crc = crc32(payload)
        if (((crc >> 15) | (crc << 17)) + mask_delta) & 0xFFFFFFFF != read_crc(view, end)[0]:
            raise CorruptRecordError(path, base + pos + HEADER_SIZE, "corrupted record",
                                     f"payload CRC mismatch in the record starting at {base + pos}")
        yield base + pos, payload
        pos = end + FOOTER_SIZE


def read_records(path: str, skip_corrupt: bool = False,
                 on_corrupt: Optional[Callable[[CorruptRecordError], None]] = None,
                 borrowed: bool = False) -> Iterator[tuple[int, bytes]]:
    """Yield (byte offset of the record in the uncompressed stream, payload) for each record of one file.

    With `borrowed`, a payload is a memoryview into the reader's buffer, valid only until the next
    record is asked for: for a consumer that copies each one at once, sparing a copy. A CRC mismatch or
    a truncated record raises CorruptRecordError naming the file and offset; with `skip_corrupt` the rest
    of that file is skipped with a warning and `on_corrupt(error)` is called.
    """
    with fsspec.open(path, "rb") as raw:
        stream = _record_stream(raw)
        try:
            yield from _scan_records(stream, path, borrowed)
        except CorruptRecordError as err:
            if not skip_corrupt:
                raise
            logger.warning("%s; skipping the rest of this file", err)
            if on_corrupt is not None:
                on_corrupt(err)


class TFRecordWriter:
    """Write records with TensorFlow's framing; `compression="GZIP"` compresses the whole stream."""

    def __init__(self, path: str, compression: Optional[str] = None):
        kind = (compression or "NONE").upper()
        if kind not in ("NONE", "GZIP"):
            raise ValueError(f"compression must be None or 'GZIP', got {compression!r}")
        self.path = path
        self._file = fsspec.open(path, "wb").open()
        self._stream: BinaryIO = gzip.GzipFile(fileobj=self._file, mode="wb") if kind == "GZIP" else self._file

    def write(self, payload: bytes) -> None:
        length = _UINT64.pack(len(payload))
        self._stream.write(b"".join((length, _UINT32.pack(masked_crc32c(length)),
                                     payload, _UINT32.pack(masked_crc32c(payload)))))

    def close(self) -> None:
        if self._stream is not self._file:
            self._stream.close()
        self._file.close()

    def __enter__(self) -> "TFRecordWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

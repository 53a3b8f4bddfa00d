"""TFRecord framing: read and write record streams with verified masked CRC-32C, plain or GZIP.

Paths go through fsspec (local, gs://, s3://, memory://); patterns may be comma-separated globs.
"""

from __future__ import annotations

import glob as globbing
import gzip
import logging
import os
import struct
import zlib
from typing import (
    Any,
    BinaryIO,
    Callable,
    ContextManager,
    Generator,
    Iterator,
    NamedTuple,
    Optional,
    Protocol,
    Union,
    cast,
)

import crc32c
import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from yt8m.fields import quoted
from yt8m.io import storage
from yt8m.io.remote_reads import open_for_reading
from yt8m.optional import load_extension, log_path_once

logger = logging.getLogger(__name__)
native, _native_why = load_extension("yt8m.data.format._native")

HEADER_SIZE = 12  # uint64 length + uint32 masked CRC of the length
FOOTER_SIZE = 4  # uint32 masked CRC of the payload
_MASK_DELTA = 0xA282EAD8
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK_SIZE = 1 << 20  # GZIP: compressed bytes read, and uncompressed bytes handed out, per call
READ_SIZE = 16 << 20  # a reader's buffer: whole video-level shards (YT8M's are 1-5 MB) in one read
_RECORDS_PER_CHUNK = 256
RECORDS_PER_CALL = 4096  # records framed and decoded per call into C by readers of whole shards (labels, ratings)
_UINT32 = struct.Struct("<I")
_UINT64 = struct.Struct("<Q")
_HEADER = struct.Struct("<QI")
_MAX_UINT64 = 2 ** 64 - 1  # the native framing's bytes needed saturate there
# frame_records' statuses, as _native.c numbers them
FRAME_LIMIT, FRAME_NEED_BYTES, FRAME_BAD_LENGTH_CRC, FRAME_BAD_PAYLOAD_CRC = range(4)


class CorruptRecordError(ValueError):
    """A record whose CRC does not match or that ends early; `offset` is TensorFlow's for the same error."""

    def __init__(self, path: str, offset: int, problem: str, detail: str = ""):
        self.path = path
        self.offset = offset
        self.problem = problem
        self.detail = detail
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"{path}: {problem} at {offset}{suffix}")

    def __reduce__(self) -> tuple:
        """Pickled by its parts (a DataLoader worker sends it to the main process): args holds only the message."""
        return type(self), (self.path, self.offset, self.problem, self.detail), self.__dict__


def masked_crc32c(data: bytes | memoryview) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_records_python(data: np.ndarray, pos: int, fill: int, limit: int, starts: np.ndarray,
                         ends: np.ndarray) -> tuple[int, int, int, int]:
    """_native.c's frame_records in Python, where the extension is not built: the same results, about 3 us per
    record more. Verifies and locates the records of data[pos:fill] until `limit` are taken or one is incomplete
    or corrupt; returns (records taken, the position after them, the status, the bytes the record at that position
    takes in all when more are needed)."""
    view = data.data  # the array's memoryview (numpy's stubs give an array the buffer protocol from Python 3.12 only)
    count = 0
    while count < limit:
        if fill - pos < HEADER_SIZE:
            return count, pos, FRAME_NEED_BYTES, HEADER_SIZE
        length, length_crc = _HEADER.unpack_from(view, pos)
        if masked_crc32c(view[pos:pos + 8]) != length_crc:
            return count, pos, FRAME_BAD_LENGTH_CRC, 0
        payload, end = pos + HEADER_SIZE, pos + HEADER_SIZE + length
        if end + FOOTER_SIZE > fill:
            return count, pos, FRAME_NEED_BYTES, min(length + HEADER_SIZE + FOOTER_SIZE, _MAX_UINT64)
        if masked_crc32c(view[payload:end]) != _UINT32.unpack_from(view, end)[0]:
            return count, pos, FRAME_BAD_PAYLOAD_CRC, 0
        starts[count], ends[count] = payload, end
        count += 1
        pos = end + FOOTER_SIZE
    return count, pos, FRAME_LIMIT, 0


def frame_records(data: np.ndarray, pos: int, fill: int, limit: int, starts: np.ndarray,
                  ends: np.ndarray) -> tuple[int, int, int, int]:
    """frame_records_python's work, in C where the extension is built."""
    if native is None:
        return frame_records_python(data, pos, fill, limit, starts, ends)
    return native.frame_records(data, pos, fill, limit, starts, ends)


def _has_glob(part: str) -> bool:
    return any(ch in part for ch in "*?[")


def _expand_one(glob: str) -> dict[str, Optional[int]]:
    """The files one glob (or path) matches, with their sizes where the listing gives them (object storage's does: a
    reader then needs no request of its own to size them); a local file's size is left to os.stat when asked."""
    try:
        fs, stripped = fsspec.core.url_to_fs(glob)
    except ImportError as err:  # e.g. gs:// without gcsfs
        raise ValueError(f"cannot read {quoted(glob)}: {err}") from err
    if isinstance(fs, LocalFileSystem):
        return dict.fromkeys(_expand_local(stripped))
    with storage.reaching(glob):
        if _has_glob(stripped):
            found = {path: info.get("size") for path, info in fs.glob(stripped, detail=True).items()
                     if info.get("type") == "file"}
        else:
            info = _file_info(fs, stripped)
            found = {stripped: info.get("size")} if info is not None else {}
    return {fs.unstrip_protocol(path): size for path, size in found.items()}


def _expand_local(pattern: str) -> list[str]:
    """What the shell's glob matches, as it matches it: symlinks followed (dangling ones too, which fail naming
    themselves when read), hidden names left out; folders are never shards."""
    found = globbing.glob(pattern, recursive=True) if _has_glob(pattern) else [pattern]
    return [path for path in found if os.path.lexists(path) and not os.path.isdir(path)]


def _file_info(fs: fsspec.AbstractFileSystem, path: str) -> Optional[dict[str, Any]]:
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None
    return info if info.get("type") == "file" else None


def expand_pattern(pattern: str) -> list[str]:
    """All files matched by a comma-separated list of paths or globs, sorted and without repeats.

    Raises ValueError naming the glob when one of them matches nothing, so a typo never reads less data.
    """
    return list(list_shards(pattern))


def list_shards(pattern: str) -> dict[str, Optional[int]]:
    """expand_pattern's files, sorted, each with its size where the listing gave it (None: not listed with one,
    e.g. a local file, whose os.stat costs no request)."""
    globs = [part.strip() for part in pattern.split(",") if part.strip()]
    if not globs:
        raise ValueError(f"empty file pattern {quoted(pattern)}")
    listed: dict[str, Optional[int]] = {}
    for glob in globs:
        found = _expand_one(glob)
        if not found:
            where = "" if glob == pattern.strip() else f" (in pattern {quoted(pattern)})"
            raise ValueError(f"no files match {quoted(glob)}{where}")
        listed.update(found)
    return dict(sorted(listed.items()))


def _is_plain_tfrecord(head: bytes) -> bool:
    if len(head) < HEADER_SIZE:
        return False
    length_crc = _UINT32.unpack_from(head, 8)[0]
    return masked_crc32c(head[:8]) == length_crc


class RecordStream(Protocol):
    """What framing reads a record stream with: a file fsspec opened, or _GzipStream over one."""

    def readinto(self, buffer: memoryview, /) -> Optional[int]: ...


class SourceFile(RecordStream, Protocol):
    """A file fsspec opened for reading, as _record_stream and _GzipStream use it."""

    def read(self, size: int = -1, /) -> bytes: ...

    def seek(self, offset: int, whence: int = 0, /) -> int: ...


class _GzipStream:
    """readinto() over a GZIP file that, unlike gzip.GzipFile, hands out everything decompressed before
    a cut or damaged spot and only then raises, so the records before the damage are still read."""

    def __init__(self, raw: SourceFile):
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


def _record_stream(raw: SourceFile) -> RecordStream:
    """The uncompressed record stream: GZIP is recognized by its magic bytes, whatever the file's name.

    A plain file whose first length happens to start with the GZIP magic is told apart by its valid length CRC.
    """
    head = raw.read(HEADER_SIZE)
    raw.seek(0)
    if head[:2] == _GZIP_MAGIC and not _is_plain_tfrecord(head):
        return _GzipStream(raw)
    return raw


def is_compressed(path: str) -> bool:
    """Whether the file is GZIP-compressed (as _record_stream tells it: by its magic bytes)."""
    with storage.open_file(path, "rb") as raw:
        head = raw.read(HEADER_SIZE)
    return head[:2] == _GZIP_MAGIC and not _is_plain_tfrecord(head)


_spare_buffers: list[np.ndarray] = []  # read buffers of finished files, for the next files' readers


def _take_buffer() -> np.ndarray:
    while _spare_buffers:
        buffer = _spare_buffers.pop()
        if len(buffer) == READ_SIZE:
            return buffer
    return np.empty(READ_SIZE, np.uint8)


def _give_back(buffer: np.ndarray) -> None:
    """Keep a few buffers of the usual size; grown ones (records over READ_SIZE) are let go."""
    if len(buffer) == READ_SIZE and len(_spare_buffers) < 2:
        _spare_buffers.append(buffer)


class RecordChunk(NamedTuple):
    """Verified records lying in one buffer: payload i is data[starts[i]:ends[i]], its record at byte `offsets[i]`
    of the uncompressed stream. Borrowed: the buffer is reused once the next chunk is asked for."""

    data: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    offsets: np.ndarray


class _ChunkReader:
    """Frames a stream's records, up to `limit` per chunk, with frame_records over one reused buffer.

    The stream is read, never mapped: a mapped file cut short by another process raises SIGBUS, which kills the
    process, where a read just returns fewer bytes. Reads of READ_SIZE bytes take a whole video-level shard in one
    go, and framing where the bytes lie matches the mapping's speed (bench/README.md). A chunk ends where asked or
    where the buffer's bytes do; a record larger than the buffer grows it.
    """

    def __init__(self, stream: RecordStream, path: str, limit: int):
        self.stream, self.path, self.limit = stream, path, limit
        self.data = _take_buffer()
        self.starts, self.ends = np.empty(limit, np.int64), np.empty(limit, np.int64)
        self.pos = self.fill = self.base = 0  # data[pos:fill] holds unframed bytes; base: stream offset of data[0]
        self.at_end = False
        self.stream_error: Optional[Exception] = None  # a damaged GZIP stream, raised after the bytes before it

    def release(self) -> None:
        """Hand the buffer on to the next file's reader: a fresh one would page-fault once per 4 KB."""
        _give_back(self.data)

    def chunks(self) -> Generator[RecordChunk, Optional[int], None]:
        while True:
            count, self.pos, status, needed = frame_records(
                self.data, self.pos, self.fill, self.limit, self.starts, self.ends)
            more = status == FRAME_LIMIT or (status == FRAME_NEED_BYTES and not self.at_end)
            if count and more:  # handed out before the next read moves what is left of the buffer
                self._ask((yield self._chunk(count)))
            if status == FRAME_NEED_BYTES and not self.at_end:
                self._refill(needed)
            if more:
                continue
            if count:
                yield self._chunk(count)
            if status != FRAME_NEED_BYTES:
                raise self._corrupt(status)
            if self.stream_error is not None:
                raise CorruptRecordError(self.path, self.base + self.pos, "corrupted record",
                                         f"GZIP stream: {self.stream_error}") from self.stream_error
            if self.fill > self.pos:
                raise self._truncated()
            return

    def _ask(self, limit: Optional[int]) -> None:
        """Records for the next chunk, as the consumer sent (None: as many as before)."""
        self.limit = limit or self.limit
        if self.limit > len(self.starts):
            self.starts, self.ends = np.empty(self.limit, np.int64), np.empty(self.limit, np.int64)

    def _chunk(self, count: int) -> RecordChunk:
        starts, ends = self.starts[:count], self.ends[:count]
        return RecordChunk(self.data, starts, ends, starts + (self.base - HEADER_SIZE))

    def _refill(self, needed: int) -> None:
        """Move the unframed bytes to the front and read more. A record larger than the buffer doubles it (again on
        the next call if need be): a damaged length of petabytes must end as a truncated record, not an allocation."""
        tail = self.fill - self.pos
        if needed > len(self.data):
            grown = np.empty(2 * len(self.data), np.uint8)
            grown[:tail] = self.data[self.pos:self.fill]
            self.data = grown
        else:
            self.data[:tail] = self.data[self.pos:self.fill]
        self.base, self.pos, self.fill = self.base + self.pos, 0, tail
        view = self.data.data  # the buffer's memoryview
        while self.fill < len(self.data):
            try:
                read = self.stream.readinto(view[self.fill:])
            except (EOFError, zlib.error) as err:
                self.stream_error, read = err, 0
            if not read:
                self.at_end = True
                break
            self.fill += read

    def _corrupt(self, status: int) -> CorruptRecordError:
        at = self.base + self.pos
        if status == FRAME_BAD_LENGTH_CRC:
            return CorruptRecordError(self.path, at, "corrupted record", "length CRC mismatch")
        return CorruptRecordError(self.path, at + HEADER_SIZE, "corrupted record",
                                  f"payload CRC mismatch in the record starting at {at}")

    def _truncated(self) -> CorruptRecordError:
        left = self.fill - self.pos
        if left < HEADER_SIZE:
            detail = f"{left} bytes left, a record header takes {HEADER_SIZE}"
        else:
            length, after_header = _UINT64.unpack_from(self.data.data, self.pos)[0], left - HEADER_SIZE
            if length > after_header:
                detail = f"its length field says {length} payload bytes, more than the {after_header} left in the file"
            else:
                detail = (f"its {length}-byte payload and {FOOTER_SIZE}-byte CRC need {length + FOOTER_SIZE} bytes, "
                          f"{after_header} left in the file")
        return CorruptRecordError(self.path, self.base + self.pos, "truncated record", detail)


def read_record_chunks(path: str, limit: int, skip_corrupt: bool = False,
                       on_corrupt: Optional[Callable[[CorruptRecordError], None]] = None,
                       source: Optional[ContextManager[Any]] = None, size: Optional[int] = None
                       ) -> Generator[RecordChunk, Optional[int], None]:
    """One file's records as RecordChunks of up to `limit` records each (fewer where the read buffer's bytes end,
    every READ_SIZE bytes of the stream, and at the file's end); `send(n)` asks for up to n in the next chunk
    instead. A chunk is valid until the next is asked for or the generator is closed. Errors as in read_records.
    `source`: the file opened already (by a reader that fetches ahead); default: opened here, knowing its `size`
    where a listing gave it (no request to size it)."""
    log_path_once("native TFRecord decoding", native is not None, _native_why)
    # on object storage, every read with a deadline and retries
    with source if source is not None else open_for_reading(path, size) as raw:
        reader = _ChunkReader(_record_stream(cast(SourceFile, raw)), path, limit)
        try:
            yield from reader.chunks()
        except CorruptRecordError as err:
            if not skip_corrupt:
                raise
            logger.warning("%s; skipping the rest of this file", err)
            if on_corrupt is not None:
                on_corrupt(err)
        finally:
            reader.release()


def read_records(path: str, skip_corrupt: bool = False,
                 on_corrupt: Optional[Callable[[CorruptRecordError], None]] = None,
                 source: Optional[ContextManager[Any]] = None, size: Optional[int] = None
                 ) -> Iterator[tuple[int, bytes]]:
    """Yield (byte offset of the record in the uncompressed stream, payload) for each record of one file.

    A CRC mismatch or a truncated record raises CorruptRecordError naming the file and offset; with
    `skip_corrupt` the rest of that file is skipped with a warning and `on_corrupt(error)` is called. `source` and
    `size` as in read_record_chunks.
    """
    for chunk in read_record_chunks(path, _RECORDS_PER_CHUNK, skip_corrupt, on_corrupt, source, size):
        view = chunk.data.data  # the buffer's memoryview
        for offset, start, end in zip(chunk.offsets.tolist(), chunk.starts.tolist(), chunk.ends.tolist()):
            yield offset, bytes(view[start:end])


def framed_record(payload: bytes) -> bytes:
    """A record as TFRecord files hold it: its length and the length's masked CRC32C, the payload, its CRC32C."""
    length = _UINT64.pack(len(payload))
    return b"".join((length, _UINT32.pack(masked_crc32c(length)), payload, _UINT32.pack(masked_crc32c(payload))))


class TFRecordWriter:
    """Write records with TensorFlow's framing; `compression="GZIP"` compresses the whole stream."""

    def __init__(self, path: str, compression: Optional[str] = None):
        kind = (compression or "NONE").upper()
        if kind not in ("NONE", "GZIP"):
            raise ValueError(f"compression must be None or 'GZIP', got {compression!r}")
        self.path = path
        self._file = fsspec.open(path, "wb").open()
        self._stream: Union[BinaryIO, gzip.GzipFile] = (gzip.GzipFile(fileobj=self._file, mode="wb") if kind == "GZIP"
                                                        else self._file)

    def write(self, payload: bytes) -> None:
        self._stream.write(framed_record(payload))

    def close(self) -> None:
        if self._stream is not self._file:
            self._stream.close()
        self._file.close()

    def __enter__(self) -> "TFRecordWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

"""File helpers shared by the commands: files that appear only once completely written, and durably.

A watching reader (`yt8m eval`, `tune-report`, a serving job) never sees half a file, and a full disk leaves none.
On object storage (s3://, gs://) a file is written locally first, then uploaded in one PUT (or one completed
multipart upload): the object appears under its name only whole.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from typing import IO, Callable, Iterator, Optional, TextIO, TypeVar, cast

from yt8m.io import storage

T = TypeVar("T")

# `.NAME.tmp-PID-RANDOM` beside NAME: hidden from globs, never a name another writer picks.
_TEMPORARY = re.compile(r"^\.(.+)\.tmp-(\d+)-[0-9a-f]{8}$")
# The longest file name (bytes) Linux, macOS and Windows file systems take.
NAME_MAX_BYTES = 255
# What a temporary name adds to the NAME part: `.`, `.tmp-`, a PID of up to 10 digits, `-` and 8 hex digits.
_TEMPORARY_EXTRA_BYTES = 1 + 5 + 10 + 1 + 8
# A NAME part cut short ends with `~` and 8 hex digits of the full name's MD5.
_CUT_NAME_EXTRA_BYTES = 9
_BUFFER_BYTES = 1 << 20


class WriteError(OSError):
    """Writing a file failed (a full disk, a file size limit, an I/O error): names the file and the cause.

    The `yt8m` command prints it as one line (an OSError), without a traceback.
    """

    def __init__(self, path: str, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.filename = path

    def __str__(self) -> str:
        return f"could not write {self.filename}: {self.strerror}"


def temporary_path(path: str) -> str:
    """A name beside `path` (so that renaming it into place is atomic) that no other writer uses."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{temporary_stem(name)}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def temporary_stem(name: str) -> str:
    """The NAME part of `name`'s temporary names: the name itself, or where that would make a temporary name longer
    than a file system takes (a name of 231 to 255 bytes), its start and a hash of it."""
    encoded = name.encode()
    if len(encoded) + _TEMPORARY_EXTRA_BYTES <= NAME_MAX_BYTES:
        return name
    start = encoded[:NAME_MAX_BYTES - _TEMPORARY_EXTRA_BYTES - _CUT_NAME_EXTRA_BYTES].decode(errors="ignore")
    return f"{start}~{hashlib.md5(encoded).hexdigest()[:8]}"


def temporary_owner(name: str) -> Optional[tuple[str, int]]:
    """(NAME part, writer's PID) of a temporary name, or None for any other name."""
    match = _TEMPORARY.match(name)
    return (match.group(1), int(match.group(2))) if match else None


def is_temporary(name: str) -> bool:
    return temporary_owner(name) is not None


class _RawFile(io.RawIOBase):
    """An unbuffered file whose write, fsync and close failures become WriteError naming `reported_path`,
    so a caller's own OSErrors (reading its input) stay as they are. The first failure is kept in `error`:
    a writer such as torch.save may replace it with an error of its own."""

    def __init__(self, path: str, reported_path: str) -> None:
        super().__init__()
        self.reported_path = reported_path
        self.error: Optional[WriteError] = None
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def write(self, data) -> int:
        try:
            return os.write(self._fd, data)
        except OSError as err:
            raise self._failed(err) from err

    def sync(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as err:
            raise self._failed(err) from err

    def close(self) -> None:
        if not self.closed:
            fd, self._fd = self._fd, -1
            super().close()
            try:
                os.close(fd)
            except OSError as err:
                raise self._failed(err) from err

    def _failed(self, cause: OSError) -> WriteError:
        self.error = self.error or WriteError(self.reported_path, cause)
        return self.error


@contextmanager
def atomic_writer(path: str, binary: bool = False) -> Iterator[IO]:
    """A file object that becomes `path` when the block ends: written under a temporary name beside it,
    flushed to the disk (fsync), renamed into place, then the directory synced. A URL (s3://, gs://) is
    written to a local temporary file, then uploaded whole.

    If anything fails the temporary file is removed and `path` is left as it was; a failure to write
    raises WriteError naming `path`.
    """
    if not storage.is_local(path):
        with _uploading_writer(path, binary) as out:
            yield out
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = temporary_path(path)
    with _file_writer(tmp, path, binary, durable=True) as out:
        yield out
    try:
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise
    sync_directory(os.path.dirname(os.path.abspath(path)))


@contextmanager
def _uploading_writer(url: str, binary: bool) -> Iterator[IO]:
    """atomic_writer for object storage: an upload is atomic there (the object appears only complete), a rename
    is not (it is a copy, then a delete), so the file is staged locally and put under its final name once."""
    fs, remote = storage.filesystem(url)
    with tempfile.TemporaryDirectory(prefix="yt8m-upload-") as folder:
        staged = os.path.join(folder, "staged")
        with _file_writer(staged, url, binary, durable=False) as out:
            yield out
        try:
            fs.put_file(staged, remote)
        except Exception as err:  # s3fs and gcsfs raise OSErrors, their HTTP clients errors of their own
            cause = err if isinstance(err, OSError) else OSError(errno.EIO, f"{type(err).__name__}: {err}")
            raise WriteError(url, cause) from err


@contextmanager
def _file_writer(path: str, reported_path: str, binary: bool, durable: bool) -> Iterator[IO]:
    """A new buffered file at `path` whose write failures raise WriteError naming `reported_path`; flushed (and
    fsynced when `durable`) and closed when the block ends. On any failure it is closed and removed."""
    raw = _RawFile(path, reported_path)
    buffered = io.BufferedWriter(raw, _BUFFER_BYTES)
    out = buffered if binary else io.TextIOWrapper(buffered, encoding="utf-8", newline="")
    try:
        yield out
        out.flush()
        if durable:
            raw.sync()
        out.close()
    except BaseException as err:
        _discard(raw, out)
        _remove_quietly(path)
        if raw.error is not None and err is not raw.error:
            raise raw.error from err
        raise


def write_file_atomically(path: str, write: Callable[[TextIO], T]) -> T:
    """Run `write(out)` into `path` through `atomic_writer` (text, UTF-8); returns its result."""
    with atomic_writer(path) as out:
        return write(cast(TextIO, out))  # a writer in text mode


def copy_file_atomically(source: str, destination: str) -> None:
    """Copy a file, either of them local or a URL; `destination` appears only whole (atomic_writer)."""
    with storage.open_file(source, "rb") as src, atomic_writer(destination, binary=True) as out:
        shutil.copyfileobj(src, out, _BUFFER_BYTES)


def sync_directory(directory: str) -> None:
    """Make the directory's entries (a rename, a new file) durable, where the OS allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # Windows, or a directory that cannot be opened: nothing more can be done
        return
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):  # filesystems without directory fsync
            raise WriteError(directory, err) from err
    finally:
        os.close(fd)


def remove_temporaries(directory: str) -> list[str]:
    """Remove what writers killed mid-write left in `directory` (files and folders named by
    `temporary_path`); only safe where no other writer can be at work. Returns the removed paths. Object storage
    has none: uploads leave no temporary objects."""
    if not storage.is_local(directory) or not os.path.isdir(directory):
        return []
    removed = []
    for name in sorted(os.listdir(directory)):
        if is_temporary(name):
            path = os.path.join(directory, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                _remove_quietly(path)
            removed.append(path)
    return removed


def _discard(raw: _RawFile, out: IO) -> None:
    """Close a failed write without flushing what is still buffered: its first error is the one reported."""
    for stream in (raw, out):
        try:
            stream.close()
        except (OSError, ValueError):  # ValueError: the buffer's flush into the closed raw file
            pass


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass

"""Reading a file on object storage (s3://, gs://, any fsspec URL) with a deadline on every read and retries, so
that a stalled connection ends in one line (file, offset, seconds waited) instead of a hang.

$YT8M_READ_TIMEOUT_SECS (default 120) bounds each read (opening included); $YT8M_READ_RETRIES (default 3) more
attempts reopen the file at the offset reached. A local path is opened as it is.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import IO, Any, Callable, Optional, TypeVar, Union

from yt8m.io.storage import StorageError, filesystem, is_local, reaching

log = logging.getLogger("yt8m")
T = TypeVar("T")
TIMEOUT_ENV, RETRIES_ENV = "YT8M_READ_TIMEOUT_SECS", "YT8M_READ_RETRIES"
DEFAULT_TIMEOUT_SECS, DEFAULT_RETRIES = 120.0, 3


class StalledRead(StorageError):
    """Object storage sent nothing within the deadline, on every attempt: names the file, offset and time waited."""


def open_for_reading(path: str, size: Optional[int] = None) -> Union[IO[bytes], "DeadlineFile"]:
    """`path` opened for binary reading: a local file as it is, a URL as a DeadlineFile; use as a context manager.
    `size`, where a listing gave it, spares the store a request to size the object (fsspec's `size=`)."""
    if is_local(path):
        return open(path, "rb")
    return DeadlineFile(path, _setting(TIMEOUT_ENV, DEFAULT_TIMEOUT_SECS), int(_setting(RETRIES_ENV, DEFAULT_RETRIES)),
                        size)


def _setting(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number < 0:
        raise ValueError(f"${name} must be a number >= 0, not {value!r}")
    return number


class DeadlineFile:
    """A remote file whose every read runs in a thread of its own and is waited for at most `timeout` seconds; a
    read past it is abandoned (its thread holds only its own copy of the data) and retried on the file reopened at
    the same offset."""

    def __init__(self, path: str, timeout: float, retries: int, size: Optional[int] = None):
        self.path, self.timeout, self.retries, self.size = path, timeout, retries, size
        self.offset = 0
        self._file: Optional[Any] = None

    def read(self, size: int = -1, /) -> bytes:
        data = self._within_deadline(lambda file: file.read(size))
        self.offset += len(data)
        return data

    def readinto(self, view: memoryview, /) -> int:
        # Read as bytes, copied here: an abandoned read must never write into the caller's buffer later.
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0, /) -> int:
        self.offset = self._within_deadline(lambda file: file.seek(offset, whence))
        return self.offset

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()

    def __enter__(self) -> "DeadlineFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _within_deadline(self, operation: Callable[[Any], T]) -> T:
        attempts = self.retries + 1
        for attempt in range(1, attempts + 1):
            done, result = _run_for(self.timeout, functools.partial(self._attempt, self._file, operation))
            if done:
                self._file = result[0]  # set here, never by a thread that may have been abandoned
                return result[1]
            self._file = None  # left to its stalled thread
            if attempt < attempts:
                log.warning("%s: no data for %g s reading at byte offset %d; reopening it (retry %d of %d)",
                            self.path, self.timeout, self.offset, attempt, self.retries)
        raise StalledRead(f"{self.path}: object storage sent no data for {self.timeout * attempts:g} s reading at byte "
                          f"offset {self.offset} ({attempts} attempt(s) of {self.timeout:g} s; ${TIMEOUT_ENV} and "
                          f"${RETRIES_ENV} set them)")

    def _attempt(self, current: Optional[Any], operation: Callable[[Any], T]) -> tuple[Any, T]:
        """The file (opened here, in the thread, when there is none: opening may stall too) and what `operation`
        on it gave."""
        file = current if current is not None else self._open()
        return file, operation(file)

    def _open(self) -> Any:
        fs, inner = filesystem(self.path)
        with reaching(self.path):
            file = fs.open(inner, "rb", **({"size": self.size} if self.size is not None else {}))
            if self.size is not None and getattr(file, "_details", False) is None:
                # fsspec's buffered files ask the store for their details (a HEAD) at the first read, for the
                # size the listing gave already: what they know is enough.
                file.details = {"name": inner, "size": self.size, "type": "file"}
            file.seek(self.offset)
        return file


def _run_for(seconds: float, work: Callable[[], T]) -> tuple[bool, Any]:
    """(True, work()) when it finished within `seconds` (its exception raised here), else (False, None); a daemon
    thread runs it, so that one left stalled never holds up the process's exit."""
    outcome: list[Any] = []
    finished = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, work()))
        except BaseException as err:  # handed to the waiting thread, raised there
            outcome.append((False, err))
        finished.set()

    threading.Thread(target=run, name="yt8m-remote-read", daemon=True).start()
    if not finished.wait(seconds):
        return False, None
    ok, value = outcome[0]
    if not ok:
        raise value
    return True, value

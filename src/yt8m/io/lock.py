"""The train-dir lock: one `yt8m train` writes a train dir at a time, through an OS file lock.

The OS releases the lock when its holder dies, so a killed run never leaves a stale lock behind.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from datetime import datetime
from typing import Any, Optional

from yt8m.io.checkpoints import EXPORT_DIR, checkpoint_dir
from yt8m.io.files import remove_temporaries

LOCK_FILE = ".yt8m-train.lock"
# A probe (`train_dir_holder`) holds a shared lock for microseconds: a trainer starting at that moment retries.
_ATTEMPTS = 10
_RETRY_SECS = 0.05

log = logging.getLogger(__name__)

# Descriptors of the locks this process holds. A forked child (a DataLoader worker) closes its copies, so that
# when the holder is killed the lock goes with it, not when the last worker notices and exits.
_held: set[int] = set()


def _close_inherited_locks() -> None:
    for fd in _held:
        os.close(fd)  # not LOCK_UN: that would release the parent's lock
    _held.clear()


os.register_at_fork(after_in_child=_close_inherited_locks)


class TrainDirInUse(OSError):
    """Another process holds the train dir's lock. The `yt8m` command prints it as one line."""


def lock_path(train_dir: str) -> str:
    return os.path.join(train_dir, LOCK_FILE)


class TrainDirLock:
    """An exclusive lock on a train dir (`fcntl.flock` on <train_dir>/.yt8m-train.lock), held until
    `release()`, the end of the `with` block or the process's death.

    The holder writes its host, pid and start time into the lock file, for the error a second trainer
    gets, and, as the only writer of checkpoints/ and export/, removes what a killed writer left
    half-written there.
    """

    def __init__(self, train_dir: str) -> None:
        self.train_dir = train_dir
        self.path = lock_path(train_dir)
        self._fd: Optional[int] = None

    def acquire(self) -> "TrainDirLock":
        """Take the lock or raise TrainDirInUse naming the holder."""
        if self._fd is not None:
            return self
        os.makedirs(self.train_dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            if not _try_lock(fd, fcntl.LOCK_EX, _ATTEMPTS):
                raise TrainDirInUse(f"train dir {self.train_dir} is in use by another `yt8m train` "
                                    f"({describe_holder(_read_holder(fd))})")
            _write_holder(fd)
        except BaseException:
            os.close(fd)  # closing the descriptor also releases a lock taken on it
            raise
        self._fd = fd
        _held.add(fd)
        self._remove_unfinished_writes()
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            _held.discard(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)  # even if a child forked outside Python still has the descriptor
            os.close(fd)

    def __enter__(self) -> "TrainDirLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _remove_unfinished_writes(self) -> None:
        export = os.path.join(self.train_dir, EXPORT_DIR)
        # Not the train dir itself: a `predict --output_file` may be writing there.
        folders = [checkpoint_dir(self.train_dir), export,
                   *(os.path.join(export, kind) for kind in ("best", "latest"))]
        for path in (removed for folder in folders for removed in remove_temporaries(folder)):
            log.info("removed %s, left unfinished by a killed writer", path)


def train_dir_holder(train_dir: str) -> Optional[dict[str, Any]]:
    """The identity (host, pid, since) of the process holding the train dir's lock, or None when none does.

    Probes with a non-blocking shared lock, released at once; writes nothing.
    """
    try:
        fd = os.open(lock_path(train_dir), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if _try_lock(fd, fcntl.LOCK_SH, 1):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return _read_holder(fd)
    finally:
        os.close(fd)


def describe_holder(holder: dict[str, Any]) -> str:
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, since {holder.get('since', '?')}"


def _try_lock(fd: int, kind: int, attempts: int) -> bool:
    for attempt in range(attempts):
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            if attempt + 1 < attempts:
                time.sleep(_RETRY_SECS)
            continue
        return True
    return False


def _write_holder(fd: int) -> None:
    identity = {"host": socket.gethostname(), "pid": os.getpid(),
                "since": datetime.now().astimezone().isoformat(timespec="seconds")}
    data = (json.dumps(identity) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _read_holder(fd: int) -> dict[str, Any]:
    """The holder's identity; a holder that has just taken the lock may not have written it yet."""
    for _ in range(_ATTEMPTS):
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        try:
            holder = json.loads(text)
        except ValueError:
            time.sleep(_RETRY_SECS)
            continue
        if isinstance(holder, dict):
            return holder
    return {}

"""Temporary files that keep eval, predict and score in memory bounded whatever the number of videos: sorted runs of
records merged back in key order, and SQLite tables of rows keyed by a unique id.

Both live in a fresh directory under the system's temporary folder (`TMPDIR`), removed when closed; one left by a
process that was killed (SIGTERM, kill -9) is removed by the next that makes one (ScratchFolder).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import sqlite3
import tempfile
import time
import weakref
from typing import Callable, Iterable, Iterator, NamedTuple, Optional, Sequence, TypeVar

import numpy as np

log = logging.getLogger(__name__)

# Records read from each run file per step of a merge.
MERGE_BLOCK = 1 << 16
_INSERT_BATCH = 10_000
# Keys per SELECT ... IN (...): below SQLite's oldest bound-parameter limit, 999.
_LOOKUP_BATCH = 900
# SQLite's page cache per connection (negative: KiB); its memory does not grow with the table.
_SQLITE_CACHE_KIB = 32 << 10
# A scratch folder's lock file: locked (flock) as long as its process lives.
_IN_USE = ".in-use"
# A scratch folder without a lock file is one being made, or one an older yt8m left: removed once this old.
_UNLOCKED_STALE_SECS = 3600.0
T = TypeVar("T")


class ScratchFolder:
    """A fresh folder `<prefix>XXXXXXXX` under the temporary folder, holding a lock file that its process keeps
    locked (flock: the OS drops the lock when the process dies, however it dies). Making one first removes the
    folders of the same prefix whose lock is free, left by killed processes; a running one's is never free. Removed
    by `cleanup()`, at garbage collection or at exit, as tempfile.TemporaryDirectory is."""

    def __init__(self, prefix: str) -> None:
        remove_abandoned_scratch(prefix)
        self.name = tempfile.mkdtemp(prefix=prefix)
        fd = os.open(os.path.join(self.name, _IN_USE), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._finalizer = weakref.finalize(self, _remove_scratch, self.name, fd)

    def cleanup(self) -> None:
        self._finalizer()


def _remove_scratch(folder: str, lock_fd: int) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    os.close(lock_fd)


def remove_abandoned_scratch(prefix: str) -> list[str]:
    """Remove the scratch folders `<prefix>*` of the temporary folder that no living process holds; returns them."""
    root = tempfile.gettempdir()
    removed = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.startswith(prefix) and os.path.isdir(path) and not os.path.islink(path) and _is_abandoned(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            log.info("removed %s, left by a yt8m process that was killed", path)
    return removed


def _is_abandoned(folder: str) -> bool:
    try:
        fd = os.open(os.path.join(folder, _IN_USE), os.O_RDWR)
    except FileNotFoundError:
        try:
            return time.time() - os.stat(folder).st_mtime > _UNLOCKED_STALE_SECS
        except FileNotFoundError:
            return False  # removed meanwhile
    except OSError:
        return False  # another user's
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


class SortedRuns:
    """Runs of records (a numpy structured dtype whose unique uint64 field "key" orders them), each sorted by key and
    written to its own file; `merged` reads them back as one sequence in key order, a block at a time."""

    def __init__(self, dtype: np.dtype, prefix: str = "yt8m-runs-"):
        self.dtype = np.dtype(dtype)
        self._prefix = prefix
        self._folder: Optional[ScratchFolder] = None
        self._paths: list[str] = []

    def __len__(self) -> int:
        return len(self._paths)

    def add(self, records: np.ndarray) -> None:
        """Write one run: `records` must be sorted by key."""
        self.add_blocks([records])

    def add_blocks(self, blocks: Iterable[np.ndarray]) -> None:
        """Write one run given a block at a time (in memory one block at a time): together sorted by key."""
        if self._folder is None:
            self._folder = ScratchFolder(self._prefix)
        path = os.path.join(self._folder.name, f"run-{len(self._paths):06d}.bin")
        with open(path, "wb") as out:
            for records in blocks:
                records.astype(self.dtype, copy=False).tofile(out)
        self._paths.append(path)

    def merged(self, in_memory: Optional[np.ndarray] = None) -> Iterator[np.ndarray]:
        """Every record of the runs (and of `in_memory`, sorted by key, not written) in key order, in blocks.

        Each run holds at most MERGE_BLOCK records in memory at a time: a block is cut at the smallest last key that
        a run not yet read to its end holds, so that nothing after it can sort before what is handed out.
        """
        block = MERGE_BLOCK
        files = [open(path, "rb") for path in self._paths]
        try:
            sources = [_RunReader(fh, self.dtype, block) for fh in files]
            if in_memory is not None and len(in_memory):
                sources.append(_RunReader(None, self.dtype, block, in_memory))
            while sources:
                bounds = [source.last_key for source in sources if not source.at_end]
                bound = min(bounds) if bounds else None
                pieces = [source.take_through(bound) for source in sources]
                pieces = [piece for piece in pieces if len(piece)]
                sources = [source for source in sources if source.refill()]
                if len(pieces) == 1:
                    yield pieces[0]
                elif pieces:
                    merged = np.concatenate(pieces)
                    # Stable sort: timsort merges the already sorted pieces.
                    yield merged[np.argsort(merged["key"], kind="stable")]
        finally:
            for fh in files:
                fh.close()

    def close(self) -> None:
        """Remove the run files (also done when the object is garbage collected)."""
        if self._folder is not None:
            self._folder.cleanup()
        self._folder, self._paths = None, []


class _RunReader:
    """The unread part of one sorted run, held a block at a time."""

    def __init__(self, fh, dtype: np.dtype, block: int, records: Optional[np.ndarray] = None):
        self.fh, self.dtype, self.block = fh, dtype, block
        self.rest = records  # in memory: the whole run, handed out by slices
        self.buffer = np.empty(0, dtype)
        self.at_end = False
        self.refill()

    @property
    def last_key(self) -> np.uint64:
        return self.buffer["key"][-1]

    def take_through(self, bound: Optional[np.uint64]) -> np.ndarray:
        """The buffered records with a key <= bound (all without a bound)."""
        # The bound stays a NumPy uint64: searchsorted would compare a Python int as a float64, inexact above 2**53.
        cut = len(self.buffer) if bound is None else int(np.searchsorted(self.buffer["key"], bound, side="right"))
        taken, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return taken

    def refill(self) -> bool:
        """Read the next block once the buffer is empty; False when the run is used up."""
        if len(self.buffer) == 0 and not self.at_end:
            if self.rest is not None:
                self.buffer, self.rest = self.rest[:self.block], self.rest[self.block:]
            else:
                self.buffer = np.fromfile(self.fh, self.dtype, count=self.block)
            self.at_end = len(self.buffer) < self.block or (self.rest is not None and len(self.rest) == 0)
        return len(self.buffer) > 0


class Duplicate(NamedTuple):
    """A key added twice: the line it was first added with and the line of the second time."""
    key: str
    first_line: int
    line: int


class TemporaryDatabase:
    """A SQLite database in a temporary directory, for tables larger than memory; removed by `close()`."""

    def __init__(self):
        self._folder = ScratchFolder("yt8m-db-")
        self.connection = sqlite3.connect(os.path.join(self._folder.name, "rows.sqlite"))
        # A scratch file: nothing to recover after a crash, so no journal and no syncs.
        self.connection.executescript(f"PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; "
                                      f"PRAGMA cache_size = -{_SQLITE_CACHE_KIB};")

    def close(self) -> None:
        self.connection.close()
        self._folder.cleanup()

    def __enter__(self) -> "TemporaryDatabase":
        return self

    def __exit__(self, kind: Optional[type], error: Optional[BaseException], traceback: object) -> None:
        folder = self._folder.name
        self.close()
        if isinstance(error, sqlite3.OperationalError):  # a full disk, a file size limit, an I/O error
            raise OSError(f"the temporary database in {folder} failed: {error} (is {tempfile.gettempdir()} full? "
                          f"TMPDIR chooses where it goes)") from error


class KeyedTable:
    """A table of rows `(key, line, *payload)` of a TemporaryDatabase, each key at most once, in insertion order."""

    def __init__(self, database: TemporaryDatabase, name: str, payload: Sequence[str] = ()):
        self.name = name
        self._db = database.connection
        columns = "".join(f", {column}" for column in payload)
        self._db.execute(f"CREATE TABLE {name} (line INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE{columns})")
        self._insert = f"INSERT INTO {name} VALUES (?, ?{', ?' * len(payload)})"
        self._pending: list[tuple] = []

    def add(self, key: str, line: int, *payload: object) -> Optional[Duplicate]:
        """Queue a row (lines must increase); inserts a batch at a time. Returns the first duplicate found, if any."""
        self._pending.append((line, key, *payload))
        return self.flush() if len(self._pending) >= _INSERT_BATCH else None

    def add_many(self, keys: Sequence[str], first_line: int) -> Optional[Duplicate]:
        """Rows of keys only, on consecutive lines from `first_line`; inserted at once."""
        self._pending.extend(zip(range(first_line, first_line + len(keys)), keys))
        return self.flush()

    def flush(self) -> Optional[Duplicate]:
        """Insert the queued rows; on a duplicate key, return the first one (in line order) and insert nothing more."""
        rows, self._pending = self._pending, []
        try:
            with self._db:
                self._db.executemany(self._insert, rows)
            return None
        except sqlite3.IntegrityError:
            pass
        with self._db:  # the batch was rolled back: replay it row by row up to its first duplicate
            for row in rows:
                first = self.line_of(row[1])
                if first is not None:
                    return Duplicate(row[1], first, row[0])
                self._db.execute(self._insert, row)
        return None

    def rows_of(self, keys: Sequence[str]) -> dict[str, tuple]:
        """The payload of each of `keys` the table holds (queued rows are flushed first); keys it lacks are absent."""
        self.flush()
        found: dict[str, tuple] = {}
        for start in range(0, len(keys), _LOOKUP_BATCH):
            chunk = list(keys[start:start + _LOOKUP_BATCH])
            query = f"SELECT * FROM {self.name} WHERE key IN ({', '.join('?' * len(chunk))})"
            found.update((row[1], row[2:]) for row in self._db.execute(query, chunk))
        return found

    def line_of(self, key: str) -> Optional[int]:
        found = self._db.execute(f"SELECT line FROM {self.name} WHERE key = ?", (key,)).fetchone()
        return None if found is None else found[0]

    def __len__(self) -> int:
        return self._db.execute(f"SELECT COUNT(*) FROM {self.name}").fetchone()[0]

    def keys(self) -> Iterator[str]:
        """The keys in line order."""
        return (key for (key,) in self._db.execute(f"SELECT key FROM {self.name} ORDER BY line"))

    def payload_of(self, key: str) -> Optional[tuple]:
        """The payload columns stored with `key`, or None when the table lacks it (rows still queued are not seen)."""
        row = self._db.execute(f"SELECT * FROM {self.name} WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[2:]


def add_unique(table: KeyedTable, items: Iterable[T], row: Callable[[T], tuple],
               duplicate_error: Callable[[Duplicate], Exception]) -> Iterator[T]:
    """Pass `items` on, adding `row(item)` (key, line, *payload) of each to `table`; a key seen before raises
    `duplicate_error(the first duplicate)`. Keys are checked a batch at a time, so an error raised while reading the
    items or making a row gives way to a duplicate on an earlier line: the first problem in line order is raised."""
    try:
        for item in items:
            duplicate = table.add(*row(item))
            if duplicate is not None:
                raise duplicate_error(duplicate)
            yield item
    except Exception:
        duplicate = table.flush()
        if duplicate is not None:
            raise duplicate_error(duplicate) from None
        raise
    duplicate = table.flush()
    if duplicate is not None:
        raise duplicate_error(duplicate)

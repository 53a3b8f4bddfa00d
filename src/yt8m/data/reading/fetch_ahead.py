"""A reader's shards fetched ahead of its decoding, so that an object store's latency is paid in parallel, not shard
after shard (tf.data's parallel interleave): small shards whole, several at once; a large one in chunks a thread reads
while the earlier ones are decoded. Both within a bound of bytes; local shards are read as they are."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import io
import queue
import threading
from typing import Any, Iterator, Optional, Sequence

from yt8m.data.reading.read_plan import ReaderShare
from yt8m.data.reading.read_stats import ReadCounter
from yt8m.io import storage
from yt8m.io.remote_reads import open_for_reading

# A shard at most this large is fetched whole ahead of its turn: this many bytes and shards at most in flight, in this
# many threads. A store answers a request in tens of ms: 16 at a time keep a reader of 4-video shards busy where one
# at a time waited on each (bench/bench_release_scale.py).
WHOLE_SHARD_BYTES = 16 << 20
AHEAD_BYTES = 64 << 20
AHEAD_SHARDS = 256
FETCH_THREADS = 16
# A larger shard is read by a thread of its own in chunks of this size, at most this many ahead of the decoding.
CHUNK_BYTES = 8 << 20
CHUNKS_AHEAD = 4
_PUT_WAIT_SECS = 0.1  # how often a chunk reader waiting for room looks whether its file was closed


class ShardFetcher:
    """Opens a reader's shares' files in their order: each remote one of a known size up to WHOLE_SHARD_BYTES
    fetched whole by a pool of threads ahead of its turn, any other remote one read ahead in chunks once opened, a
    local one as it is. Each file opened is counted in `counter`'s read stats (files_opened)."""

    def __init__(self, shares: Sequence[ReaderShare], counter: ReadCounter):
        self._queue = collections.deque(share for share in shares if _fetched_whole(share))
        self._fetches: dict[str, concurrent.futures.Future] = {}
        self._ahead_bytes = 0
        self._lock = threading.Lock()
        self._pool = (concurrent.futures.ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="yt8m-fetch")
                      if self._queue else None)
        self.counter = counter
        self._schedule()

    def open(self, share: ReaderShare) -> contextlib.AbstractContextManager[Any]:
        """The share's file, as yt8m.data.format.tfrecord reads it (a context manager of a readable file)."""
        self.counter.unsent.files_opened += 1
        fetch = self._fetches.pop(share.path, None)
        if fetch is None:
            if storage.is_local(share.path):
                return open_for_reading(share.path)
            return _read_ahead(share)
        data = fetch.result()  # a failed fetch raises here, as opening the file would have
        with self._lock:
            self._ahead_bytes -= len(data)
        self._schedule()
        return contextlib.nullcontext(io.BytesIO(data))

    def close(self) -> None:
        """Stop fetching: a reader that ends early (its epoch cut short) leaves nothing running."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _schedule(self) -> None:
        """Start fetching the next shares, within the bounds of bytes and shards ahead (one at least)."""
        if self._pool is None:
            return
        with self._lock:
            while self._queue and len(self._fetches) < AHEAD_SHARDS and (
                    not self._fetches or self._ahead_bytes + (self._queue[0].size or 0) <= AHEAD_BYTES):
                share = self._queue.popleft()
                self._ahead_bytes += share.size or 0
                self._fetches[share.path] = self._pool.submit(_fetch_whole, share)


def _fetched_whole(share: ReaderShare) -> bool:
    return not storage.is_local(share.path) and share.size is not None and share.size <= WHOLE_SHARD_BYTES


def _fetch_whole(share: ReaderShare) -> bytes:
    with open_for_reading(share.path, share.size) as file:
        return file.read()


@contextlib.contextmanager
def _read_ahead(share: ReaderShare) -> Iterator["ReadAheadFile"]:
    with open_for_reading(share.path, share.size) as file:
        ahead = ReadAheadFile(file)
        try:
            yield ahead
        finally:
            ahead.close()


class ReadAheadFile:
    """A file read ahead by a thread of its own, CHUNK_BYTES at a time, at most CHUNKS_AHEAD chunks ahead of its
    reader: what yt8m.data.format.tfrecord uses of a file (read, readinto, and a seek back within the chunk being
    read: the GZIP check's). The thread's read error is raised in the reader, where the read would have failed."""

    def __init__(self, file: Any):
        self._chunks: queue.Queue = queue.Queue(CHUNKS_AHEAD)
        self._closed = threading.Event()
        self._current, self._pos = memoryview(b""), 0
        self._taken, self._at_end = 0, False  # chunks taken from the queue; the file's end reached
        self._thread = threading.Thread(target=self._fill, args=(file,), name="yt8m-read-ahead", daemon=True)
        self._thread.start()

    def read(self, size: int = -1, /) -> bytes:
        parts = []
        while size != 0 and self._more():
            end = len(self._current) if size < 0 else min(len(self._current), self._pos + size)
            parts.append(bytes(self._current[self._pos:end]))
            size -= (end - self._pos) if size > 0 else 0
            self._pos = end
        return b"".join(parts)

    def readinto(self, view: memoryview, /) -> int:
        if not self._more():
            return 0
        take = min(len(view), len(self._current) - self._pos)
        view[:take] = self._current[self._pos:self._pos + take]
        self._pos += take
        return take

    def seek(self, offset: int, whence: int = 0, /) -> int:
        if whence != 0 or self._taken > 1 or not 0 <= offset <= len(self._current):
            raise OSError("a file read ahead seeks only back within its first chunk")
        self._pos = offset
        return offset

    def close(self) -> None:
        self._closed.set()

    def _more(self) -> bool:
        """Whether bytes are left to hand out: the current chunk's, else the next chunk's (waited for)."""
        if self._pos < len(self._current):
            return True
        if self._at_end:
            return False
        item = self._chunks.get()
        if isinstance(item, BaseException):
            raise item
        self._taken += 1
        self._current, self._pos, self._at_end = memoryview(item), 0, not item
        return bool(item)

    def _fill(self, file: Any) -> None:
        try:
            while not self._closed.is_set():
                chunk = file.read(CHUNK_BYTES)
                if not self._put(chunk) or not chunk:
                    return
        except BaseException as err:  # handed to the reading thread, raised there
            self._put(err)

    def _put(self, item: Optional[bytes | BaseException]) -> bool:
        while not self._closed.is_set():
            try:
                self._chunks.put(item, timeout=_PUT_WAIT_SECS)
                return True
            except queue.Full:
                continue
        return False

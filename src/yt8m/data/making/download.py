"""Download YouTube-8M partitions by the dataset's own protocol (a plan of file names and MD5s, files from a mirror,
`shard=i,N`): resumable through the plan's local copy, every file verified by MD5, retried, several at a time.

The official downloader (http://data.yt8m.org/download.py) fetches
`<host>/<version>/download_plans/<kind>_<split>.json`, a JSON object whose "files" maps each file name to its MD5,
keeps it in the current folder as `<version>_<kind>_<split>_download_plan.json` and deletes each file from it once
downloaded and verified; a file `<prefix><two letters>.<ext>` is stored as
`<prefix><4-digit index of the letters>.<ext>`. This module keeps all of that, so a download started by either one
can be finished by the other.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import http.client
import json
import logging
import os
import socket
import string
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterator, Optional, Sequence, TypeVar

from tqdm import tqdm

from yt8m.fields import quoted
from yt8m.io.files import (
    NAME_MAX_BYTES,
    WriteError,
    atomic_writer,
    temporary_owner,
    temporary_stem,
    write_file_atomically,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

OFFICIAL_HOST = "data.yt8m.org"
MIRRORS = ("us", "eu", "asia")
KINDS = ("video", "frame", "video_level", "frame_level")
SPLITS = ("train", "validate", "test")
# The official file ids: all pairs of these characters, in this order (aa=0, ab=1, ..., 99=3843).
_ID_CHARACTERS = string.ascii_lowercase + string.ascii_uppercase + string.digits
_CHUNK_BYTES = 1 << 20
_MAX_WAIT_SECS = 60.0
_MD5_HEX_DIGITS = 32
# The official plans are a few hundred KB: a larger answer is not a plan (and must not fill the memory).
_MAX_PLAN_BYTES = 64 << 20
# The local copy of the plan is rewritten from its log of files done at least this often, so that a run killed and
# resumed with the official downloader (which reads the copy only) fetches at most this long's files again.
_COMPACT_EVERY_SECS = 60.0
DONE_LOG_SUFFIX = ".done"


class DownloadError(OSError):
    """A file (or the plan) could not be downloaded: names it, its URL and the cause. Printed as one line."""


class PlanError(ValueError):
    """The plan is not one: not JSON, no "files" mapping, a name that is not a plain file name, a bad MD5."""


class _ChecksumMismatch(Exception):
    """The bytes received do not have the plan's MD5 (retried: the next attempt may be right)."""


class _ShortBody(http.client.HTTPException):
    """The connection closed before the Content-Length announced was received (retried)."""


class _WrongSize(http.client.HTTPException):
    """The server announces or sends another number of bytes than the plan's size (retried)."""


class _TooSlow(TimeoutError):
    """The transfer received fewer than --min_bytes_per_sec over a --timeout_secs window (retried)."""


class _Cancelled(Exception):
    """The run is stopping (an interrupt, a full disk): downloads in flight end, their temporary files removed."""


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts after the first (`retries`), the wait before the first retry (doubled for each next one, at most a
    minute), the socket timeout, and the least rate a transfer must keep: fewer than `min_bytes_per_sec` over any
    window of `timeout_secs` (headers included) is a timeout too, since a server that sends a byte a second is never
    timed out by the socket. Connection resets, timeouts, HTTP 5xx and MD5 or size mismatches are retried."""

    retries: int = 5
    backoff_secs: float = 1.0
    timeout_secs: float = 60.0
    min_bytes_per_sec: float = 1024.0

    def wait_before(self, retry: int) -> float:
        return min(self.backoff_secs * 2 ** (retry - 1), _MAX_WAIT_SECS)


@dataclass(frozen=True)
class Source:
    """Where a partition (`2/video/train`) is served: the official host, files from a mirror (us, eu, asia), or
    `base_url` (a private mirror), which serves both the plan and the files under it, with no mirror prefix."""

    partition: str
    mirror: str = "us"
    base_url: Optional[str] = None

    def __post_init__(self) -> None:
        parts = self.partition.split("/")
        if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in KINDS or parts[2] not in SPLITS:
            raise ValueError(f"--partition {self.partition!r}: expected VERSION/KIND/SPLIT, e.g. 2/video/train "
                             f"(KIND: {', '.join(KINDS)}; SPLIT: {', '.join(SPLITS)})")
        if self.mirror not in MIRRORS:
            raise ValueError(f"--mirror {self.mirror!r}: expected one of {', '.join(MIRRORS)}")

    @property
    def plan_url(self) -> str:
        version, kind, split = self.partition.split("/")
        return f"{self._root(mirror=False)}/{version}/download_plans/{kind}_{split}.json"

    @property
    def plan_filename(self) -> str:
        """The name the official downloader gives the plan's local copy."""
        return f"{self.partition.replace('/', '_')}_download_plan.json"

    def file_url(self, name: str) -> str:
        return f"{self._root(mirror=True)}/{self.partition}/{urllib.parse.quote(name)}"

    def _root(self, mirror: bool) -> str:
        if self.base_url:
            return self.base_url.rstrip("/")
        return f"http://{self.mirror}.{OFFICIAL_HOST}" if mirror else f"http://{OFFICIAL_HOST}"


def parse_shard(text: str) -> tuple[int, int]:
    """`I,N` (1 <= I <= N) as (I, N)."""
    try:
        shard_id, num_shards = (int(part) for part in text.split(","))
    except ValueError:
        shard_id = num_shards = 0
    if not 1 <= shard_id <= num_shards:
        raise ValueError(f"--shard {text!r}: expected I,N with 1 <= I <= N, e.g. 1,100 (the first of 100 parts)")
    return shard_id, num_shards


def in_shard(name: str, shard: tuple[int, int]) -> bool:
    """The official rule: the MD5 of the file's name, as a number, modulo N is I - 1."""
    shard_id, num_shards = shard
    return int(hashlib.md5(name.encode("utf-8")).hexdigest(), 16) % num_shards == shard_id - 1


def local_name(name: str) -> str:
    """The name the official downloader stores a plan file under (validateaB.tfrecord -> validate0001.tfrecord);
    a name not of that form is kept."""
    parts = name.split(".")
    if len(parts) != 2 or len(parts[0]) < 2 or any(c not in _ID_CHARACTERS for c in parts[0][-2:]):
        return name
    stem, extension = parts
    index = _ID_CHARACTERS.index(stem[-2]) * len(_ID_CHARACTERS) + _ID_CHARACTERS.index(stem[-1])
    return f"{stem[:-2]}{index:04d}.{extension}"


def parse_plan(text: bytes, origin: str) -> dict[str, Any]:
    """The plan as read from `origin` (a URL or path), checked: {"files": {name: md5}, optionally "sizes": {name:
    bytes}, anything else kept as is}."""
    try:
        plan = json.loads(text)
    except RecursionError:  # json's parser recurses once per nesting level: "[" * 200_000
        raise PlanError(f"{origin} is not a download plan: JSON nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        raise PlanError(f"{origin} is not a download plan: {err}") from err
    files = plan.get("files") if isinstance(plan, dict) else None
    if not isinstance(files, dict):
        raise PlanError(f'{origin} is not a download plan: no "files" object mapping file names to MD5s')
    for name, md5 in files.items():
        if not _is_plain_file_name(name):
            raise PlanError(f"{origin}: {quoted(name)} is not a plain file name")
        if len(local_name(name).encode()) > NAME_MAX_BYTES:
            raise PlanError(f"{origin}: the file name {quoted(name)} is longer than {NAME_MAX_BYTES} bytes, "
                            "more than file systems take")
        if not (isinstance(md5, str) and len(md5) == _MD5_HEX_DIGITS and all(c in string.hexdigits for c in md5)):
            raise PlanError(f"{origin}: the MD5 of {quoted(name)} is not 32 hex digits: {quoted(md5)}")
    if not isinstance(plan.get("sizes", {}), dict):
        raise PlanError(f'{origin}: "sizes" is not an object mapping file names to bytes')
    return plan


def _is_plain_file_name(name: str) -> bool:
    """No folders, nothing hidden: a name from the network must not write outside the output dir."""
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".") and "\0" not in name


class LocalPlan:
    """The plan's copy in the output dir, what is left to download, and beside it the log of the files done since
    the copy was last rewritten (_DoneLog): a file done costs a line, not a rewrite of the copy, so that a plan of N
    files costs O(N) writes, not O(N^2). The copy is rewritten without the logged files (and the log emptied) once
    the log holds half as many files as are left, at least every minute, and when the run ends; from both as they
    are on the disk, so that downloads of other shards into the same folder keep each other's progress. A re-run,
    even after kill -9, reads both; the official downloader reads the copy, which lists at most the last minute's
    files again."""

    def __init__(self, plan: dict[str, Any], path: Optional[str]) -> None:
        self._plan = plan
        self._path = path
        self._log = _DoneLog(path + DONE_LOG_SUFFIX) if path is not None else None
        self._lock = threading.Lock()
        self._logged = 0
        self._compacted_at = time.monotonic()

    @classmethod
    def read(cls, path: str) -> "LocalPlan":
        """The copy at `path` less the files of its log."""
        plan = _read_plan_file(path)
        _drop(plan, _DoneLog.names(path + DONE_LOG_SUFFIX))
        return cls(plan, path)

    def __len__(self) -> int:
        return len(self._plan["files"])

    def remaining(self, shard: tuple[int, int]) -> list[str]:
        return sorted(name for name in self._plan["files"] if in_shard(name, shard))

    def md5(self, name: str) -> str:
        return self._plan["files"][name].lower()

    def size(self, name: str) -> Optional[int]:
        size = self._plan.get("sizes", {}).get(name)
        return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None

    def mark_done(self, name: str) -> None:
        with self._lock:
            _drop(self._plan, [name])
            if self._log is None:
                return
            with self._log.locked():
                self._log.append(name)
                self._logged += 1
                if self._logged * 2 >= len(self) or \
                        time.monotonic() - self._compacted_at >= _COMPACT_EVERY_SECS:
                    self._compact()

    def close(self) -> None:
        """Rewrite the copy without the files logged and remove the log; where the copy cannot be written (a full
        disk), the log stays, with a warning: the next run reads it."""
        with self._lock:
            if self._log is None or not os.path.exists(self._log.path):
                return
            try:
                with self._log.locked():
                    self._compact()
                    self._log.remove()
            except WriteError as err:
                log.warning("%s; the files done are listed in %s for the next run", err, self._log.path)
            finally:
                self._log.close()

    def _compact(self) -> None:
        """With the log locked: the copy rewritten without the files logged, the log emptied."""
        # called where there is a log, which is made where there is a copy (path)
        assert self._path is not None and self._log is not None, "a plan without a local copy has nothing to compact"
        plan = _read_plan_file(self._path)
        _drop(plan, _DoneLog.names(self._log.path))
        write_file_atomically(self._path, lambda out: json.dump(plan, out))
        self._log.empty()
        self._logged, self._compacted_at = 0, time.monotonic()


class _DoneLog:
    """The log of files done beside a plan's copy (`<copy>.done`): one JSON string a line, appended under an
    exclusive lock (flock) that also guards rewriting the copy from it. Whoever removes the log holds the lock;
    another process holding the file then finds its name gone, or taken by a new file, and opens that."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        while True:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            if self._is_at_path():
                break
            self.close()  # removed by another process meanwhile: closing drops the lock too
        try:
            yield
        finally:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def append(self, name: str) -> None:
        """A line for `name`, on a line of its own after a line a killed writer cut short."""
        line = json.dumps(name).encode() + b"\n"
        fd = self._open_fd()
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        try:
            written = os.write(fd, line)
        except OSError as err:
            raise WriteError(self.path, err) from err
        if written != len(line):  # a full disk part way: the line is cut, and passed over when read
            raise WriteError(self.path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))

    @staticmethod
    def names(path: str) -> list[str]:
        """The names the log at `path` lists; a line cut short by a kill is passed over."""
        try:
            with open(path, "rb") as fh:
                lines = fh.read().splitlines()
        except FileNotFoundError:
            return []
        names = []
        for line in lines:
            try:
                name = json.loads(line)
            except ValueError:
                continue
            if isinstance(name, str):
                names.append(name)
        return names

    def empty(self) -> None:
        try:
            os.ftruncate(self._open_fd(), 0)
        except OSError as err:
            raise WriteError(self.path, err) from err

    def remove(self) -> None:
        os.remove(self.path)
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open_fd(self) -> int:
        """The log's descriptor, which locked() opened: the other methods run inside it."""
        if self._fd is None:
            raise RuntimeError(f"{self.path} is not open: the log is written inside locked()")
        return self._fd

    def _is_at_path(self) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(self._open_fd()).st_ino
        except FileNotFoundError:
            return False


def _read_plan_file(path: str) -> dict[str, Any]:
    with open(path, "rb") as fh:
        return parse_plan(fh.read(), path)


def _drop(plan: dict[str, Any], names: Sequence[str]) -> None:
    for name in names:
        plan["files"].pop(name, None)
        plan.get("sizes", {}).pop(name, None)


def open_plan(source: Source, output_dir: str, policy: RetryPolicy, keep_copy: bool = True) -> LocalPlan:
    """The local copy of the plan if there is one (a re-run continues), else the plan fetched from the source
    (and, with `keep_copy`, saved as the local copy)."""
    path = os.path.join(output_dir, source.plan_filename)
    if os.path.exists(path):
        plan = LocalPlan.read(path)
        log.info("resuming with %s (%d files left in the plan)", path, len(plan))
        return plan
    text = _retrying("the download plan", source.plan_url, policy, threading.Event(),
                     lambda: _read_url(source.plan_url, policy))
    fetched = parse_plan(text, source.plan_url)
    if not keep_copy:
        return LocalPlan(fetched, None)
    with atomic_writer(path, binary=True) as out:
        out.write(text)
    log.info("fetched %s (%d files) into %s", source.plan_url, len(fetched["files"]), path)
    return LocalPlan(fetched, path)


def _read_url(url: str, policy: RetryPolicy) -> bytes:
    """The body of `url`, at most _MAX_PLAN_BYTES, received at --min_bytes_per_sec at least."""
    with _Watch(policy) as watch:
        with _open(url, policy, watch) as response:
            body = bytearray()
            while chunk := response.read(_CHUNK_BYTES):
                watch.received(len(chunk))
                body += chunk
                if len(body) > _MAX_PLAN_BYTES:
                    raise DownloadError(f"{url} is not a download plan: more than {_MAX_PLAN_BYTES >> 20} MiB")
            watch.check()
            return bytes(body)


class _Watch:
    """A watch over one attempt's connections (redirects open more): when they receive fewer than
    `min_bytes_per_sec` over a window of `timeout_secs`, headers included, their sockets are shut down and the
    attempt fails as too slow. The socket timeout alone never ends a transfer that trickles a byte at a time."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._window = policy.timeout_secs
        self._least = policy.min_bytes_per_sec * policy.timeout_secs
        self._sockets: list[socket.socket] = []
        self._count = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="yt8m-download-watch", daemon=True)
        self.cut_off: Optional[str] = None

    def __enter__(self) -> "_Watch":
        if self._least > 0:
            self._thread.start()
        return self

    def __exit__(self, kind: Optional[type], error: Optional[BaseException], traceback: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        if error is not None and not isinstance(error, (_Cancelled, WriteError)):
            self.check()  # a cut-off connection fails in many ways: the cause is the rate

    def connected(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.cut_off:
                _shut_down(sock)

    def received(self, count: int) -> None:
        self._count += count  # only the downloading thread adds; the watch only reads

    def check(self) -> None:
        if self.cut_off:
            raise _TooSlow(self.cut_off)

    def _watch(self) -> None:
        counted = 0
        while not self._done.wait(self._window):
            if self._count - counted < self._least:
                with self._lock:
                    self.cut_off = (f"{self._count - counted} bytes in {self._window:g} s, less than "
                                    f"{self._least / self._window:g} bytes/s (--min_bytes_per_sec)")
                    for sock in self._sockets:
                        _shut_down(sock)
                return
            counted = self._count


def _shut_down(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # the reading thread's recv returns at once
    except OSError:
        pass  # already closed


def _open(url: str, policy: RetryPolicy, watch: _Watch, method: str = "GET") -> http.client.HTTPResponse:
    """urlopen, each connection (the first, and those of redirects) handed to `watch`."""
    opener = urllib.request.build_opener(_watched_handler(urllib.request.HTTPHandler, watch),
                                         _watched_handler(urllib.request.HTTPSHandler, watch))
    return opener.open(urllib.request.Request(url, method=method), timeout=policy.timeout_secs)


def _watched_handler(handler: type, watch: _Watch) -> urllib.request.BaseHandler:
    """An instance of urllib's HTTP(S)Handler whose connections tell `watch` their socket once connected."""
    class Watched(handler):
        def do_open(self, connection_class: type, request: urllib.request.Request, **options: Any) -> Any:
            class Connection(connection_class):
                def connect(self) -> None:
                    super().connect()
                    watch.connected(self.sock)

            return super().do_open(Connection, request, **options)

    return Watched()


def _retrying(what: str, url: str, policy: RetryPolicy, stop: threading.Event, attempt: Callable[[], T]) -> T:
    """`attempt()`, again after a wait while it fails in a way that may pass; a failure that will not pass (HTTP
    404, a full disk) or the last one raises an error naming `what` and its URL."""
    attempts = policy.retries + 1
    for number in range(1, attempts + 1):
        try:
            return attempt()
        except (WriteError, _Cancelled, DownloadError):
            raise
        except (OSError, http.client.HTTPException, _ChecksumMismatch) as err:
            if not _is_transient(err):
                raise DownloadError(f"could not download {what} from {url}: {_describe(err)}") from err
            failure = err
        if number < attempts:
            wait = policy.wait_before(number)
            log.warning("%s: %s; retry %d of %d in %.1f s", what, _describe(failure), number, policy.retries, wait)
            if stop.wait(wait):
                raise _Cancelled()
    raise DownloadError(f"could not download {what} from {url}: {_describe(failure)} "
                        f"(after {attempts} attempt{'s' if attempts > 1 else ''})") from failure


def _is_transient(err: BaseException) -> bool:
    if isinstance(err, urllib.error.HTTPError):
        return err.code >= 500 or err.code in (408, 429)  # server trouble, a request timeout, too many requests
    if isinstance(err, urllib.error.URLError) and isinstance(err.reason, BaseException):
        err = err.reason
    return isinstance(err, (ConnectionError, TimeoutError, http.client.HTTPException, _ChecksumMismatch))


def _describe(err: BaseException) -> str:
    if isinstance(err, urllib.error.HTTPError):
        reason = str(err.reason).splitlines()  # a redirect loop's has three lines: the first tells
        return " ".join([f"HTTP {err.code}", *reason[:1]])
    if isinstance(err, urllib.error.URLError):
        return _describe(err.reason) if isinstance(err.reason, BaseException) else str(err.reason)
    if isinstance(err, http.client.IncompleteRead):
        return f"the connection closed after {len(err.partial)} bytes, {err.expected} more expected"
    if isinstance(err, _TooSlow):
        return f"timed out: {err}"
    if isinstance(err, TimeoutError):
        return "timed out"
    return str(err) or type(err).__name__


class _Progress:
    """One bar of bytes (rate, ETA) over a run's downloads, written to stderr where it is a terminal. Its total is
    the plan's sizes where it has them, else estimated from the sizes announced by the server so far."""

    def __init__(self, files: int, total_bytes: Optional[int]) -> None:
        self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="yt8m download",
                         file=sys.stderr, disable=not sys.stderr.isatty())
        self._files = files
        self._estimate = total_bytes is None
        self._announced: dict[str, int] = {}
        self._lock = threading.Lock()

    def announce(self, name: str, size: Optional[int]) -> None:
        if not self._estimate or size is None:
            return
        with self._lock:
            self._announced[name] = size
            self._bar.total = round(sum(self._announced.values()) / len(self._announced) * self._files)
            self._bar.refresh()

    def advance(self, count: int) -> None:
        with self._lock:
            self._bar.update(count)

    def close(self) -> None:
        self._bar.close()


@dataclass
class DownloadResult:
    """What a run did: `summary` is the JSON line the command prints; `errors` the failures, one per file."""

    summary: dict[str, Any]
    errors: list[OSError] = field(default_factory=list)

    def error(self) -> Optional[OSError]:
        """One error naming every failed file, or None."""
        if len(self.errors) <= 1:
            return self.errors[0] if self.errors else None
        return DownloadError(f"{len(self.errors)} files failed (left in the local plan for a re-run): "
                             + "; ".join(str(err) for err in self.errors))


def download(source: Source, output_dir: str, shard: tuple[int, int] = (1, 1), parallel: int = 4,
             policy: RetryPolicy = RetryPolicy()) -> DownloadResult:
    """Download the files of the plan's shard `shard` not yet in `output_dir` (a re-run continues), `parallel` at
    a time. A file that fails is reported in the result and stays in the local plan; a full disk stops the run."""
    started = time.monotonic()
    os.makedirs(output_dir, exist_ok=True)
    plan = open_plan(source, output_dir, policy)
    names = plan.remaining(shard)
    _remove_abandoned_temporaries(output_dir, {local_name(name) for name in names})
    stop = threading.Event()
    # Twice as many threads as connections: a thread that has all of a file's bytes gives its connection to the
    # next file while it syncs the file to the disk and renames it (--parallel 4 paced at 25 MB/s per connection,
    # virtual disk: 80 -> 95 MB/s of the 101 the 4 connections carry; bench/bench_download.py).
    connections = threading.BoundedSemaphore(parallel)
    pool = ThreadPoolExecutor(max_workers=2 * parallel)
    try:
        checked = dict(zip(names, pool.map(lambda name: _is_present(output_dir, name, plan), names)))
        present = [name for name in names if checked[name]]
        for name in present:
            plan.mark_done(name)
        missing = [name for name in names if not checked[name]]
        log.info("shard %d,%d: %d files, %d already here, %d to download into %s", *shard, len(names), len(present),
                 len(missing), output_dir)
        sizes = [size for size in map(plan.size, missing) if size is not None]
        progress = _Progress(len(missing), sum(sizes) if len(sizes) == len(missing) else None)  # None: some unknown
        try:
            downloaded, errors = _download_all(pool, missing, source, output_dir, plan, policy, progress, stop,
                                               connections)
        finally:
            progress.close()
    finally:
        stop.set()  # after an interrupt, the downloads in flight stop at their next chunk, the others never start
        pool.shutdown(wait=True, cancel_futures=True)
        plan.close()
    summary = {"files": len(downloaded), "bytes": sum(downloaded.values()),
               "seconds": round(time.monotonic() - started, 3), "failures": len(errors),
               "already_present": len(present), "remaining": len(missing) - len(downloaded),
               "output_dir": output_dir}
    return DownloadResult(summary, errors)


def _download_all(pool: ThreadPoolExecutor, names: list[str], source: Source, output_dir: str, plan: LocalPlan,
                  policy: RetryPolicy, progress: _Progress, stop: threading.Event,
                  connections: threading.BoundedSemaphore) -> tuple[dict[str, int], list[OSError]]:
    """Bytes per downloaded file, and the errors of those that failed; after a full disk no new file starts."""
    futures = {pool.submit(_download_file, source, output_dir, name, plan, policy, progress, stop, connections): name
               for name in names}
    downloaded: dict[str, int] = {}
    errors: list[OSError] = []
    for future in as_completed(futures):
        if future.cancelled():
            continue  # never started after a full disk: it stays in the plan
        try:
            downloaded[futures[future]] = future.result()
        except _Cancelled:
            pass  # stopped mid-file by another file's full disk: it stays in the plan
        except (DownloadError, WriteError) as err:
            errors.append(err)
            if isinstance(err, WriteError):  # the next files would not fit either
                stop.set()
                for pending in futures:
                    pending.cancel()
    return downloaded, errors


def _download_file(source: Source, output_dir: str, name: str, plan: LocalPlan, policy: RetryPolicy,
                   progress: _Progress, stop: threading.Event, connections: threading.BoundedSemaphore) -> int:
    if stop.is_set():
        raise _Cancelled()
    url = source.file_url(name)
    path = os.path.join(output_dir, local_name(name))
    size = _retrying(name, url, policy, stop, lambda: _download_once(url, path, plan.md5(name), plan.size(name), name,
                                                                     policy, progress, stop, connections))
    plan.mark_done(name)
    return size


def _download_once(url: str, path: str, md5: str, planned_size: Optional[int], name: str, policy: RetryPolicy,
                   progress: _Progress, stop: threading.Event, connections: threading.BoundedSemaphore) -> int:
    """One attempt: the bytes go to a temporary file beside `path`, which becomes `path` only if their MD5 is the
    plan's; otherwise it is removed. No more bytes than the plan's size (where it has one) or the Content-Length
    are written. It holds one of `connections` until the bytes are written, not while they are synced to the disk
    and renamed."""
    with _Held(connections) as connection, _Watch(policy) as watch, _open(url, policy, watch) as response:
        length = _content_length(response)
        if None not in (planned_size, length) and length != planned_size:
            raise _WrongSize(f"the server announces {length} bytes, not the plan's size, {planned_size} bytes")
        progress.announce(name, length)
        with atomic_writer(path, binary=True) as out:
            digest, size = _copy(response, out, progress, stop, watch, planned_size)
            watch.check()
            if length is not None and size < length:  # http.client's readinto() does not check it
                raise _ShortBody(f"the connection closed after {size} of {length} bytes")
            if digest != md5:
                raise _ChecksumMismatch(f"MD5 mismatch: {size} bytes with MD5 {digest}, the plan says {md5}")
            out.flush()  # a full disk shows here, before the next file may start
            connection.release()
    return size


class _Held:
    """A semaphore acquired for a block and released at its end, or earlier by `release()`: once either way."""

    def __init__(self, semaphore: threading.BoundedSemaphore) -> None:
        self._semaphore, self._held = semaphore, False

    def __enter__(self) -> "_Held":
        self._semaphore.acquire()
        self._held = True
        return self

    def release(self) -> None:
        if self._held:
            self._held = False
            self._semaphore.release()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _content_length(response: http.client.HTTPResponse) -> Optional[int]:
    length = response.headers.get("Content-Length", "")
    return int(length) if length.isdigit() else None


def _copy(response: http.client.HTTPResponse, out: IO[bytes], progress: _Progress, stop: threading.Event,
          watch: _Watch, limit: Optional[int]) -> tuple[str, int]:
    """Copy the response into `out` through one reused buffer, hashing as it goes; returns (MD5, bytes). More than
    `limit` bytes (the plan's size) is an error as soon as one byte more arrives."""
    buffer = bytearray(_CHUNK_BYTES)
    view = memoryview(buffer)
    digest = hashlib.md5()
    size = 0
    while count := response.readinto(view if limit is None else view[:min(_CHUNK_BYTES, limit + 1 - size)]):
        if stop.is_set():
            raise _Cancelled()
        if limit is not None and size + count > limit:
            raise _WrongSize(f"the server sends more than the plan's size, {limit} bytes")
        chunk = view[:count]
        digest.update(chunk)  # hashlib lets other threads run while it hashes
        out.write(chunk)
        progress.advance(count)
        watch.received(count)
        size += count
    return digest.hexdigest(), size


def _is_present(output_dir: str, name: str, plan: LocalPlan) -> bool:
    """The file is already in `output_dir` with the plan's MD5 (downloaded before its plan entry was removed, or
    by another downloader)."""
    path = os.path.join(output_dir, local_name(name))
    if not os.path.isfile(path):
        return False
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest() == plan.md5(name)


def _remove_abandoned_temporaries(directory: str, names: set[str]) -> None:
    """Remove what a killed run left half-written of these files: temporary files whose writer has exited (a
    download running beside this one, of another partition or shard, keeps its own)."""
    stems = {temporary_stem(name) for name in names}
    for entry in os.listdir(directory):
        owner = temporary_owner(entry)
        if owner is not None and owner[0] in stems and not _process_exists(owner[1]):
            os.remove(os.path.join(directory, entry))
            log.info("removed %s, left by an interrupted download", entry)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def dry_run(source: Source, output_dir: str, shard: tuple[int, int] = (1, 1), parallel: int = 4,
            policy: RetryPolicy = RetryPolicy()) -> dict[str, Any]:
    """The files a download would fetch, with their URLs and sizes (the plan's, else from HEAD requests) and the
    total; fetches no file and writes nothing."""
    plan = open_plan(source, output_dir, policy, keep_copy=False)
    names = plan.remaining(shard)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        sizes = list(pool.map(lambda name: _size(source, plan, name, policy), names))
    files = [{"file": local_name(name), "url": source.file_url(name), "bytes": size}
             for name, size in zip(names, sizes)]
    return {"dry_run": True, "plan": source.plan_url, "files": len(files),
            "bytes": sum(size for size in sizes if size is not None),
            "unknown_sizes": sizes.count(None), "file_list": files}


def _size(source: Source, plan: LocalPlan, name: str, policy: RetryPolicy) -> Optional[int]:
    """The plan's size of the file, else the Content-Length of a HEAD request (None where the server sends none)."""
    size = plan.size(name)
    if size is not None:
        return size
    url = source.file_url(name)

    def attempt() -> Optional[int]:
        with _Watch(policy) as watch, _open(url, policy, watch, method="HEAD") as response:
            return _content_length(response)

    return _retrying(name, url, policy, threading.Event(), attempt)

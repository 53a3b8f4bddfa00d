"""Download YouTube-8M partitions by the dataset's own protocol (a plan of file names and MD5s, files from a mirror,
`shard=i,N`): resumable through the plan's local copy, every file verified by MD5, retried, several at a time.

The official downloader (http://data.yt8m.org/download.py) fetches `<host>/<version>/download_plans/<kind>_<split>.json`,
a JSON object whose "files" maps each file name to its MD5, keeps it in the current folder as
`<version>_<kind>_<split>_download_plan.json` and deletes each file from it once downloaded and verified; a file
`<prefix><two letters>.<ext>` is stored as `<prefix><4-digit index of the letters>.<ext>`. This module keeps all
of that, so a download started by either one can be finished by the other.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import string
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Optional, TypeVar

from tqdm import tqdm

from yt8m.io.files import WriteError, atomic_writer, is_temporary, write_file_atomically

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


class DownloadError(OSError):
    """A file (or the plan) could not be downloaded: names it, its URL and the cause. Printed as one line."""


class PlanError(ValueError):
    """The plan is not one: not JSON, no "files" mapping, a name that is not a plain file name, a bad MD5."""


class _ChecksumMismatch(Exception):
    """The bytes received do not have the plan's MD5 (retried: the next attempt may be right)."""


class _ShortBody(http.client.HTTPException):
    """The connection closed before the Content-Length announced was received (retried)."""


class _Cancelled(Exception):
    """The run is stopping (an interrupt, a full disk): downloads in flight end, their temporary files removed."""


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts after the first (`retries`), the wait before the first retry (doubled for each next one, at most a
    minute) and the socket timeout; connection resets, timeouts, HTTP 5xx and MD5 mismatches are retried."""

    retries: int = 5
    backoff_secs: float = 1.0
    timeout_secs: float = 60.0

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
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        raise PlanError(f"{origin} is not a download plan: {err}") from err
    files = plan.get("files") if isinstance(plan, dict) else None
    if not isinstance(files, dict):
        raise PlanError(f'{origin} is not a download plan: no "files" object mapping file names to MD5s')
    for name, md5 in files.items():
        if not _is_plain_file_name(name):
            raise PlanError(f"{origin}: {name!r} is not a plain file name")
        if not (isinstance(md5, str) and len(md5) == _MD5_HEX_DIGITS and all(c in string.hexdigits for c in md5)):
            raise PlanError(f"{origin}: the MD5 of {name} is not 32 hex digits: {md5!r}")
    if not isinstance(plan.get("sizes", {}), dict):
        raise PlanError(f'{origin}: "sizes" is not an object mapping file names to bytes')
    return plan


def _is_plain_file_name(name: str) -> bool:
    """No folders, nothing hidden: a name from the network must not write outside the output dir."""
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".") and "\0" not in name


class LocalPlan:
    """The plan's copy in the output dir, what is left to download: a file leaves it once verified (atomically
    rewritten each time, so an interrupted run's progress is kept)."""

    def __init__(self, plan: dict[str, Any], path: Optional[str]) -> None:
        self._plan = plan
        self._path = path
        self._lock = threading.Lock()

    def remaining(self, shard: tuple[int, int]) -> list[str]:
        return sorted(name for name in self._plan["files"] if in_shard(name, shard))

    def md5(self, name: str) -> str:
        return self._plan["files"][name].lower()

    def size(self, name: str) -> Optional[int]:
        size = self._plan.get("sizes", {}).get(name)
        return size if isinstance(size, int) else None

    def mark_done(self, name: str) -> None:
        with self._lock:
            del self._plan["files"][name]
            self._plan.get("sizes", {}).pop(name, None)
            if self._path is not None:
                write_file_atomically(self._path, lambda out: json.dump(self._plan, out))


def open_plan(source: Source, output_dir: str, policy: RetryPolicy, keep_copy: bool = True) -> LocalPlan:
    """The local copy of the plan if there is one (a re-run continues), else the plan fetched from the source
    (and, with `keep_copy`, saved as the local copy)."""
    path = os.path.join(output_dir, source.plan_filename)
    if os.path.exists(path):
        with open(path, "rb") as fh:
            plan = parse_plan(fh.read(), path)
        log.info("resuming with %s (%d files left in the plan)", path, len(plan["files"]))
        return LocalPlan(plan, path)
    text = _retrying("the download plan", source.plan_url, policy, threading.Event(),
                     lambda: _read_url(source.plan_url, policy))
    plan = parse_plan(text, source.plan_url)
    if not keep_copy:
        return LocalPlan(plan, None)
    with atomic_writer(path, binary=True) as out:
        out.write(text)
    log.info("fetched %s (%d files) into %s", source.plan_url, len(plan["files"]), path)
    return LocalPlan(plan, path)


def _read_url(url: str, policy: RetryPolicy) -> bytes:
    with urllib.request.urlopen(url, timeout=policy.timeout_secs) as response:
        return response.read()


def _retrying(what: str, url: str, policy: RetryPolicy, stop: threading.Event, attempt: Callable[[], T]) -> T:
    """`attempt()`, again after a wait while it fails in a way that may pass; a failure that will not pass (HTTP
    404, a full disk) or the last one raises an error naming `what` and its URL."""
    attempts = policy.retries + 1
    for number in range(1, attempts + 1):
        try:
            return attempt()
        except (WriteError, _Cancelled):
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
        return f"HTTP {err.code} {err.reason}"
    if isinstance(err, urllib.error.URLError):
        return _describe(err.reason) if isinstance(err.reason, BaseException) else str(err.reason)
    if isinstance(err, http.client.IncompleteRead):
        return f"the connection closed after {len(err.partial)} bytes, {err.expected} more expected"
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
        sizes = [plan.size(name) for name in missing]
        progress = _Progress(len(missing), None if None in sizes else sum(sizes))
        try:
            downloaded, errors = _download_all(pool, missing, source, output_dir, plan, policy, progress, stop,
                                               connections)
        finally:
            progress.close()
    finally:
        stop.set()  # after an interrupt, the downloads in flight stop at their next chunk, the others never start
        pool.shutdown(wait=True, cancel_futures=True)
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
    size = _retrying(name, url, policy, stop, lambda: _download_once(url, path, plan.md5(name), name, policy,
                                                                     progress, stop, connections))
    plan.mark_done(name)
    return size


def _download_once(url: str, path: str, md5: str, name: str, policy: RetryPolicy, progress: _Progress,
                   stop: threading.Event, connections: threading.BoundedSemaphore) -> int:
    """One attempt: the bytes go to a temporary file beside `path`, which becomes `path` only if their MD5 is the
    plan's; otherwise it is removed. It holds one of `connections` until the bytes are written, not while they
    are synced to the disk and renamed."""
    with _Held(connections) as connection, urllib.request.urlopen(url, timeout=policy.timeout_secs) as response:
        length = _content_length(response)
        progress.announce(name, length)
        with atomic_writer(path, binary=True) as out:
            digest, size = _copy(response, out, progress, stop)
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


def _copy(response: http.client.HTTPResponse, out: IO[bytes], progress: _Progress, stop: threading.Event) -> tuple[str, int]:
    """Copy the response into `out` through one reused buffer, hashing as it goes; returns (MD5, bytes)."""
    buffer = bytearray(_CHUNK_BYTES)
    view = memoryview(buffer)
    digest = hashlib.md5()
    size = 0
    while count := response.readinto(buffer):
        if stop.is_set():
            raise _Cancelled()
        chunk = view[:count]
        digest.update(chunk)  # hashlib lets other threads run while it hashes
        out.write(chunk)
        progress.advance(count)
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
    for entry in os.listdir(directory):
        if not is_temporary(entry):
            continue
        target, _, writer = entry[1:].rpartition(".tmp-")
        if target in names and not _process_exists(int(writer.split("-")[0])):
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
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=policy.timeout_secs) as response:
            return _content_length(response)

    return _retrying(name, url, policy, threading.Event(), attempt)

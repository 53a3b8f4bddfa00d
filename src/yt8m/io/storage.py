"""Paths on the local disk or on object storage (s3://, gs://, any fsspec URL): what train dirs, checkpoints,
exports and predictions need of them (exist, list, read, remove), one call for both.

Listings are never cached: a watching `yt8m eval` must see the checkpoints another process wrote since. A failure
to reach object storage (no answer from the endpoint, a refused key pair, a missing bucket) is a StorageError naming
the URL, whatever the client raised.
"""

from __future__ import annotations

import os
import re
import shutil
from contextlib import contextmanager
from typing import IO, Any, Callable, Iterator

import fsspec

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# The extra that installs each object store's fsspec implementation.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
S3_CONNECTIONS = 64  # an s3:// client's connections to the store (see _client_options)


def is_local(path: str) -> bool:
    """A plain path; a URL (s3://, gs://, memory://, file:// too) goes through fsspec."""
    return _URL.match(path) is None


def filesystem(path: str) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) of a URL; ValueError naming the extra to install when its package is
    missing (s3:// needs s3fs, gs:// gcsfs)."""
    match = _URL.match(path)
    try:
        return fsspec.core.url_to_fs(path, **_client_options(match.group(1) if match else ""))
    except ImportError as err:
        protocol = match.group(1) if match else ""
        extra = f" (pip install 'yt8m[{_EXTRAS[protocol]}]')" if protocol in _EXTRAS else ""
        raise ValueError(f"cannot reach {path}: {err}{extra}") from err


def _client_options(protocol: str) -> dict[str, Any]:
    """s3fs's client keeps botocore's 10 connections, fewer than the shard reads a fetch-ahead has in flight: the
    requests queued for a connection instead of waiting out the store's latency together (at 50 ms a request, 10
    connections fetched 72 tiny shards a second, 64 fetched 114: bench_release_scale.py). fsspec's configuration
    (FSSPEC_S3_CONFIG_KWARGS, ~/.config/fsspec) still sets it and every other option."""
    if protocol not in ("s3", "s3a"):
        return {}
    configured = {**fsspec.config.conf.get("s3", {}), **fsspec.config.conf.get("s3a", {})}.get("config_kwargs", {})
    return {"config_kwargs": {"max_pool_connections": S3_CONNECTIONS, **configured}}


class StorageError(OSError):
    """Object storage could not be reached for a URL: names the URL and the client's reason, on one line."""


@contextmanager
def reaching(url: str) -> Iterator[None]:
    """The object store's failures inside the block as StorageError naming `url`: botocore, gcsfs and aiohttp raise
    errors of their own (EndpointConnectionError, a bare PermissionError("Forbidden")) that name the endpoint's
    request at best. FileNotFoundError, a missing object, passes as it is: callers tell it from the others; so does
    anything raised for a local path."""
    try:
        yield
    except (FileNotFoundError, StorageError):
        raise
    except Exception as err:
        if is_local(url):
            raise
        reason = " ".join(str(err).split()) or type(err).__name__
        raise StorageError(f"cannot reach {url}: {reason}") from err


def _uncached(path: str) -> tuple[Any, str]:
    fs, inner = filesystem(path)
    fs.invalidate_cache(inner)
    return fs, inner


def exists(path: str) -> bool:
    return _ask(path, os.path.exists, "exists")


def isdir(path: str) -> bool:
    """A folder; on object storage, a prefix that holds at least one object."""
    return _ask(path, os.path.isdir, "isdir")


def _ask(path: str, local: Callable[[str], bool], method: str) -> bool:
    """`local(path)` for a local path, the filesystem's `method` (its listing refreshed) for a URL."""
    if is_local(path):
        return local(path)
    fs, inner = _uncached(path)
    with reaching(path):
        return bool(getattr(fs, method)(inner))


def listdir(path: str) -> list[str]:
    """The names in a folder (files and subfolders); [] when it does not exist."""
    if is_local(path):
        return os.listdir(path) if os.path.isdir(path) else []
    fs, inner = _uncached(path)
    try:
        with reaching(path):
            entries = fs.ls(inner, detail=False)
    except FileNotFoundError:
        return []
    return [name for name in (entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries) if name]


def size(path: str) -> int:
    """A file's size in bytes."""
    fs, name = filesystem(path)
    return int(fs.size(name))


def open_file(path: str, mode: str = "rb") -> IO:
    """A file opened for reading (text modes in UTF-8); use as a context manager."""
    if is_local(path):
        return open(path, mode) if "b" in mode else open(path, mode, encoding="utf-8")
    fs, inner = filesystem(path)
    with reaching(path):
        return fs.open(inner, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def read_bytes(path: str) -> bytes:
    with open_file(path, "rb") as fh, reaching(path):
        return fh.read()


def remove(path: str) -> None:
    """Remove a file; one already gone is no error."""
    try:
        if is_local(path):
            os.remove(path)
        else:
            fs, inner = filesystem(path)
            with reaching(path):
                fs.rm_file(inner)
    except FileNotFoundError:
        pass


def remove_tree(path: str) -> None:
    """Remove a folder and everything in it; one already gone is no error."""
    if is_local(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    fs, inner = _uncached(path)
    try:
        with reaching(path):
            fs.rm(inner, recursive=True)
    except FileNotFoundError:
        pass

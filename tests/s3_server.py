"""An S3-compatible server on loopback for the object-storage tests and bench/bench_s3.py: moto's server in a
process of its own, reached through s3fs with the standard AWS environment (AWS_ENDPOINT_URL_S3 and keys); and a
proxy in front of it that, once told to, stalls every ranged GET (an object's data): answers nothing, forever."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from typing import Iterator, Tuple

_START_SECS = 30


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def s3_environment(endpoint: str) -> dict[str, str]:
    """What points s3fs (through botocore) at `endpoint`: moto takes any key pair."""
    return {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def loopback_s3_server(checking_keys: bool = False) -> Iterator[str]:
    """Run `moto_server` on 127.0.0.1 and a free port until the block ends; yields its endpoint URL. With
    `checking_keys`, it refuses every request as S3 refuses a key pair it does not know."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if checking_keys else {})}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        _wait_until_serving(server, endpoint)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=10)


def _wait_until_serving(server: subprocess.Popen, endpoint: str) -> None:
    deadline = time.monotonic() + _START_SECS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"moto_server exited with status {server.returncode} before serving {endpoint}")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                return
        except urllib.error.HTTPError:
            return  # serving, and refusing an unsigned request
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    raise RuntimeError(f"moto_server did not answer on {endpoint} within {_START_SECS} s")


@contextmanager
def s3_environment_set(endpoint: str) -> Iterator[None]:
    """The process's environment pointing s3fs at `endpoint` (restored after), with no s3fs instance made before
    (fsspec caches them, with their clients) reused."""
    import s3fs

    saved = {name: os.environ.get(name) for name in s3_environment(endpoint)}
    os.environ.update(s3_environment(endpoint))
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def stalling_proxy(endpoint: str) -> Iterator[Tuple[str, threading.Event]]:
    """A TCP proxy to `endpoint` on a free loopback port; yields (its endpoint, stall): while `stall` is set, a
    connection that sends a GET with a Range header (s3fs reading an object's bytes) gets no more answer, as from
    a stalled object store; listings and metadata still pass."""
    upstream = endpoint.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    stall = threading.Event()
    threading.Thread(target=_accept, args=(listener, (upstream[0].split("//")[1], int(upstream[1])), stall),
                     daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", stall
    finally:
        listener.close()


def _accept(listener: socket.socket, upstream: Tuple[str, int], stall: threading.Event) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        try:
            server = socket.create_connection(upstream)
        except OSError:  # the server is gone (the test ended while a read was left stalled)
            client.close()
            continue
        stalled = threading.Event()
        threading.Thread(target=_relay, args=(client, server, stall, stalled, True), daemon=True).start()
        threading.Thread(target=_relay, args=(server, client, stall, stalled, False), daemon=True).start()


def _relay(source: socket.socket, sink: socket.socket, stall: threading.Event, stalled: threading.Event,
           requests: bool) -> None:
    """Copy `source` to `sink`; on the request side mark the connection stalled at a ranged GET while `stall` is
    set, on the answer side drop everything once it is."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            if requests and stall.is_set() and data.startswith(b"GET ") and b"\r\nrange:" in data.lower():
                stalled.set()
            if not (stalled.is_set() and not requests):
                sink.sendall(data)
    except OSError:
        pass
    finally:
        if not stalled.is_set():
            sink.close()

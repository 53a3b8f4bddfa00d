"""Download-throughput benchmark: `yt8m download --parallel N` against plain HTTP clients, all fetching the same
files from one loopback server (`python -m http.server`, in a process of its own); prints one JSON line per run.

Run on demand: `.venv/bin/python bench/bench_download.py` (16 files of 16 MB by default, best of 3 passes each).
The plain clients read each response into a reused buffer and drop it: the server's raw throughput. yt8m download
also hashes every byte (MD5), writes it to a temporary file, syncs it to the disk and renames it.
`--connection_mb_per_s R` paces every response at R MB/s, as a remote mirror limits each connection.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

PARTITION = "2/video/train"
_CHUNK_BYTES = 1 << 20


def _write_partition(folder: str, files: int, megabytes: int) -> list[str]:
    """Random files as the official host lays them out, with their plan; returns the files' URL paths."""
    data_dir = os.path.join(folder, PARTITION)
    os.makedirs(data_dir)
    os.makedirs(os.path.join(folder, "2", "download_plans"))
    md5s = {}
    for index in range(files):
        name = f"train{'abcdefghijklmnopqrstuvwxyz'[index // 26]}{'abcdefghijklmnopqrstuvwxyz'[index % 26]}.tfrecord"
        data = os.urandom(megabytes << 20)
        md5s[name] = hashlib.md5(data).hexdigest()
        with open(os.path.join(data_dir, name), "wb") as fh:
            fh.write(data)
    with open(os.path.join(folder, "2", "download_plans", "video_train.json"), "w") as fh:
        json.dump({"files": md5s}, fh)
    return [f"/{PARTITION}/{name}" for name in sorted(md5s)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_server(folder: str, connection_mb_per_s: float) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    if connection_mb_per_s:
        command = [sys.executable, __file__, "--serve", folder, "--port", str(port),
                   "--connection_mb_per_s", str(connection_mb_per_s)]
    else:
        command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", folder]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{url}/2/download_plans/video_train.json", timeout=1).read()
            return server, url
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the loopback server did not start")


def _serve_paced(folder: str, port: int, connection_mb_per_s: float) -> None:
    """http.server's file server (a thread per connection), each response sent at `connection_mb_per_s`."""
    bytes_per_second = connection_mb_per_s * 1e6

    class PacedHandler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=folder, **kwargs)

        def copyfile(self, source, outputfile) -> None:
            started, sent = time.perf_counter(), 0
            while chunk := source.read(256 << 10):
                outputfile.write(chunk)
                sent += len(chunk)
                time.sleep(max(0.0, sent / bytes_per_second - (time.perf_counter() - started)))

        def log_message(self, *args) -> None:
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", port), PacedHandler).serve_forever()


def _fetch(url: str, output_dir: str | None) -> int:
    """One file read into a reused buffer and dropped; with `output_dir`, also hashed (MD5) and written there (not
    synced): the least work a verifying downloader does."""
    buffer = bytearray(_CHUNK_BYTES)
    view = memoryview(buffer)
    digest = hashlib.md5()
    size = 0
    with urllib.request.urlopen(url, timeout=60) as response:
        out = open(os.path.join(output_dir, url.rsplit("/", 1)[1]), "wb") if output_dir else None
        while count := response.readinto(buffer):
            if out:
                digest.update(view[:count])
                out.write(view[:count])
            size += count
        if out:
            out.close()
    return size


def _plain_clients(url: str, paths: list[str], clients: int, hash_and_write: bool = False) -> dict:
    with _output_dir() as output_dir:
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=clients) as pool:
            total = sum(pool.map(lambda path: _fetch(url + path, output_dir if hash_and_write else None), paths))
        return {"bytes": total, "seconds": time.perf_counter() - started}


def _yt8m_download(url: str, parallel: int) -> dict:
    """Timed from the command line (process start included), and by the command itself (its summary's seconds)."""
    with _output_dir() as output_dir:
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "yt8m", "download", "--partition", PARTITION, "--base_url", url,
                                 "--output_dir", output_dir, "--parallel", str(parallel)],
                                capture_output=True, text=True, check=True)
        seconds = time.perf_counter() - started
        summary = json.loads(result.stdout)
        return {"bytes": summary["bytes"], "seconds": seconds, "command_seconds": summary["seconds"]}


@contextlib.contextmanager
def _output_dir() -> Iterator[str]:
    """A fresh folder under $TMPDIR (the disk by default; TMPDIR=/dev/shm leaves the disk out)."""
    folder = tempfile.mkdtemp(prefix="yt8m_bench_download_out_")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--megabytes", type=int, default=16, help="MiB per file.")
    parser.add_argument("--repeats", type=int, default=3, help="Timed passes per client; the best is kept.")
    parser.add_argument("--parallel", default="1,4", help="Comma-separated --parallel values of yt8m download.")
    parser.add_argument("--connection_mb_per_s", type=float, default=0.0,
                        help="Pace each response at this many MB/s (0: as fast as the server goes).")
    parser.add_argument("--serve", default="", help=argparse.SUPPRESS)  # the paced server's own process
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve_paced(args.serve, args.port, args.connection_mb_per_s)
        return
    folder = tempfile.mkdtemp(prefix="yt8m_bench_download_")
    server = None
    try:
        paths = _write_partition(folder, args.files, args.megabytes)
        server, url = _start_server(folder, args.connection_mb_per_s)
        _plain_clients(url, paths, 4)  # the files into the page cache
        runs = [("plain, sequential", lambda: _plain_clients(url, paths, 1)),
                ("plain, 4 parallel", lambda: _plain_clients(url, paths, 4)),
                ("plain + MD5 + write, 4 parallel", lambda: _plain_clients(url, paths, 4, hash_and_write=True))]
        runs += [(f"yt8m download --parallel {n}", lambda n=int(n): _yt8m_download(url, n))
                 for n in args.parallel.split(",")]
        for client, measure in runs:
            best = min((measure() for _ in range(args.repeats)), key=lambda result: result["seconds"])
            megabytes = best["bytes"] / 1e6
            line = {"client": client, "files": args.files, "mb": round(megabytes, 1),
                    "connection_mb_per_s": args.connection_mb_per_s or None,
                    "mb_per_s": round(megabytes / best["seconds"], 1)}
            if "command_seconds" in best:
                line["mb_per_s_command"] = round(megabytes / best["command_seconds"], 1)
            print(json.dumps(line), flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

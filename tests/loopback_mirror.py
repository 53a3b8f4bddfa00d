"""A loopback HTTP mirror of one YouTube-8M partition for the `yt8m download` tests, with injected faults.

Test modules import what they use (`from loopback_mirror import Mirror, mirror, ...`); pytest then treats `mirror`
(six files, no sizes in the plan) as a fixture.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

PARTITION = "2/video/train"
PLAN_PATH = "/2/download_plans/video_train.json"
LOCAL_PLAN = "2_video_train_download_plan.json"
# Extra bytes an "oversize" answer sends beyond the file (with a Content-Length of the whole).
OVERSIZE_BYTES = 40 << 20
TRICKLE_SECS = 0.2
SLOW_SECS = 4.0  # a "slow" answer waits this long: past any --timeout_secs the tests give


def synthetic_files(count: int) -> dict[str, bytes]:
    """Plan names as on the official host (train<two letters>.tfrecord) holding a few hundred KB each."""
    rng = random.Random(count)
    return {f"train{letters}.tfrecord": rng.randbytes(rng.randrange(100_000, 400_000))
            for letters in ["aa", "ab", "aZ", "b0", "c9", "99"][:count]}


class Mirror:
    """A loopback HTTP server of one partition's plan and files. `faults[name]` lists what the next requests of a
    file (or of PLAN_PATH, the plan) get, one each: "drop" (the connection closes mid-file), "wrong" (a flipped
    byte), "404", "500", "slow" (no answer within the client's timeout), "stall" (half the file, then nothing until
    the test ends), "trickle" (a byte every TRICKLE_SECS until the test ends), "oversize" (the file, then
    OVERSIZE_BYTES more, announced by its Content-Length; "unannounced": without a Content-Length) or "redirect" (to
    itself, forever)."""

    def __init__(self, files: dict[str, bytes], with_sizes: bool = False) -> None:
        self.files = files
        plan = {"files": {name: hashlib.md5(data).hexdigest() for name, data in files.items()}}
        if with_sizes:
            plan["sizes"] = {name: len(data) for name, data in files.items()}
        self.plan = json.dumps(plan).encode()
        self.faults: dict[str, list[str]] = {}
        self.requests: list[tuple[str, str]] = []
        self.bytes_sent = 0
        self._count = threading.Lock()
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def gets(self) -> list[str]:
        """The names of the files requested with GET, in order (the plan not included)."""
        return [path.rsplit("/", 1)[1] for method, path in self.requests if method == "GET" and path != PLAN_PATH]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(body=True)

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def _answer(self, body: bool) -> None:
                mirror.requests.append((self.command, self.path))
                data = self._content()
                if data is None:
                    self.send_error(404)
                    return
                name = PLAN_PATH if self.path == PLAN_PATH else self.path.rsplit("/", 1)[1]
                fault = mirror.faults.get(name, []).pop(0) if body and mirror.faults.get(name) else None
                if fault == "404":
                    self.send_error(404)
                elif fault == "500":
                    self.send_error(503)
                elif fault == "slow":
                    time.sleep(SLOW_SECS)
                    self.send_error(503)
                elif fault == "redirect":
                    mirror.faults.setdefault(name, []).insert(0, "redirect")
                    self.send_response(302)
                    self.send_header("Location", self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._send(data, fault, body)

            def _content(self) -> bytes | None:
                if self.path == PLAN_PATH:
                    return mirror.plan
                prefix = f"/{PARTITION}/"
                return mirror.files.get(self.path[len(prefix):]) if self.path.startswith(prefix) else None

            def _send(self, data: bytes, fault: str | None, body: bool) -> None:
                self.send_response(200)
                extra = OVERSIZE_BYTES if fault in ("oversize", "unannounced") else 0
                if fault != "unannounced":
                    self.send_header("Content-Length", str(len(data) + extra))
                self.end_headers()
                if not body:
                    return
                if fault == "wrong":
                    data = bytes([data[0] ^ 1]) + data[1:]
                try:
                    self._write_body(data, fault, extra)
                except OSError:
                    pass  # the client hung up (a cut-off transfer)

            def _write_body(self, data: bytes, fault: str | None, extra: int) -> None:
                if fault in ("drop", "stall"):
                    self._write(data[:len(data) // 2])
                    if fault == "stall":
                        mirror.stalled.set()
                        mirror.release.wait(30)
                    return  # the server closes the connection: the client is short of bytes
                if fault == "trickle":
                    for byte in data:
                        self._write(bytes([byte]))
                        if mirror.release.wait(TRICKLE_SECS):
                            return
                    return
                self._write(data)
                for _ in range(extra >> 20):
                    self._write(bytes(1 << 20))

            def _write(self, data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()
                with mirror._count:
                    mirror.bytes_sent += len(data)

            def log_message(self, *args) -> None:
                pass

        return Handler


@pytest.fixture
def mirror() -> Iterator[Mirror]:
    server = Mirror(synthetic_files(6))
    yield server
    server.close()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """No report of a client that hung up (the tests cut transfers off on purpose): its traceback on stderr
        would land in whatever test's captured output comes next in the process."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

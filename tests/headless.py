"""Headless chromium for the browser tests, driven over the DevTools protocol on a pipe (--remote-debugging-pipe: the
browser reads commands on its fd 3 and writes replies and events on fd 4, each a JSON message ended by a NUL byte),
so a test loads a page as a reader's browser does, runs JavaScript in it, takes screenshots at a window's size, and
sees every request the page makes. Nothing but the standard library; Debian's `chromium` package is the browser."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from typing import Any, Optional

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# The sizes a reader sees a page at: a laptop's window and a phone's.
DESKTOP, PHONE = (1280, 800), (390, 844)


def browser_binary() -> Optional[str]:
    return next(filter(None, map(shutil.which, BROWSERS)), None)


class BrowserError(RuntimeError):
    """The browser answered a command with an error, died, or did not answer in time."""


class Browser:
    """One headless chromium with one page (tab). Every host name but loopback's resolves to nothing, so a request
    that would leave the machine fails; `requests` lists every URL the page asked for, to check that none tried."""

    def __init__(self, binary: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="yt8m-browser-")
        self.log_path = os.path.join(self.profile, "stderr.log")  # a file: an undrained pipe would block the browser
        commands_read, self._commands = os.pipe()  # we write commands; the browser reads them on its fd 3
        self._replies, replies_written = os.pipe()  # the browser writes on its fd 4; we read
        # bash (dash takes one-digit fds only) puts the pipe's ends at the browser's fds 3 and 4, then becomes it.
        self.process = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{commands_read} 4>&{replies_written}', binary, "--headless",
             "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
             "--disable-default-apps", "--mute-audio", "--hide-scrollbars", f"--user-data-dir={self.profile}",
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(self.log_path, "wb"),
            pass_fds=(commands_read, replies_written))
        os.close(commands_read)
        os.close(replies_written)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.requests: list[str] = []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.call(f"{domain}.enable")

    def send(self, method: str, session: Optional[str] = None, **params: Any) -> dict[str, Any]:
        """A command's result (the browser's, or the page's where `session` is given)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        reply = self._wait(lambda event: event.get("id") == message["id"])
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """A command to the page."""
        return self.send(method, self.session, **params)

    def _wait(self, done: Any, timeout: Optional[float] = None) -> dict[str, Any]:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            while b"\0" in self._buffer:
                raw, _, self._buffer = self._buffer.partition(b"\0")
                message = json.loads(raw)
                if "method" in message:
                    self._record(message)
                if done(message):
                    return message
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                raise BrowserError(f"no answer in {timeout or self.timeout:.0f} s")
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                with open(self.log_path, errors="replace") as log:
                    raise BrowserError(f"the browser exited: {log.read()[-2000:]}")
            self._buffer += chunk

    def _record(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if event["method"] == "Network.requestWillBeSent":
            self.requests.append(event["params"]["request"]["url"])

    def open(self, url: str, size: tuple[int, int] = DESKTOP, settle: float = 0.5) -> None:
        """Load `url` in a window of `size` (width, height) and wait for its load event, then `settle` seconds for
        what its scripts do after."""
        width, height = size
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=width < 600)
        self.events.clear()
        self.call("Page.navigate", url=url)
        self._wait(lambda event: event.get("method") == "Page.loadEventFired")
        self.sleep(settle)

    def sleep(self, seconds: float) -> None:
        """Let the page run for `seconds`, recording its events."""
        try:
            self._wait(lambda event: False, timeout=seconds)
        except BrowserError:
            pass

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able; a promise is awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: str) -> bytes:
        """A PNG of what the window shows, written to `path`."""
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        with open(path, "wb") as out:
            out.write(data)
        return data

    def console_errors(self) -> list[str]:
        """Errors the page logged or threw since it was opened (a failed load among them)."""
        found = []
        for event in self.events:
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                found.append(params["exceptionDetails"].get("text", "exception"))
            elif event["method"] == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(params["entry"]["text"] + " " + params["entry"].get("url", ""))
            elif event["method"] == "Runtime.consoleAPICalled" and params["type"] == "error":
                found.append(" ".join(str(arg.get("value", "")) for arg in params["args"]))
        return found

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._commands, self._replies):
            os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)


def left_the_machine(urls: list[str]) -> list[str]:
    """The URLs of `urls` that are not on this machine (loopback, data:, blob:, about:, file:)."""
    local = ("data:", "blob:", "about:", "file:", "chrome-error:")
    return [url for url in urls if not url.startswith(local)
            and urllib.parse.urlsplit(url).hostname not in ("127.0.0.1", "localhost")]

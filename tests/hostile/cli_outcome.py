"""The hostile-input suite's harness: running `yt8m` as a user does and classifying what came back.

Test modules mark themselves `pytestmark = pytest.mark.hostile` and import the fixtures they use
(`from cli_outcome import yt8m, yt8m_here`).

A clean error is one line `yt8m <command>: error: ...` and exit 1; a traceback, a crash (a signal, another status)
or a hang (past the case's time limit) is a defect. With HOSTILE_OUTCOMES=FILE set, every case's outcome is appended
to FILE as a JSON line (a change's before/after table is made from two such files: bench/hostile_table.py).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HANG_SECS = 20.0
CLEAN_ERROR, SUCCESS, TRACEBACK, CRASH, HANG = "clean error", "success", "traceback", "crash", "hang"


@dataclass
class Outcome:
    """What one `yt8m` run gave: exit status (None: it hung and was killed), stdout and stderr."""

    command: str
    status: Optional[int]
    out: str
    err: str

    @property
    def kind(self) -> str:
        if self.status is None:
            return HANG
        if "Traceback (most recent call last)" in self.err:
            return TRACEBACK
        if self.status == 0:
            return SUCCESS
        if self.status == 1 and self.error_line.startswith(f"yt8m {self.command}: error: "):
            return CLEAN_ERROR
        return CRASH

    @property
    def error_line(self) -> str:
        lines = self.err.strip().splitlines()
        return lines[-1] if lines else ""

    @property
    def error_lines(self) -> list[str]:
        """The lines of stderr that are the command's error (the log lines before it left out)."""
        return [line for line in self.err.splitlines() if line.startswith(f"yt8m {self.command}: error: ")]

    def assert_clean_error(self, *fragments: str) -> str:
        """The one error line, checked: the last of stderr, the only one, naming every fragment."""
        assert self.kind == CLEAN_ERROR, f"{self.kind}: {self.err[-3000:]}"
        assert self.error_lines == [self.error_line], self.err[-3000:]
        for fragment in fragments:
            assert fragment in self.error_line, self.error_line
        return self.error_line

    def assert_success(self) -> dict:
        """The JSON summary line the command printed last."""
        assert self.kind == SUCCESS, f"{self.kind}: {self.err[-3000:]}"
        return json.loads(self.out.strip().splitlines()[-1])


def record(test: str, outcome: Outcome) -> Outcome:
    """Append the outcome to $HOSTILE_OUTCOMES, when set."""
    path = os.environ.get("HOSTILE_OUTCOMES")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"test": test, "surface": outcome.command, "kind": outcome.kind,
                                  "error": outcome.error_line[:300]}) + "\n")
    return outcome


def yt8m_env(**extra: str) -> dict[str, str]:
    """The environment of a `yt8m` process: this checkout's package first on the path, plus `extra`."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def process_runner(test: str) -> Callable[..., Outcome]:
    """`run(*argv, timeout=, env=, cwd=)`: `yt8m ARGV...` in a process of its own, killed as hung after `timeout`."""
    def run(*argv: str, timeout: float = HANG_SECS, env: Optional[dict] = None, cwd: Optional[str] = None) -> Outcome:
        command = [sys.executable, "-m", "yt8m", *argv]
        try:
            done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout,
                                  env=env or yt8m_env(), cwd=cwd)
        except subprocess.TimeoutExpired as expired:
            err = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else expired.stderr
            return record(test, Outcome(argv[0], None, "", err or ""))
        return record(test, Outcome(argv[0], done.returncode, done.stdout, done.stderr))

    return run


def in_process_runner(test: str) -> Callable[..., Outcome]:
    """`run(*argv)`: `yt8m ARGV...` in this process (for commands that load torch: no second start-up); an
    exception that escapes the command is printed, as the traceback a user would see."""
    from yt8m import cli

    def run(*argv: str) -> Outcome:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            try:
                status = cli.main(list(argv))
            except SystemExit as exit_:
                status = exit_.code if isinstance(exit_.code, int) else 1
            except Exception:
                traceback.print_exc()
                status = 1
        return record(test, Outcome(argv[0], status, out.getvalue(), err.getvalue()))

    return run


@pytest.fixture
def yt8m(request) -> Callable[..., Outcome]:
    """`yt8m(*argv, timeout=, env=, cwd=)` -> Outcome: the command in a process of its own, as a user runs it."""
    return process_runner(request.node.nodeid)


@pytest.fixture
def yt8m_here(request) -> Callable[..., Outcome]:
    """`yt8m_here(*argv)` -> Outcome: the command in this process."""
    return in_process_runner(request.node.nodeid)

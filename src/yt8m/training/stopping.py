"""Stopping a run at its next safe point, never where a signal lands: Ctrl+C and SIGTERM note a request, and so does a
deadline passing (a tuning trial's --trial_timeout, the study's --timeout); the training loop looks at it between steps
and after each validation, and stops there with nothing half written. No exception is raised inside training."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class StopReason:
    """Why a run stops early: `interrupted` (a signal; the run is resumed or its trial re-queued), else a limit
    (`limit`: the deadline's name, e.g. --trial_timeout) whose run keeps what it validated."""

    message: str
    interrupted: bool
    limit: str = ""


@dataclass
class StopRequests:
    """This process's requests to stop: the first Ctrl+C or SIGTERM noted, and the deadlines set (by time.monotonic),
    the nearest first. `on_signal` runs as a signal is noted (a tune job's watchdog starts its grace)."""

    signal_noted: Optional[int] = None
    deadlines: dict[str, float] = field(default_factory=dict)
    on_signal: Callable[[], None] = lambda: None

    def note_signal(self, signum: int) -> None:
        if self.signal_noted is None:
            self.signal_noted = signum
            self.on_signal()

    def reason(self) -> Optional[StopReason]:
        """Why the run should stop now, or None: a noted signal first, else the first deadline passed."""
        if self.signal_noted is not None:
            return StopReason(f"stopped by {signal.Signals(self.signal_noted).name}", interrupted=True)
        now = time.monotonic()
        for name, when in sorted(self.deadlines.items(), key=lambda item: item[1]):
            if now >= when:
                return StopReason(f"{name} reached", interrupted=False, limit=name)
        return None

    @property
    def interrupted(self) -> bool:
        return self.signal_noted is not None

    def seconds_left(self) -> dict[str, float]:
        """Each deadline's seconds from now (0 where passed): what a process this one starts is to keep."""
        now = time.monotonic()
        return {name: max(0.0, when - now) for name, when in self.deadlines.items()}

    @contextlib.contextmanager
    def deadline(self, name: str, seconds: Optional[float]) -> Iterator[None]:
        """Within the block, the run stops once `seconds` have passed (no deadline for None)."""
        if seconds is None:
            yield
            return
        self.deadlines[name] = time.monotonic() + seconds
        try:
            yield
        finally:
            self.deadlines.pop(name, None)


class TrainingInterrupted(Exception):
    """A run stopped by Ctrl+C or SIGTERM with its progress saved: one line, exit status 130 (yt8m.cli), and the same
    command resumes it."""

    exit_status = 130  # 128 + SIGINT, as a shell reports Ctrl+C; yt8m.cli exits with it


def raise_if_interrupted(summary: dict[str, Any]) -> None:
    """The summary of a run a signal stopped as TrainingInterrupted (a tuning trial reads the summary instead)."""
    if summary.get("interrupted"):
        saved = summary.get("checkpoint")
        where = f"its progress is in {saved}" if saved else "nothing was trained yet"
        raise TrainingInterrupted(f"{summary['stopped']} at step {summary['global_step']}: {where}; run the same "
                                  "command to resume")


STOPS = StopRequests()  # this process's: what noting_signals' handlers and the limits write, the loop reads


@contextlib.contextmanager
def noting_signals(again: str = "exit") -> Iterator[StopRequests]:
    """Within the block, SIGINT and SIGTERM note a stop request instead of raising KeyboardInterrupt wherever the
    main thread is. A second one `again="exit"`s the process as the signal would (a person insisting on Ctrl+C), or
    is ignored (`"ignore"`: a tune job, whose parent passes the same Ctrl+C on). Outside the main thread (which alone
    receives signals), and within a block already noting them, nothing changes."""
    if threading.current_thread() is not threading.main_thread() or _installed:
        yield STOPS
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def note(signum: int, frame: Any) -> None:
        if STOPS.signal_noted is not None and again == "exit":
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        STOPS.note_signal(signum)

    _installed.append(True)
    STOPS.signal_noted = None  # a request of an earlier run (a notebook's) is not this one's
    for signum in STOP_SIGNALS:
        signal.signal(signum, note)
    try:
        yield STOPS
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        _installed.clear()
        STOPS.signal_noted = None  # taken by this block's run: the next run starts unasked


_installed: list[bool] = []

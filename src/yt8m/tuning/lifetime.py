"""How long a tune job process lives: it never outlives the tune process nor an interrupt it was sent by more than a
grace period, whatever became of the interrupt, and the tune process stops its jobs within one too.

The parent-death signal (PR_SET_PDEATHSIG) and the KeyboardInterrupt a signal raises are the quick way out; they
can fail: an interrupt raised where a library swallows it (an `except BaseException`, a finalizer, a C callback)
leaves a job training on, deaf to the next signals (it is interrupted once), and the death signal is sent when the
*thread* that started the job ends, or never where the job was started by an intermediary. A watchdog thread in each
job checks its parent and its interrupt instead, every half second, and ends it with os._exit past the grace.
One moment is never cut: a job's start of a trial, from counting the budget until the trial says whose it is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

from yt8m.tuning.study import FileLock

# Time a job has to record its interrupted trial (its normal way out) before it is ended.
GRACE_SECS = 10.0
WATCH_EVERY_SECS = 0.5
_interrupted_at: list[float] = []  # when this process was first interrupted (its signal handler notes it)


class JobProcess(Protocol):
    """What stop_jobs uses of a multiprocessing.Process."""

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def join(self, timeout: Optional[float] = None) -> None: ...

    def is_alive(self) -> bool: ...


def note_interrupt() -> None:
    """This process was sent an interrupt (SIGINT, SIGTERM, its parent's death): it has GRACE_SECS to end."""
    if not _interrupted_at:
        _interrupted_at.append(time.monotonic())


def watch_over_job(parent_pid: int, exit_status: int, grace: float = GRACE_SECS,
                   end: Callable[[int], None] = os._exit) -> threading.Thread:
    """Start the job's watchdog: once its parent is gone or it was interrupted, it has `grace` seconds to end before
    `end(exit_status)` ends it."""
    def watch() -> None:
        orphaned_at: Optional[float] = None
        while True:
            time.sleep(WATCH_EVERY_SECS)
            now = time.monotonic()
            if orphaned_at is None and os.getppid() != parent_pid:
                orphaned_at = now
            started = min([*_interrupted_at, *([orphaned_at] if orphaned_at is not None else [])], default=None)
            if started is not None and now - started > grace:
                end(exit_status)
                return

    thread = threading.Thread(target=watch, name="yt8m-job-watchdog", daemon=True)
    thread.start()
    return thread


def stop_jobs(jobs: Sequence[JobProcess], grace: float = GRACE_SECS) -> None:
    """Pass an interrupt on to the jobs (SIGTERM), wait up to `grace` seconds for them to record their trials, then
    kill those still running: a job whose interrupt was lost must not hold the tune process (and itself) forever."""
    for job in jobs:
        job.terminate()
    deadline = time.monotonic() + grace
    for job in jobs:
        job.join(max(0.0, deadline - time.monotonic()))
    for job in jobs:
        if job.is_alive():
            job.kill()
            job.join()


class SignalHold:
    """Signals that wait: while held, each of `signums` that arrives is noted (and `on_hold` called) instead of
    handled; on release the first noted one is raised again, to the handler it was meant for. Only in the main thread,
    the one that receives signals and may set their handlers."""

    def __init__(self, signums: Sequence[int], on_hold: Callable[[], None] = lambda: None) -> None:
        self.signums, self.on_hold = tuple(signums), on_hold
        self._handlers: dict[int, Any] = {}
        self._pending: Optional[int] = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.hold()
        try:
            yield
        finally:
            self.release()

    def hold(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        # A handler set outside Python (getsignal: None) could not be put back: such a signal is not held.
        self._handlers = {signum: signal.signal(signum, self._hold) for signum in self.signums
                          if signal.getsignal(signum) is not None}

    def release(self) -> None:
        handlers, self._handlers = self._handlers, {}
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        pending, self._pending = self._pending, None
        if pending is not None:
            signal.raise_signal(pending)  # as if it arrived now

    def _hold(self, signum: int, frame: Any) -> None:
        if self._pending is None:
            self._pending = signum
        self.on_hold()


class TrialStartLock:
    """This machine's budget lock, held by a job from counting the budget until its next trial is RUNNING and
    stamped with the job's process, so that its jobs never start more than --n_trials. Ctrl+C and SIGTERM wait
    while it is held: a trial cut between its creation and its stamp would stay RUNNING with no process to judge
    it by, and count toward the budget for ever. The signal is delivered once the lock is released."""

    def __init__(self, path: str) -> None:
        self._file = FileLock(path)
        # A job's watchdog still ends it after the grace, should the start hang.
        self._interrupts = SignalHold((signal.SIGINT, signal.SIGTERM), on_hold=note_interrupt)

    @contextlib.contextmanager
    def held(self) -> Iterator["TrialStartLock"]:
        with self._file.held():
            self._interrupts.hold()
            try:
                yield self
            finally:
                self.release()

    def release(self) -> None:
        self._file.release()
        self._interrupts.release()

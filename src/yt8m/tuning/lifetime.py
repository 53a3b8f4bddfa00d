"""How long a tune job process lives: it never outlives the tune process nor an interrupt it was sent by more than a
grace period, and the tune process stops its jobs within one too.

An interrupt only asks the job's training to stop at its next step (yt8m.training.stopping), and the parent-death
signal (PR_SET_PDEATHSIG) is sent when the *thread* that started the job ends, or never where the job was started by
an intermediary: a job stuck in a step or a long call, or orphaned, would live on. A watchdog thread in each job checks
its parent and its interrupt, every half second, and ends it with os._exit past the grace.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable, Iterator, Optional, Protocol, Sequence

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


class TrialStartLock:
    """This machine's budget lock, held by a job from counting the budget until its next trial is RUNNING and
    stamped with the job's process, so that its jobs never start more than --n_trials. A signal meanwhile only asks
    the trial to stop: it is taken once the trial is stamped, which ends it as interrupted (re-queued)."""

    def __init__(self, path: str) -> None:
        self._file = FileLock(path)

    @contextlib.contextmanager
    def held(self) -> Iterator["TrialStartLock"]:
        with self._file.held():
            yield self

    def release(self) -> None:
        self._file.release()

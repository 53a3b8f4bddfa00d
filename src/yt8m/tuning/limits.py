"""A tuning run's time limits: the study's --timeout, which ends the running trials as Ctrl+C does (interrupted and
re-queued), and --trial_timeout, which stops a trial that runs longer (scored by its best validated epoch); both
delivered by a timer signal.

A limit interrupts the trial wherever it is (a training step, an evaluation, a slow first batch), as Ctrl+C would: the
trainer and the objective are built to stop cleanly there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from typing import Any, Iterator, Optional

from yt8m.fields import setting
from yt8m.tuning.lifetime import SignalHold


class StudyDeadline(KeyboardInterrupt):
    """The run's --timeout passed while a trial ran: the trial ends as an interrupted one does (re-queued)."""


class TrialTimeLimit(KeyboardInterrupt):
    """The trial ran past --trial_timeout: it ends scored by its best validated epoch."""


def limits_held() -> contextlib.AbstractContextManager[None]:
    """A limit waits while a trial records a validation, so that its value and its reports to the pruner stay the
    same validations; one that passed meanwhile stops the trial right after."""
    return SignalHold((signal.SIGALRM,)).held()


@dataclasses.dataclass(frozen=True)
class RunFlags:
    """`yt8m tune` flags beside the tuning file's `tune:` settings."""

    train_data_pattern: str = setting("", "Train every trial on these shards instead of the file's "
                                          "train.train_data_pattern (a study keeps its data: another pattern is "
                                          "another study).")
    eval_data_pattern: str = setting("", "Score every trial on these shards instead of the file's "
                                         "train.eval_data_pattern.")


@dataclasses.dataclass(frozen=True)
class RunLimits:
    """When this run stops its trials: `deadline` (time.time()) from --timeout, `trial_timeout` seconds a trial."""

    timeout: Optional[float] = None
    deadline: Optional[float] = None
    trial_timeout: Optional[float] = None

    @classmethod
    def starting_now(cls, timeout: Optional[float], trial_timeout: Optional[float]) -> "RunLimits":
        return cls(timeout, time.time() + timeout if timeout else None, trial_timeout)

    def passed(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """While a trial runs: at the nearer limit, its exception is raised in this (the main) thread."""
        limit = self._nearest(time.time())
        if limit is None or not hasattr(signal, "setitimer"):
            yield
            return
        seconds, error = limit

        def expire(signum: int, frame: Any) -> None:
            raise error

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def _nearest(self, now: float) -> Optional[tuple[float, KeyboardInterrupt]]:
        limits: list[tuple[float, KeyboardInterrupt]] = []
        if self.deadline is not None:
            limits.append((self.deadline - now, StudyDeadline(f"--timeout {self.timeout:g} s reached")))
        if self.trial_timeout is not None:
            limits.append((self.trial_timeout, TrialTimeLimit(f"ran past --trial_timeout {self.trial_timeout:g} s")))
        return min(limits, key=lambda limit: limit[0]) if limits else None

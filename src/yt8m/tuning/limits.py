"""A tuning run's time limits: the study's --timeout, after which no trial starts and the running ones stop (each
scored by its best validated epoch; one without a validation is re-queued), and --trial_timeout, which stops a trial
that runs longer (scored by its best validated epoch). Both are deadlines the training loop looks at between steps
(yt8m.training.stopping): a limit never interrupts a step, an evaluation or a record being written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Iterator, Optional

from yt8m.fields import setting
from yt8m.training.stopping import STOPS

STUDY_DEADLINE = "--timeout"
TRIAL_TIME_LIMIT = "--trial_timeout"


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
    def set_for_trial(self) -> Iterator[None]:
        """While a trial runs, its training stops at the first step end past either limit."""
        left = None if self.deadline is None else max(0.0, self.deadline - time.time())
        with STOPS.deadline(STUDY_DEADLINE, left), STOPS.deadline(TRIAL_TIME_LIMIT, self.trial_timeout):
            yield

    def describe(self, limit: str) -> str:
        """A limit by its flag and value, as a trial's record says it."""
        return f"{STUDY_DEADLINE} {self.timeout:g} s reached" if limit == STUDY_DEADLINE else \
            f"ran past {TRIAL_TIME_LIMIT} {self.trial_timeout:g} s"

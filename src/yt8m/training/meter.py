"""Training speed as the loop measures it: examples/s per step and in the steady state, the share of time spent
waiting for input, and the steps a run will take and the time it has left."""

from __future__ import annotations

import datetime
import time
from typing import Optional

# Steps left out of the steady-state examples/s: worker start-up, allocator warm-up, first-touch page faults.
WARMUP_STEPS = 5


class ThroughputMeter:
    """Per-step examples/s and the share of time spent waiting for input, plus the steady-state rate."""

    def __init__(self) -> None:
        self.steps = 0
        self.wait_started = self.data_ready_at = time.perf_counter()
        self.steady_examples = 0
        self.steady_seconds = 0.0
        self.steady_wait = 0.0
        self.all_examples = 0
        self.all_seconds = 0.0

    def start_wait(self) -> None:
        self.wait_started = time.perf_counter()

    def data_ready(self) -> None:
        self.data_ready_at = time.perf_counter()

    def step_done(self, examples: int) -> float:
        now = time.perf_counter()
        seconds = now - self.wait_started
        self.steps += 1
        self.all_examples += examples
        self.all_seconds += seconds
        if self.steps > WARMUP_STEPS:
            self.steady_examples += examples
            self.steady_seconds += seconds
            self.steady_wait += self.data_ready_at - self.wait_started
        return examples / max(seconds, 1e-9)

    def steady_examples_per_sec(self) -> float:
        if self.steady_seconds > 0:
            return self.steady_examples / self.steady_seconds
        return self.all_examples / self.all_seconds if self.all_seconds > 0 else 0.0

    def input_wait_fraction(self) -> float:
        return self.steady_wait / self.steady_seconds if self.steady_seconds > 0 else 0.0

    def seconds_per_step(self) -> Optional[float]:
        steps, seconds = (self.steps - WARMUP_STEPS, self.steady_seconds) if self.steps > WARMUP_STEPS else \
            (self.steps, self.all_seconds)
        return seconds / steps if steps else None


class RunEstimate:
    """The steps a run takes: --num_epochs at the steps an epoch takes (counted once one has ended; within the first,
    from the share of its data read so far), at most --max_steps; and the time left at the measured step time."""

    def __init__(self, num_epochs: int, max_steps: Optional[int]):
        self.num_epochs, self.max_steps = num_epochs, max_steps
        self.steps_per_epoch: Optional[float] = None

    def epoch_ended(self, steps: int) -> None:
        if steps:
            self.steps_per_epoch = steps

    def total_steps(self, step: int, epoch: int, steps_in_epoch: int, fraction: Optional[float]) -> Optional[int]:
        """`step` done, `epoch` epochs completed and `steps_in_epoch` steps into the next, `fraction` of its data
        read (None: unknown)."""
        per_epoch = self.steps_per_epoch or (steps_in_epoch / fraction if fraction else None)
        by_epochs = None if per_epoch is None else round(step - steps_in_epoch + per_epoch * (self.num_epochs - epoch))
        if self.max_steps is None:
            return by_epochs
        return self.max_steps if by_epochs is None else min(by_epochs, self.max_steps)

    @staticmethod
    def time_left(step: int, total: Optional[int], seconds_per_step: Optional[float]) -> Optional[str]:
        if total is None or seconds_per_step is None:
            return None
        return str(datetime.timedelta(seconds=round(max(total - step, 0) * seconds_per_step)))

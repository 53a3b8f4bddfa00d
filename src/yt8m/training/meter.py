"""Training speed as the loop measures it: examples/s per step and in the steady state, and the share of time
spent waiting for input."""

from __future__ import annotations

import time

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

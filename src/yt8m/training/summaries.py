"""What training shows and records per step: the progress bar, the log line with the batch's metrics (the tasks':
yt8m.tasks), the speed and time left (meter.py), and the TensorBoard scalars (through yt8m.io.summaries)."""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Optional, Sequence

from tqdm import tqdm

from yt8m.io.summaries import summary_writer, write_scalars
from yt8m.training.meter import RunEstimate, ThroughputMeter

log = logging.getLogger("yt8m.train")


# How the log line names a batch metric; others go by their own name.
SHORT_NAMES = {"hit_at_one": "hit@1"}


class StepLog:
    """The progress bar, log lines and scalars of a run's steps: a line every `log_every` steps, with the batch's
    metrics every `metrics_every`, the total steps and the time left estimated from the epochs and steps asked for
    and the share of the epoch read (`epoch_fraction()`). Summaries go to `train_dir`; None: this process writes
    none and shows no bar (every rank of a distributed run but 0)."""

    def __init__(self, log_every: int, metrics_every: int, estimate: RunEstimate, train_dir: Optional[str],
                 epoch_fraction: Callable[[], Optional[float]]):
        self.log_every, self.metrics_every, self.estimate = log_every, metrics_every, estimate
        self.train_dir, self.epoch_fraction = train_dir, epoch_fraction
        self.meter = ThroughputMeter()
        self.bar: Any = None
        self.writer: Any = None

    def open(self, step: int) -> None:
        """Start at `step` (a resumed run's bar and summaries continue from its checkpoint's)."""
        self.bar = tqdm(total=self.estimate.max_steps, initial=step, unit="step", dynamic_ncols=True,
                        disable=not (self.train_dir is not None and sys.stderr.isatty()))
        self.writer = summary_writer(self.train_dir, step) if self.train_dir is not None else None

    def wants_metrics(self, step: int) -> bool:
        return step % self.metrics_every == 0

    def record(self, step: int, epoch: int, steps_in_epoch: int, scalars: dict[str, float],
               shown: Sequence[str]) -> None:
        """Step `step` (in epoch `epoch`, counted from 0, `steps_in_epoch` into it) is done: its scalars ("loss",
        "learning_rate", "examples_per_sec", the batch's metrics `shown` in the log line, the tasks' losses)."""
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{scalars['loss']:.4f}", ex_s=f"{scalars['examples_per_sec']:.0f}", refresh=False)
        if not (self.wants_metrics(step) or step % self.log_every == 0):
            return
        total = self.estimate.total_steps(step, epoch, steps_in_epoch, self.epoch_fraction())
        self.bar.total = total
        time_left = RunEstimate.time_left(step, total, self.meter.seconds_per_step())
        log_step(step, epoch, scalars, self.meter, shown, total, self.estimate.num_epochs, time_left)
        write_scalars(self.writer, scalars, step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


def log_step(step: int, epoch: int, scalars: dict[str, float], meter: ThroughputMeter,
             batch_metrics: Sequence[str] = (), total_steps: Optional[int] = None, epochs: Optional[int] = None,
             time_left: Optional[str] = None) -> None:
    """The log line of step `step` (of `total_steps`, when known) in epoch `epoch` (counted from 0, of `epochs`);
    `batch_metrics` names the scalars that are the batch's metrics (none: not shown); `time_left` the ETA."""
    of_total = f"/{total_steps}" if total_steps else ""
    of_epochs = f"/{epochs}" if epochs else ""
    text = (f"step {step}{of_total} | epoch {epoch + 1}{of_epochs} | loss {scalars['loss']:.5f} | "
            f"{scalars['examples_per_sec']:.0f} examples/s | input wait {meter.input_wait_fraction():.0%}")
    if batch_metrics:
        text += " | " + " ".join(f"{SHORT_NAMES.get(name, name)} {scalars[name]:.3f}" for name in batch_metrics)
    if time_left:
        text += f" | ETA {time_left}"
    log.info(text)

"""What training logs per step: the log line with the batch's metrics (the tasks': yt8m.tasks); its TensorBoard
scalars go through yt8m.io.summaries."""

from __future__ import annotations

import logging
from typing import Sequence

from yt8m.training.meter import ThroughputMeter

log = logging.getLogger("yt8m.train")


# How the log line names a batch metric; others go by their own name.
SHORT_NAMES = {"hit_at_one": "hit@1"}


def log_step(step: int, epoch: int, scalars: dict[str, float], meter: ThroughputMeter,
             batch_metrics: Sequence[str] = ()) -> None:
    """The log line of step `step` in epoch `epoch` (counted from 0); `batch_metrics` names the scalars that are
    the batch's metrics (none: not shown)."""
    text = (f"step {step} | epoch {epoch + 1} | loss {scalars['loss']:.5f} | "
            f"{scalars['examples_per_sec']:.0f} examples/s | input wait {meter.input_wait_fraction():.0%}")
    if batch_metrics:
        text += " | " + " ".join(f"{SHORT_NAMES.get(name, name)} {scalars[name]:.3f}" for name in batch_metrics)
    log.info(text)

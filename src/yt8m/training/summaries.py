"""What training logs per step: the log line with the batch's metrics (the tasks': yt8m.tasks); its TensorBoard
scalars go through yt8m.io.summaries."""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from yt8m.training.meter import ThroughputMeter

log = logging.getLogger("yt8m.train")


# How the log line names a batch metric; others go by their own name.
SHORT_NAMES = {"hit_at_one": "hit@1"}


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

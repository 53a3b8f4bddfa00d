"""What training logs and summarizes per step: the batch's Hit@1 / PERR / GAP, the log line, and TensorBoard
scalars in the train dir."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from yt8m.extras import available
from yt8m.training.meter import ThroughputMeter

if TYPE_CHECKING:
    from yt8m.training.loop import Progress

log = logging.getLogger("yt8m.train")


def batch_metrics(predictions: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Hit@1, PERR and GAP@20 of one batch, from one ranking of its predictions (not one per metric)."""
    from yt8m.metrics import EvaluationMetrics

    metrics = EvaluationMetrics(predictions.shape[1])
    metrics.accumulate(predictions.detach().float().cpu().numpy(), labels.detach().cpu().numpy())
    scores = metrics.get()
    return {"hit_at_one": scores["hit_at_one"], "perr": scores["perr"], "gap": scores["gap"]}


def log_step(progress: "Progress", scalars: dict[str, float], meter: ThroughputMeter) -> None:
    text = (f"step {progress.step} | epoch {progress.epoch + 1} | loss {scalars['loss']:.5f} | "
            f"{scalars['examples_per_sec']:.0f} examples/s | input wait {meter.input_wait_fraction():.0%}")
    if "gap" in scalars:
        text += f" | hit@1 {scalars['hit_at_one']:.3f} perr {scalars['perr']:.3f} gap {scalars['gap']:.3f}"
    log.info(text)


def summary_writer(directory: str, step: int = 0):
    """A TensorBoard writer of `directory` resuming at `step`, or None without the tensorboard extra (then the
    curves are not written, said once)."""
    if not available("tensorboard", "TensorBoard curves are not written"):
        return None
    from torch.utils.tensorboard import SummaryWriter

    # purge_step drops events a crashed run wrote after its last checkpoint, so curves do not fold back.
    return SummaryWriter(directory, purge_step=step + 1 if step else None)


def write_scalars(writer, scalars: dict[str, float], step: int) -> None:
    if writer is not None:
        for name, value in scalars.items():
            writer.add_scalar(name, value, step)

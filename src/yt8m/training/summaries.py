"""What training logs and summarizes per step: the log line with the batch's metrics (the task's: yt8m.tasks.video), and
TensorBoard scalars in the train dir."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Sequence

from yt8m.io import storage
from yt8m.optional import available
from yt8m.training.meter import ThroughputMeter

if TYPE_CHECKING:
    from yt8m.training.loop import Progress

log = logging.getLogger("yt8m.train")


# How the log line names a batch metric; others go by their own name.
SHORT_NAMES = {"hit_at_one": "hit@1"}


def log_step(progress: "Progress", scalars: dict[str, float], meter: ThroughputMeter,
             batch_metrics: Sequence[str] = ()) -> None:
    """The step's log line; `batch_metrics` names the scalars that are the batch's metrics (none: not shown)."""
    text = (f"step {progress.step} | epoch {progress.epoch + 1} | loss {scalars['loss']:.5f} | "
            f"{scalars['examples_per_sec']:.0f} examples/s | input wait {meter.input_wait_fraction():.0%}")
    if batch_metrics:
        text += " | " + " ".join(f"{SHORT_NAMES.get(name, name)} {scalars[name]:.3f}" for name in batch_metrics)
    log.info(text)


def summary_writer(directory: str, step: int = 0):
    """A TensorBoard writer of `directory` resuming at `step`, or None without the tensorboard extra (then the
    curves are not written, said once)."""
    if not available("tensorboard", "TensorBoard curves are not written"):
        return None
    if not storage.is_local(directory):
        _say_once(f"TensorBoard curves are written to a local train dir only, not to {directory}")
        return None
    from torch.utils.tensorboard import SummaryWriter

    # purge_step drops events a crashed run wrote after its last checkpoint, so curves do not fold back.
    return SummaryWriter(directory, purge_step=step + 1 if step else None)


@functools.lru_cache(maxsize=None)
def _say_once(message: str) -> None:
    log.info("%s", message)


def write_scalars(writer, scalars: dict[str, float], step: int) -> None:
    if writer is not None:
        for name, value in scalars.items():
            writer.add_scalar(name, value, step)

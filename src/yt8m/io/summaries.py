"""TensorBoard scalars of a train dir (training's curves, evaluation's metrics), where the tensorboard extra is
installed and the train dir is local."""

from __future__ import annotations

import functools
import logging

from yt8m.io import storage
from yt8m.optional import available

log = logging.getLogger("yt8m")


def summary_writer(directory: str, step: int = 0):
    """A TensorBoard writer of `directory` resuming at `step`, or None without the tensorboard extra (then the
    curves are not written, said once)."""
    if not available("tensorboard", "TensorBoard curves are not written"):
        return None
    if not storage.is_local(directory):
        _say_once(f"TensorBoard curves are written to a local train dir only, not to {directory}")
        return None
    from torch.utils.tensorboard import SummaryWriter  # the tensorboard extra

    # purge_step drops events a crashed run wrote after its last checkpoint, so curves do not fold back.
    return SummaryWriter(directory, purge_step=step + 1 if step else None)


@functools.lru_cache(maxsize=None)
def _say_once(message: str) -> None:
    log.info("%s", message)


def write_scalars(writer, scalars: dict[str, float], step: int) -> None:
    if writer is not None:
        for name, value in scalars.items():
            writer.add_scalar(name, value, step)

"""Averages of a model's weights, an exponential moving average (--ema_decay) or stochastic weight averaging
(--swa_start_epoch): the weights a run evaluates, checkpoints as its model, exports and predicts with, while the
optimizer steps the live ones."""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch
from torch import nn


class WeightAverage:
    """A copy of the model whose parameters follow the live ones after every optimizer step:
    average = d * average + (1 - d) * live, with d = min(decay, (1 + n) / (10 + n)) at the n-th update (TensorFlow's
    ExponentialMovingAverage with num_updates), so that early checkpoints are not held back by the initial weights.
    Buffers (batch-norm statistics) are copied from the live model.

    Not torch.optim.swa_utils.AveragedModel: its averaging function gets the update count as a device tensor, so the
    warm-up decay would cost a host sync per step on CUDA."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0 < decay < 1:
            raise ValueError(f"ema_decay must be in (0, 1), got {decay}")
        self.model = copy.deepcopy(model).requires_grad_(False)
        self.decay = decay
        self.updates = 0  # a resumed run sets the checkpoint's step

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self, live: nn.Module) -> None:
        self.updates += 1
        torch._foreach_lerp_(list(self.model.parameters()), [p.detach() for p in live.parameters()],
                             1 - self.current_decay())
        for averaged, current in zip(self.model.buffers(), live.buffers()):
            averaged.copy_(current)


class EpochAverage:
    """Stochastic weight averaging (--swa_start_epoch; Izmailov et al. 2018): the equal average of the weights at
    the end of each epoch from `start_epoch` on. Before its first snapshot there is none (`model` is None: the live
    weights are evaluated). Buffers (batch-norm statistics) are the live model's latest, not recomputed over the
    training data for the averaged weights as the paper's bn_update does: exact for models without batch norm (the
    video-level ones), an approximation for the others."""

    def __init__(self, start_epoch: int):
        if start_epoch < 1:
            raise ValueError(f"swa_start_epoch must be at least 1, got {start_epoch}")
        self.start_epoch = start_epoch
        self.model: Optional[nn.Module] = None
        self.snapshots = 0

    def snapshots_at(self, epoch: int) -> int:
        """The snapshots averaged once `epoch` epochs are complete."""
        return max(0, epoch - self.start_epoch + 1)

    @torch.no_grad()
    def end_epoch(self, live: nn.Module, epoch: int) -> None:
        """Add the live weights at the end of epoch `epoch` (counted from 1) to the average, from start_epoch on."""
        if epoch < self.start_epoch:
            return
        self.snapshots += 1
        if self.model is None:
            self.model = copy.deepcopy(live).requires_grad_(False)
            return
        torch._foreach_lerp_(list(self.model.parameters()), [p.detach() for p in live.parameters()],
                             1.0 / self.snapshots)
        for averaged, current in zip(self.model.buffers(), live.buffers()):
            averaged.copy_(current)

    def restore(self, live: nn.Module, averaged: dict[str, Any], epoch: int, load: Callable[..., None]) -> None:
        """A resumed run's average: the checkpoint's evaluated weights (`averaged`) once snapshots were taken."""
        self.snapshots = self.snapshots_at(epoch)
        if self.snapshots:
            self.model = copy.deepcopy(live).requires_grad_(False)
            load(self.model, averaged)

"""An exponential moving average of a model's weights (--ema_decay): the weights a run evaluates, checkpoints as
its model, exports and predicts with, while the optimizer steps the live ones."""

from __future__ import annotations

import copy

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

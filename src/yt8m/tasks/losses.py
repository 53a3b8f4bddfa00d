"""The starter kit's label losses by `--label_loss` name: CrossEntropyLoss, HingeLoss, SoftmaxLoss.

Each is called as `loss_fn(model_output, labels, label_weights=None)` and returns the mean over the batch of a
per-video sum; label weights (the 2019 segment task: 1 for rated classes) multiply each (example, class) term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from yt8m.fields import setting


class CrossEntropyLoss(nn.Module):
    """Binary cross-entropy summed over classes, averaged over videos (the starter kit's
    reduce_mean(reduce_sum(ce, 1))), computed from logits: exact where the starter kit's
    log(p + 1e-5) form saturates at confident predictions."""

    def forward(self, output: dict[str, torch.Tensor], labels: torch.Tensor,
                label_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        logits = output["logits"].float()
        if label_weights is not None:
            weighted = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype),
                                                          weight=label_weights.to(logits.dtype), reduction="sum")
            return weighted / logits.shape[0]
        predictions = output["predictions"].detach()
        if predictions.dtype != logits.dtype:  # e.g. under autocast: recompute at the loss's precision
            predictions = torch.sigmoid(logits.detach())
        if labels.dtype != torch.bool or labels.device.type != "cpu" or torch.compiler.is_compiling():
            labels = labels.to(logits.dtype)  # dense: NumPy's positives, below, would break a compiled graph
        return SummedBinaryCrossEntropy.apply(logits, predictions, labels)


class SummedBinaryCrossEntropy(torch.autograd.Function):
    """sum(softplus(x) - x * y) / batch, equal to BCE-with-logits summed over classes and averaged over
    videos; its gradient (sigmoid(x) - y) / batch reuses the model's predictions instead of recomputing
    sigmoid (element-wise passes dominate the step on CPU).

    Labels are the reader's bool multi-hot tensor on the CPU, taken by the few positives' flat index so that x * y
    and - y touch only those entries, or dense floats. (A fused C pass of the sum and gradient was deleted: it
    gained 1-3% of LogisticModel's step, bench/README.md.)"""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, predictions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        batch = logits.shape[0]
        ctx.positives = None
        if labels.dtype == torch.bool:
            # NumPy's flatnonzero: 0.56 ms for 1024 x 3862, torch's nonzero 1.6.
            ctx.positives = torch.from_numpy(np.flatnonzero(labels.numpy()))
            ctx.save_for_backward(predictions)
            cross_term = logits.reshape(-1)[ctx.positives].sum()
        else:
            ctx.save_for_backward(predictions, labels)
            cross_term = torch.dot(logits.reshape(-1), labels.reshape(-1))
        return (F.softplus(logits).sum() - cross_term) / batch

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        scale = grad / ctx.saved_tensors[0].shape[0]
        if ctx.positives is not None:
            gradient = ctx.saved_tensors[0] * scale
            gradient.view(-1).index_put_((ctx.positives,), -scale, accumulate=True)
            return gradient, None, None
        predictions, labels = ctx.saved_tensors
        return torch.sub(predictions, labels).mul_(scale), None, None


class HingeLoss(nn.Module):
    """sum over classes of max(0, b - y * p) with y = +1/-1 and p the predicted probability (the
    starter kit applies it to the model's predictions), averaged over videos."""

    def __init__(self, b: float = 1.0):
        super().__init__()
        self.b = b

    def forward(self, output: dict[str, torch.Tensor], labels: torch.Tensor,
                label_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        predictions = output["predictions"].float()
        signs = 2 * labels.to(predictions.dtype) - 1
        hinge = torch.clamp(self.b - signs * predictions, min=0)
        if label_weights is not None:
            hinge = hinge * label_weights.to(hinge.dtype)
        return hinge.sum(dim=1).mean()


class SoftmaxLoss(nn.Module):
    """Cross-entropy between each video's labels normalized to sum 1 and a softmax over the
    predicted probabilities, as the starter kit computes it; a video without labels adds 0.

    Label weights have no meaning here: the softmax spans every class, rated or not, so the segment task refuses
    this loss (WEIGHTED_LOSSES, checked with the config)."""

    def forward(self, output: dict[str, torch.Tensor], labels: torch.Tensor,
                label_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        if label_weights is not None:
            raise ValueError("SoftmaxLoss takes no label weights: its softmax spans every class, rated or not")
        predictions = output["predictions"].float()
        labels = labels.to(predictions.dtype)
        normalized = labels / labels.sum(dim=1, keepdim=True).clamp(min=1e-7)
        return -(normalized * F.log_softmax(predictions, dim=1)).sum(dim=1).mean()


LOSSES: dict[str, type[nn.Module]] = {cls.__name__: cls for cls in (CrossEntropyLoss, HingeLoss, SoftmaxLoss)}
# The losses whose per-(example, class) terms label weights can multiply (the segment task's losses).
WEIGHTED_LOSSES = ("CrossEntropyLoss", "HingeLoss")


@dataclass(frozen=True)
class LossConfig:
    """The `loss` section: the label loss a run's task learns (and eval reports)."""

    name: str = setting("CrossEntropyLoss", "Loss: CrossEntropyLoss, HingeLoss or SoftmaxLoss.", flag="label_loss",
                        choices=lambda: list(LOSSES))


def create_loss(name: str) -> nn.Module:
    if name not in LOSSES:
        raise ValueError(f"unknown label loss {name!r}; known losses: {', '.join(LOSSES)}")
    return LOSSES[name]()

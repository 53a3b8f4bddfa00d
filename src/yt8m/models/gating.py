"""Context gating (Miech, Laptev, Sivic 2017, "Learnable pooling with Context Gating", Sec. 3.2), the layer the
YouTube-8M winners put after pooling and on class probabilities, and GatedMoeModel: a MoE whose output is gated."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from yt8m.models.base import SLIM_DECAY, BaseModel, MoeHParams, slim_batch_norm
from yt8m.models.registry import register_model
from yt8m.models.video import MoeModel, log_add_exp


class ContextGating(nn.Module):
    """y = x * sigmoid(BN(x W)), or x * sigmoid(x W + b) without batch norm: each unit re-weighted by what the others
    say (WILLOW Sec. 3.2; LOUPE's PoolingBaseModel.context_gating). W is [size, size]; the batch norm is slim's
    (epsilon 1e-3, moving averages decayed by `decay`)."""

    def __init__(self, size: int, batch_norm: bool = True, decay: float = SLIM_DECAY):
        super().__init__()
        scale = 1 / math.sqrt(size)  # LOUPE's initializers of gating_weights and gating_biases
        self.weight = nn.Parameter(torch.randn(size, size) * scale)
        self.norm = slim_batch_norm(size, decay) if batch_norm else None
        self.bias = None if batch_norm else nn.Parameter(torch.randn(size) * scale)

    def gate_logits(self, features: torch.Tensor) -> torch.Tensor:
        gates = features @ self.weight
        if self.norm is not None:
            return self.norm(gates)
        assert self.bias is not None  # a gate has a batch norm or a bias
        return gates + self.bias

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features * torch.sigmoid(self.gate_logits(features))


def gated_logits(logits: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
    """The logit of sigmoid(logits) * sigmoid(gate_logits), computed in log space so that it stays finite and exact
    where either probability rounds to 0 or 1: log(p g) - log(1 - p g), with 1 - p g = (1 - p) + p (1 - g)."""
    log_p, log_g = F.logsigmoid(logits), F.logsigmoid(gate_logits)
    return log_p + log_g - log_add_exp(F.logsigmoid(-logits), log_p + F.logsigmoid(-gate_logits))


@register_model(MoeHParams)
class GatedMoeModel(BaseModel):
    """MoeModel whose class probabilities go through context gating (WILLOW's classifier, Sec. 3.2 and 4.1; its
    video_level_models.MoeModel with --moe_prob_gating): p_gated = p * sigmoid(BN(p W)), W [classes, classes], so
    that a class's score can depend on the others'. As there, only the MoE's weights are L2-penalized, not W."""

    def __init__(self, feature_size: int, num_classes: int, hparams: MoeHParams = MoeHParams()):
        super().__init__(feature_size, num_classes, hparams)
        self.moe = MoeModel(feature_size, num_classes, hparams)
        self.gating = ContextGating(num_classes)

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor] = None) -> torch.Tensor:
        logits = self.moe.compute_logits(features, None)
        return gated_logits(logits, self.gating.gate_logits(torch.sigmoid(logits)))

"""Video-level models of the starter kit: LogisticModel and MoeModel (mixture of logistic experts),
on one feature vector per video."""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from yt8m.kernels import use_fused_kernels
from yt8m.kernels.ops import moe_mixture, run_major_linear
from yt8m.models.base import BaseModel, ClassifierHParams, MoeHParams, starter_linear
from yt8m.models.registry import register_model


@register_model(ClassifierHParams)
class LogisticModel(BaseModel):
    """One logistic regression per class, its weights L2-penalized."""

    def __init__(self, feature_size: int, num_classes: int, hparams: ClassifierHParams = ClassifierHParams()):
        super().__init__(feature_size, num_classes, hparams)
        self.linear = starter_linear(feature_size, num_classes)

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.linear(features)

    def penalized_weights(self) -> list[torch.Tensor]:
        return [self.linear.weight]


@register_model(MoeHParams)
class MoeModel(BaseModel):
    """Per class, a softmax gate over `moe_num_mixtures` logistic experts plus a dummy expert that
    always predicts 0: p = sum_i gate_i * sigmoid(expert_i).

    Logits are log p - log(1 - p), each side a logsumexp of gate activations and log-sigmoids, so they
    stay finite and exact where p rounds to 0 or 1 (1 - p = gate_dummy + sum_i gate_i * sigmoid(-expert_i)).
    """

    def __init__(self, feature_size: int, num_classes: int, hparams: MoeHParams = MoeHParams()):
        super().__init__(feature_size, num_classes, hparams)
        self.num_mixtures = mixtures = hparams.moe_num_mixtures
        self.gates = starter_linear(feature_size, num_classes * (mixtures + 1), bias=False)
        self.experts = starter_linear(feature_size, num_classes * mixtures)

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self._fused_mixture_applies(features):
            return self._fused_mixture(features)[0]
        return mixture_logits(self.gates(features), self.experts(features), self.num_mixtures)

    def compute_output(self, features: torch.Tensor,
                       num_frames: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        if self._fused_mixture_applies(features):
            logits, predictions = self._fused_mixture(features)
            return {"logits": logits, "predictions": predictions}
        return super().compute_output(features, num_frames)

    def _fused_mixture_applies(self, features: torch.Tensor) -> bool:
        return use_fused_kernels("moe", features, self.gates.weight, self.experts.weight)

    def _fused_mixture(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and probabilities in one pass each way (_kernels.c), from run-major layers."""
        mixtures = self.num_mixtures
        gates = run_major_linear(features, self.gates.weight, None, mixtures + 1)
        experts = run_major_linear(features, self.experts.weight, self.experts.bias, mixtures)
        return moe_mixture(gates, experts, mixtures)

    def penalized_weights(self) -> list[torch.Tensor]:
        return [self.gates.weight, self.experts.weight]


def mixture_logits(gates: torch.Tensor, experts: torch.Tensor, mixtures: int) -> torch.Tensor:
    """MoeModel's logits from gate logits [B, C * (M + 1)] and expert logits [B, C * M] (class-major) in eager
    PyTorch: the reference of the fused kernel, and what runs where it does not (GPU, bfloat16, export)."""
    batch, classes = gates.shape[0], gates.shape[1] // (mixtures + 1)
    # The gates' softmax normalizer is common to log p and log(1 - p), so it cancels from the logit; what is
    # left folds over the few mixtures with whole-[batch, classes] ops, as a softmax or logsumexp over a tiny
    # last axis is many times slower on CPU.
    gate_terms = gates.view(batch, classes, mixtures + 1).unbind(-1)
    expert_terms = experts.view(batch, classes, mixtures).unbind(-1)
    positive = [gate + F.logsigmoid(expert) for gate, expert in zip(gate_terms, expert_terms)]
    # log sigmoid(-x) = log sigmoid(x) - x
    negative = [gate_terms[mixtures]] + [term - expert for term, expert in zip(positive, expert_terms)]
    return functools.reduce(log_add_exp, positive) - functools.reduce(log_add_exp, negative)


def log_add_exp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(exp(a) + exp(b)), stable for finite inputs; its backward takes a few element-wise passes
    where torch.logaddexp's takes eight."""
    return a + F.softplus(b - a)

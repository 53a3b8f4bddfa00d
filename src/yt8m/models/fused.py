"""The models' fused CPU kernels (_kernels.c) as autograd functions: the MoE mixture (its eager reference is
`mixture_logits` in models/video.py) and DbofModel's cluster pooling (the reference: DbofModel's eager path);
`yt8m.kernels.use_fused_kernels` says when they run."""

from __future__ import annotations

import torch

from yt8m.kernels import _kernels, as_arrays, over_rows


class MoeMixture(torch.autograd.Function):
    """The MoE mixture's logits from gate logits [B, C * (M + 1)] and expert logits [B, C * M] (class-major, as
    the layers give them), with MoeModel's math; the backward recomputes what it needs from the inputs."""

    @staticmethod
    def forward(ctx, gates: torch.Tensor, experts: torch.Tensor, mixtures: int) -> torch.Tensor:
        rows, classes = gates.shape[0], gates.shape[1] // (mixtures + 1)
        logits = gates.new_empty((rows, classes))
        over_rows(_kernels.moe_forward, rows, *as_arrays(gates, experts, logits), classes, mixtures)
        ctx.save_for_backward(gates, experts)
        ctx.mixtures = mixtures
        return logits

    @staticmethod
    def backward(ctx, dlogits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        gates, experts = ctx.saved_tensors
        dgates, dexperts = torch.empty_like(gates), torch.empty_like(experts)
        over_rows(_kernels.moe_backward, gates.shape[0],
                  *as_arrays(gates, experts, dlogits.contiguous(), dgates, dexperts), dlogits.shape[1], ctx.mixtures)
        return dgates, dexperts, None


class BatchNormRelu6MaxPool(torch.autograd.Function):
    """DbofModel's cluster layer in training, [videos x frames, C] -> [videos, C]: batch norm with the batch's
    statistics, ReLU6, and the max over each video's frames, without the [videos x frames, C] activations eager
    PyTorch writes and reads a dozen times. Returns the pooled values and the batch mean and biased variance."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, frames: int,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows, channels = x.shape
        mean, var, invstd = (x.new_empty(channels) for _ in range(3))
        pooled = x.new_empty((rows // frames, channels))
        winner = torch.empty((rows // frames, channels), dtype=torch.int32)
        over_rows(_kernels.dbof_pool_forward, channels, *as_arrays(x, gamma, beta, mean, var, invstd, pooled, winner),
                  channels, frames, eps)
        ctx.save_for_backward(x, gamma, beta, mean, invstd, winner)
        ctx.frames = frames
        ctx.mark_non_differentiable(mean, var)
        return pooled, mean, var

    @staticmethod
    def backward(ctx, dpooled: torch.Tensor, _mean: torch.Tensor, _var: torch.Tensor):
        x, gamma, beta, mean, invstd, winner = ctx.saved_tensors
        dx, dgamma, dbeta = torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(beta)
        over_rows(_kernels.dbof_pool_backward, x.shape[1],
                  *as_arrays(x, gamma, beta, mean, invstd, dpooled.contiguous(), winner, dx, dgamma, dbeta),
                  x.shape[1], ctx.frames)
        return dx, dgamma, dbeta, None, None


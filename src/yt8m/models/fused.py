"""The models' fused CPU kernels (_kernels.c) as autograd functions: the MoE mixture on run-major layers (its eager
reference is `mixture_logits` in models/video.py) and DbofModel's cluster pooling (the reference: DbofModel's eager path);
`yt8m.kernels.use_fused_kernels` says when they run."""

from __future__ import annotations

from typing import Optional

import torch

from yt8m.kernels import _kernels, as_arrays, over_rows


class RunMajorLinear(torch.autograd.Function):
    """nn.Linear(x, weight, bias) for a layer whose outputs are `width` values per class (class-major: column
    c * width + j, as MoeModel's gates and experts), returned as `width` runs [width, batch, classes]: the layout
    the mixture kernels read in order. Each run is one matmul on a strided view of the weight, as fast as the
    whole layer's, where transposing the layer's output took as long as the mixture's math."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], width: int) -> torch.Tensor:
        runs = x.new_empty((width, x.shape[0], weight.shape[0] // width))
        for j, weight_run in enumerate(_weight_runs(weight, width)):
            if bias is None:
                torch.mm(x, weight_run.t(), out=runs[j])
            else:
                torch.addmm(bias.view(-1, width)[:, j], x, weight_run.t(), out=runs[j])
        ctx.save_for_backward(x, weight)
        ctx.width, ctx.has_bias = width, bias is not None
        return runs

    @staticmethod
    def backward(ctx, druns: torch.Tensor):
        x, weight = ctx.saved_tensors
        weight_runs = _weight_runs(weight, ctx.width)
        dx = dweight = dbias = None
        if ctx.needs_input_grad[0]:
            dx = torch.mm(druns[0], weight_runs[0])
            for j in range(1, ctx.width):
                dx.addmm_(druns[j], weight_runs[j])
        if ctx.needs_input_grad[1]:
            dweight = torch.empty_like(weight)
            for j, dweight_run in enumerate(_weight_runs(dweight, ctx.width)):
                torch.mm(druns[j].t(), x, out=dweight_run)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            dbias = druns.sum(1).t().reshape(-1)
        return dx, dweight, dbias, None


def _weight_runs(weight: torch.Tensor, width: int) -> list[torch.Tensor]:
    """Run j of a class-major layer's weight: rows c * width + j, a strided [classes, features] view."""
    return list(weight.view(-1, width, weight.shape[1]).unbind(1))


class MoeMixture(torch.autograd.Function):
    """The MoE mixture's logits [B, C] and probabilities (not differentiable) from gate logits [M + 1, B, C] and
    expert logits [M, B, C] (RunMajorLinear's layout), with MoeModel's math; the backward recomputes what it
    needs from the inputs."""

    @staticmethod
    def forward(ctx, gates: torch.Tensor, experts: torch.Tensor, mixtures: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows, classes = gates.shape[1], gates.shape[2]
        logits, predictions = gates.new_empty((rows, classes)), gates.new_empty((rows, classes))
        over_rows(_kernels.moe_forward, rows, *as_arrays(gates, experts, logits, predictions), classes, mixtures)
        ctx.save_for_backward(gates, experts)
        ctx.mixtures = mixtures
        ctx.mark_non_differentiable(predictions)
        return logits, predictions

    @staticmethod
    def backward(ctx, dlogits: torch.Tensor, _dpredictions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        gates, experts = ctx.saved_tensors
        dgates, dexperts = torch.empty_like(gates), torch.empty_like(experts)
        over_rows(_kernels.moe_backward, gates.shape[1],
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


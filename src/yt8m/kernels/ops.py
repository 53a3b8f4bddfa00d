"""The fused CPU kernels (_kernels.c) as torch.library custom ops, with fake implementations (torch.compile traces
through them) and autograd formulas: MoeModel's run-major layers and mixture, DbofModel's cluster pooling. Callers
check `yt8m.kernels.use_fused_kernels` first; the eager references are named with each op."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from yt8m.kernels import native
from yt8m.kernels.threads import as_arrays, over_rows


def _native() -> Any:
    """The compiled kernels, which every op here runs: reached only where use_fused_kernels found them."""
    if native is None:
        raise RuntimeError("yt8m.kernels._kernels is not built: the fused kernels are off")
    return native


@torch.library.custom_op("yt8m::run_major_linear", mutates_args=())
def run_major_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], width: int) -> Tensor:
    """nn.Linear(x, weight, bias) for a layer whose outputs are `width` values per class (class-major: column
    c * width + j, as MoeModel's gates and experts), returned as `width` runs [width, batch, classes]: the layout
    the mixture kernels read in order. Each run is one matmul on a strided view of the weight, as fast as the
    whole layer's, where transposing the layer's output took as long as the mixture's math."""
    runs = x.new_empty((width, x.shape[0], weight.shape[0] // width))
    for j, weight_run in enumerate(_weight_runs(weight, width)):
        if bias is None:
            torch.mm(x, weight_run.t(), out=runs[j])
        else:
            torch.addmm(bias.view(-1, width)[:, j], x, weight_run.t(), out=runs[j])
    return runs


@run_major_linear.register_fake
def _(x: Tensor, weight: Tensor, bias: Optional[Tensor], width: int) -> Tensor:
    return x.new_empty((width, x.shape[0], weight.shape[0] // width))


@torch.library.custom_op("yt8m::run_major_weight_grad", mutates_args=())
def run_major_weight_grad(druns: Tensor, x: Tensor, width: int) -> Tensor:
    """The gradient of run_major_linear's weight, each run's rows written where they lie in the class-major weight."""
    dweight = x.new_empty((druns.shape[0] * druns.shape[2], x.shape[1]))
    for j, dweight_run in enumerate(_weight_runs(dweight, width)):
        torch.mm(druns[j].t(), x, out=dweight_run)
    return dweight


@run_major_weight_grad.register_fake
def _(druns: Tensor, x: Tensor, width: int) -> Tensor:
    return x.new_empty((druns.shape[0] * druns.shape[2], x.shape[1]))


def _run_major_linear_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, weight, bias, width = inputs
    ctx.save_for_backward(x, weight)
    ctx.width, ctx.has_bias = width, bias is not None


def _run_major_linear_backward(ctx: Any, druns: Tensor) -> tuple:
    x, weight = ctx.saved_tensors
    dx = dweight = dbias = None
    if ctx.needs_input_grad[0]:
        weight_runs = _weight_runs(weight, ctx.width)
        dx = torch.mm(druns[0], weight_runs[0])
        for j in range(1, ctx.width):
            dx.addmm_(druns[j], weight_runs[j])
    if ctx.needs_input_grad[1]:
        dweight = run_major_weight_grad(druns, x, ctx.width)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        dbias = druns.sum(1).t().reshape(-1)
    return dx, dweight, dbias, None


run_major_linear.register_autograd(_run_major_linear_backward, setup_context=_run_major_linear_context)


def _weight_runs(weight: Tensor, width: int) -> list[Tensor]:
    """Run j of a class-major layer's weight: rows c * width + j, a strided [classes, features] view."""
    return list(weight.view(-1, width, weight.shape[1]).unbind(1))


@torch.library.custom_op("yt8m::moe_mixture", mutates_args=())
def moe_mixture(gates: Tensor, experts: Tensor, mixtures: int) -> tuple[Tensor, Tensor]:
    """The MoE mixture's logits [B, C] and probabilities from gate logits [M + 1, B, C] and expert logits [M, B, C]
    (run_major_linear's layout), with MoeModel's math (its eager reference: models.video.mixture_logits)."""
    rows, classes = gates.shape[1], gates.shape[2]
    logits, predictions = gates.new_empty((rows, classes)), gates.new_empty((rows, classes))
    over_rows(_native().moe_forward, rows, *as_arrays(gates, experts, logits, predictions), classes, mixtures)
    return logits, predictions


@moe_mixture.register_fake
def _(gates: Tensor, experts: Tensor, mixtures: int) -> tuple[Tensor, Tensor]:
    return gates.new_empty(gates.shape[1:]), gates.new_empty(gates.shape[1:])


@torch.library.custom_op("yt8m::moe_mixture_backward", mutates_args=())
def moe_mixture_backward(gates: Tensor, experts: Tensor, dlogits: Tensor, mixtures: int) -> tuple[Tensor, Tensor]:
    """The gradients of the gate and expert logits from that of the mixture's logits: the kernel recomputes what it
    needs from the inputs."""
    dgates, dexperts = torch.empty_like(gates), torch.empty_like(experts)
    arrays = as_arrays(gates, experts, dlogits.contiguous(), dgates, dexperts)
    over_rows(_native().moe_backward, gates.shape[1], *arrays,
              dlogits.shape[1], mixtures)
    return dgates, dexperts


@moe_mixture_backward.register_fake
def _(gates: Tensor, experts: Tensor, dlogits: Tensor, mixtures: int) -> tuple[Tensor, Tensor]:
    return torch.empty_like(gates), torch.empty_like(experts)


def _moe_mixture_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    gates, experts, mixtures = inputs
    ctx.save_for_backward(gates, experts, output[1])
    ctx.mixtures = mixtures
    ctx.set_materialize_grads(False)  # the probabilities' gradient, where a loss uses them, and only there


def _moe_mixture_backward(ctx: Any, dlogits: Optional[Tensor], dpredictions: Optional[Tensor]) -> tuple:
    gates, experts, predictions = ctx.saved_tensors
    if dpredictions is not None:  # p = sigmoid(logit): dp / dlogit = p (1 - p)
        from_predictions = dpredictions * predictions * (1 - predictions)
        dlogits = from_predictions if dlogits is None else dlogits + from_predictions
    if dlogits is None:
        return None, None, None
    return (*moe_mixture_backward(gates, experts, dlogits, ctx.mixtures), None)


moe_mixture.register_autograd(_moe_mixture_backward, setup_context=_moe_mixture_context)


@torch.library.custom_op("yt8m::batch_norm_relu6_max_pool", mutates_args=())
def _batch_norm_relu6_max_pool(x: Tensor, gamma: Tensor, beta: Tensor, frames: int,
                               eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    rows, channels = x.shape
    mean, var, invstd = (x.new_empty(channels) for _ in range(3))
    pooled = x.new_empty((rows // frames, channels))
    winner = torch.empty((rows // frames, channels), dtype=torch.int32)
    over_rows(_native().dbof_pool_forward, channels, *as_arrays(x, gamma, beta, mean, var, invstd, pooled, winner),
              channels, frames, eps)
    return pooled, mean, var, invstd, winner


@_batch_norm_relu6_max_pool.register_fake
def _(x: Tensor, gamma: Tensor, beta: Tensor, frames: int, eps: float) -> tuple[Tensor, ...]:
    rows, channels = x.shape
    return (x.new_empty((rows // frames, channels)), *(x.new_empty(channels) for _ in range(3)),
            x.new_empty((rows // frames, channels), dtype=torch.int32))


@torch.library.custom_op("yt8m::batch_norm_relu6_max_pool_backward", mutates_args=())
def _batch_norm_relu6_max_pool_backward(x: Tensor, gamma: Tensor, beta: Tensor, mean: Tensor, invstd: Tensor,
                                        dpooled: Tensor, winner: Tensor, frames: int) -> tuple[Tensor, Tensor, Tensor]:
    dx, dgamma, dbeta = torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(beta)
    over_rows(_native().dbof_pool_backward, x.shape[1],
              *as_arrays(x, gamma, beta, mean, invstd, dpooled.contiguous(), winner, dx, dgamma, dbeta),
              x.shape[1], frames)
    return dx, dgamma, dbeta


@_batch_norm_relu6_max_pool_backward.register_fake
def _(x: Tensor, gamma: Tensor, beta: Tensor, mean: Tensor, invstd: Tensor, dpooled: Tensor, winner: Tensor,
      frames: int) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(beta)


def _batch_norm_relu6_max_pool_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    x, gamma, beta, frames, _ = inputs
    _, mean, var, invstd, winner = output
    ctx.save_for_backward(x, gamma, beta, mean, invstd, winner)
    ctx.frames = frames
    ctx.mark_non_differentiable(mean, var, invstd, winner)
    ctx.set_materialize_grads(False)  # no zeros made for the non-differentiable outputs


def _batch_norm_relu6_max_pool_gradients(ctx: Any, dpooled: Optional[Tensor], *_statistics: Optional[Tensor]) -> tuple:
    if dpooled is None:
        return None, None, None, None, None
    x, gamma, beta, mean, invstd, winner = ctx.saved_tensors
    return (*_batch_norm_relu6_max_pool_backward(x, gamma, beta, mean, invstd, dpooled, winner, ctx.frames),
            None, None)


_batch_norm_relu6_max_pool.register_autograd(_batch_norm_relu6_max_pool_gradients,
                                             setup_context=_batch_norm_relu6_max_pool_context)


def batch_norm_relu6_max_pool(x: Tensor, gamma: Tensor, beta: Tensor, frames: int,
                              eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """DbofModel's cluster layer in training, [videos x frames, C] -> [videos, C]: batch norm with the batch's
    statistics, ReLU6, and the max over each video's frames, without the [videos x frames, C] activations eager
    PyTorch writes and reads a dozen times (its eager reference: DbofModel's eager path). Returns the pooled values
    and the batch mean and biased variance (not differentiable)."""
    pooled, mean, var, _, _ = _batch_norm_relu6_max_pool(x, gamma, beta, frames, eps)
    return pooled, mean, var

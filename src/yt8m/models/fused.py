"""Fused CPU kernels of training (_kernels.c) as autograd functions, their rows split over torch's threads.

Each has an eager PyTorch reference next to the model that uses it; `use_fused_kernels` says when the kernels run.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

from yt8m.models import _kernels

_pool: dict[int, ThreadPoolExecutor] = {}
# A forked child has none of the parent's pool threads: it starts its own pool.
os.register_at_fork(after_in_child=_pool.clear)


def use_fused_kernels(*tensors: torch.Tensor) -> bool:
    """True for contiguous float32 CPU tensors outside tracing (torch.compile, ONNX export): the kernels' case.
    Elsewhere (accelerators, bfloat16 autocast, tracing) the eager reference runs."""
    return not torch.compiler.is_compiling() and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def over_rows(kernel: Callable[..., None], rows: int, *args: object) -> None:
    """Run kernel(*args, row_start, row_end) over [0, rows) in as many slices as torch has threads."""
    threads = max(1, min(torch.get_num_threads(), rows))
    bounds = [rows * k // threads for k in range(threads + 1)]
    if threads == 1:
        kernel(*args, 0, rows)
        return
    pool = _pool.get(threads) or _pool.setdefault(threads, ThreadPoolExecutor(threads, "yt8m-kernel"))
    for done in [pool.submit(kernel, *args, start, end) for start, end in zip(bounds, bounds[1:])]:
        done.result()


class MoeMixture(torch.autograd.Function):
    """The MoE mixture's logits from gate logits [B, C * (M + 1)] and expert logits [B, C * M] (class-major, as
    the layers give them), with MoeModel's math; the backward recomputes what it needs from the inputs."""

    @staticmethod
    def forward(ctx, gates: torch.Tensor, experts: torch.Tensor, mixtures: int) -> torch.Tensor:
        rows, classes = gates.shape[0], gates.shape[1] // (mixtures + 1)
        logits = gates.new_empty((rows, classes))
        over_rows(_kernels.moe_forward, rows, gates.detach().numpy(), experts.detach().numpy(), logits.numpy(),
                  classes, mixtures)
        ctx.save_for_backward(gates, experts)
        ctx.mixtures = mixtures
        return logits

    @staticmethod
    def backward(ctx, dlogits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        gates, experts = ctx.saved_tensors
        dgates, dexperts = torch.empty_like(gates), torch.empty_like(experts)
        over_rows(_kernels.moe_backward, gates.shape[0], gates.detach().numpy(), experts.detach().numpy(),
                  dlogits.contiguous().numpy(), dgates.numpy(), dexperts.numpy(), dlogits.shape[1], ctx.mixtures)
        return dgates, dexperts, None

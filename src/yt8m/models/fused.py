"""The MoE mixture's fused CPU kernel (_kernels.c) as an autograd function; its eager PyTorch reference is
`mixture_logits` in models/video.py, and `yt8m.kernels.use_fused_kernels` says when the kernel runs."""

from __future__ import annotations

import torch

from yt8m.kernels import _kernels, over_rows


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

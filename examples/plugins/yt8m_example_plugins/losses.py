"""The asymmetric loss (ASL) of Ridnik et al. 2021, "Asymmetric Loss For Multi-Label Classification" (ICCV),
written from the paper's equations as a function loss: yt8m calls it with the model's output, the labels and, where
the task rates only some classes (the 2019 segments), their weights; its keyword arguments are hyper-parameters,
each a flag (`--asl_gamma_neg 4`)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def asymmetric_loss(output: dict[str, torch.Tensor], labels: torch.Tensor,
                    label_weights: Optional[torch.Tensor] = None, asl_gamma_neg: float = 4.0,
                    asl_gamma_pos: float = 0.0, asl_clip: float = 0.05) -> torch.Tensor:
    """ASL per class, summed over classes and averaged over videos (as yt8m's built-in losses):

        L+ = (1 - p)^gamma_pos log(p)                  for a positive (eq. 4, with gamma+)
        L- = p_m^gamma_neg log(1 - p_m)                for a negative (eq. 7), p_m = max(p - m, 0) (eq. 6)
        L  = -y L+ - (1 - y) L-

    p = sigmoid(logit); m = `asl_clip`, the probability margin that discards easy negatives (p <= m adds 0); the
    paper's defaults are gamma_neg 4, gamma_pos 0, m 0.05. log(p) is computed from the logit (exact where p rounds
    to 1); log(1 - p_m) too where m is 0, and as log(1 - p + m) >= log(m) otherwise."""
    if asl_gamma_neg < 0 or asl_gamma_pos < 0 or not 0 <= asl_clip < 1:
        raise ValueError(f"asymmetric_loss: asl_gamma_neg and asl_gamma_pos must be at least 0 and asl_clip in "
                         f"[0, 1), got {asl_gamma_neg}, {asl_gamma_pos}, {asl_clip}")
    logits = output["logits"].float()
    targets = labels.to(logits.dtype)
    p = torch.sigmoid(logits)
    positive = (1 - p).pow(asl_gamma_pos) * F.logsigmoid(logits)
    if asl_clip > 0:
        shifted = (p - asl_clip).clamp(min=0)
        negative = shifted.pow(asl_gamma_neg) * torch.log((1 - shifted).clamp(min=asl_clip))
    else:
        negative = p.pow(asl_gamma_neg) * F.logsigmoid(-logits)
    terms = -(targets * positive + (1 - targets) * negative)
    if label_weights is not None:
        terms = terms * label_weights.to(terms.dtype)
    return terms.sum(dim=1).mean()

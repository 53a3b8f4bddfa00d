"""Two models as plain nn.Modules. yt8m gives the constructor feature_size and num_classes; the other keyword
arguments are hyper-parameters, each a flag and config field of its own name (`--mlp_hidden 64`), so they carry the
model's prefix: a flag is shared by every model that has an argument of that name."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn


class MLP(nn.Module):
    """Video level: one hidden layer (ReLU, dropout) on each video's features, then a linear classifier."""

    def __init__(self, feature_size: int, num_classes: int, mlp_hidden: int = 512, mlp_dropout: float = 0.2):
        super().__init__()
        if mlp_hidden < 1 or not 0 <= mlp_dropout < 1:
            raise ValueError(f"MLP: mlp_hidden must be at least 1 and mlp_dropout in [0, 1), got {mlp_hidden}, "
                             f"{mlp_dropout}")
        self.layers = nn.Sequential(nn.Linear(feature_size, mlp_hidden), nn.ReLU(), nn.Dropout(mlp_dropout),
                                    nn.Linear(mlp_hidden, num_classes))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [videos, feature_size] (L2-normalized by yt8m) -> logits [videos, num_classes]."""
        return self.layers(features)


class AttentionPooling(nn.Module):
    """Frame level: a learned score per frame (a small tanh layer), a softmax over each video's real frames (the
    padding after `num_frames` gets no weight), the frames' weighted sum, then a linear classifier."""

    def __init__(self, feature_size: int, num_classes: int, attention_hidden: int = 128):
        super().__init__()
        if attention_hidden < 1:
            raise ValueError(f"AttentionPooling: attention_hidden must be at least 1, got {attention_hidden}")
        self.score = nn.Sequential(nn.Linear(feature_size, attention_hidden), nn.Tanh(),
                                   nn.Linear(attention_hidden, 1))
        self.classifier = nn.Linear(feature_size, num_classes)

    def forward(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        """features [videos, frames, feature_size] (dequantized, the padding zero), num_frames [videos] (None: every
        frame is real) -> logits [videos, num_classes]."""
        scores = self.score(features).squeeze(-1)  # [videos, frames]
        if num_frames is None:
            real = torch.ones_like(scores, dtype=torch.bool)
        else:
            real = torch.arange(features.shape[1], device=features.device) < num_frames.to(features.device)[:, None]
        # A finite floor, not -inf: a video without frames gets even weights over zero frames (a zero vector), not
        # NaN; its padding is then zeroed below, as every video's.
        scores = scores.masked_fill(~real, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=1) * real
        pooled = (weights.unsqueeze(-1) * features).sum(dim=1)
        return self.classifier(pooled)

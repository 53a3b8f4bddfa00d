"""Layers the learnable-pooling frame models share: batch norm over real frames only, the per-modality pooling head
(pool each feature, concatenate, hidden layer, gating, classifier), the real-frame mask, the shared hyper-parameter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import nn

from yt8m.fields import setting
from yt8m.models.base import SLIM_DECAY, BaseModel
from yt8m.models.frame import FrameClassifierHParams, _frame_counts
from yt8m.models.gating import ContextGating, gated_logits


@dataclass(frozen=True)
class PoolingHParams(FrameClassifierHParams):
    """What WILLOW's models and NeXtVLADModel share besides their classifier."""

    pooling_batch_norm_decay: float = setting(
        SLIM_DECAY, "WILLOW models and NeXtVLADModel: moving-average decay of their batch norms' statistics "
                    "(slim's 0.999, as published; 0.99 settles them within runs of a few hundred steps).",
        above=0, at_most=1)


def sequence_mask(features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
    """[batch, frames, 1]: 1.0 on each video's real frames (all of them where `num_frames` is None), 0.0 on its
    padding; a video without frames is all 0 (tf.sequence_mask)."""
    if num_frames is None:
        return features.new_ones(*features.shape[:2], 1)
    counts = num_frames.to(device=features.device, dtype=torch.long)
    real = torch.arange(features.shape[1], device=features.device) < counts[:, None]
    return real.unsqueeze(-1).to(features.dtype)


def real_frames(features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
    """[batch, frames, 1]: 1.0 on each video's real frames, 0.0 on its padding (a video without frames reads its
    one zero padding frame, as BaseModel gives it)."""
    counts = _frame_counts(features, num_frames)
    real = torch.arange(features.shape[1], device=features.device) < counts[:, None]
    return real.unsqueeze(-1).to(features.dtype)


class FrameBatchNorm(nn.BatchNorm1d):
    """Batch norm of [batch, frames, channels] whose statistics cover the real frames only, so that padding never
    changes the output. slim.batch_norm's epsilon (1e-3), its moving averages decayed by `decay`."""

    running_mean: torch.Tensor  # kept: track_running_stats is on
    running_var: torch.Tensor
    num_batches_tracked: torch.Tensor

    def __init__(self, channels: int, decay: float = SLIM_DECAY):
        super().__init__(channels, eps=1e-3, momentum=1 - decay)
        self.decay_weight = 1 - decay  # the running statistics' momentum, as a number

    # BatchNorm1d's forward takes the input alone; this one also takes the mask of the real frames it normalizes.
    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        values = frames.to(torch.promote_types(frames.dtype, torch.float32))  # at least float32, also under autocast
        if self.training:
            count = mask.sum().clamp(min=1)  # a batch of only 0-frame videos (NeXtVLAD masks them whole)
            mean = (values * mask).sum(dim=(0, 1)) / count
            var = ((values - mean).square() * mask).sum(dim=(0, 1)) / count
            with torch.no_grad():  # the running statistics, as nn.BatchNorm1d keeps them (unbiased variance)
                self.running_mean.lerp_(mean, self.decay_weight)
                self.running_var.lerp_(var * count / (count - 1).clamp(min=1), self.decay_weight)
                self.num_batches_tracked.add_(1)
        else:
            mean, var = self.running_mean, self.running_var
        normalized = (values - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias
        return normalized.to(frames.dtype)


def modality_split(sizes: Sequence[int], first: int, others: int) -> list[int]:
    """A per-modality count: `first` for the first feature (rgb), `others` for the rest (audio), as both papers
    give the audio stream a fraction of the visual one's clusters."""
    return [first] + [others] * (len(sizes) - 1)


class PooledModalitiesModel(BaseModel):
    """Frame-level model that pools each modality (each part of --feature_sizes) apart over its real frames,
    concatenates the pooled vectors, and classifies them through `head` (hidden layer and context gating) and a
    video-level `classifier`, optionally with context gating on its probabilities (WILLOW's gated MoE).

    Subclasses build `poolings` (one per modality: (frames [B, T, D], mask [B, T, 1]) -> [B, out]) and the rest.
    """

    frame_level = True
    splits_modalities = True
    classifier_name = "classifier"

    def __init__(self, feature_size: int, num_classes: int, hparams: PoolingHParams, modality_sizes: Sequence[int]):
        super().__init__(feature_size, num_classes, hparams)
        self.modality_sizes = [int(size) for size in modality_sizes] or [feature_size]
        if sum(self.modality_sizes) != feature_size or min(self.modality_sizes) < 1:
            raise ValueError(f"{type(self).__name__}: modality sizes {self.modality_sizes} must be positive and add "
                             f"up to feature_size {feature_size}")
        self.input_norm: Optional[FrameBatchNorm] = None
        self.poolings = nn.ModuleList()
        self.head: nn.Module = nn.Identity()
        self.head_size = feature_size  # what `head` outputs: subclasses with a hidden layer set its size
        self.classifier: Optional[BaseModel] = None
        self.probability_gating: Optional[ContextGating] = None

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        assert self.classifier is not None, "a subclass builds the classifier"
        logits = self.classifier.compute_logits(self.shared_features(features, num_frames), None)
        if self.probability_gating is None:
            return logits
        return gated_logits(logits, self.probability_gating.gate_logits(torch.sigmoid(logits)))

    def frame_mask(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        """[batch, frames, 1] weights of the frames in the pooling: 1 on the real ones; a video without frames
        reads its one zero frame, as WILLOW's frame sampler does (utils.SampleRandomFrames picks index 0)."""
        return real_frames(features, num_frames)

    def shared_features(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        """The pooled modalities through `head`: what the classifier reads, and a multi-task trunk's output."""
        mask = self.frame_mask(features, num_frames)
        # A video without frames pools a zero frame (the originals' zero padding), whatever its row of the batch holds.
        features = features * sequence_mask(features, num_frames)
        if self.input_norm is not None:
            features = self.input_norm(features, mask)
        parts = features.split(self.modality_sizes, dim=-1)
        return self.head(torch.cat([pool(part, mask) for pool, part in zip(self.poolings, parts)], dim=-1))

    @property
    def shared_size(self) -> int:
        return self.head_size

"""NeXtVLADModel (Lin, Xiao, Fan 2018, "NeXtVLAD: An Efficient Neural Network to Aggregate Frame-level Features for
Large-scale Video Classification"): NetVLAD over groups of expanded frame features, the best single 2018 model.

Per modality (Sec. 3.2, Fig. 3): each frame expanded linearly to `expansion` x its size and cut into `groups` parts,
each part softly assigned to `cluster_size` clusters and weighted by a sigmoid attention per group, residuals summed
over the real frames and groups, intra-normalized and batch-normalized; the audio stream with half the clusters and
half the groups. Then (Sec. 3.3) dropout, a hidden layer with batch norm, SE context gating (ContextGating with
`reduction`) and the video-level classifier. Defaults are the paper's single model (Sec. 4: K 128, G 8, lambda 2,
hidden 2048, dropout 0.5, gating reduction 8; batch 160 of videos, learning rate 0.0002 decayed by 0.8 every 2M
videos, L2 1e-5: configs/nextvlad.yaml). Padding has zero attention and is outside the batch-norm statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from yt8m.fields import setting
from yt8m.models.frame import FrameClassifierHParams
from yt8m.models.gating import ContextGating
from yt8m.models.pooling_layers import FrameBatchNorm, PooledModalitiesModel, modality_split
from yt8m.models.registry import create_classifier, register_model


@dataclass
class NeXtVladHParams(FrameClassifierHParams):
    nextvlad_cluster_size: int = setting(128, "NeXtVLADModel: clusters of the first (rgb) feature; the others "
                                              "(audio) get half.", at_least=1)
    nextvlad_hidden_size: int = setting(2048, "NeXtVLADModel: units of the hidden layer.", at_least=1)
    nextvlad_groups: int = setting(8, "NeXtVLADModel: groups each expanded frame is cut into (audio: half).",
                                   at_least=1)
    nextvlad_expansion: int = setting(2, "NeXtVLADModel: factor each frame is linearly expanded by before grouping.",
                                      at_least=1)
    nextvlad_gating_reduction: int = setting(8, "NeXtVLADModel: squeeze-and-excitation reduction of the context "
                                                "gating.", at_least=1)
    nextvlad_dropout: float = setting(0.5, "NeXtVLADModel: dropout rate on the pooled features in training.",
                                      at_least=0, at_most=0.99)


def _variance_scaled(layer: nn.Linear) -> nn.Linear:
    """He-normal weights and zero bias (slim.variance_scaling_initializer, as published)."""
    nn.init.normal_(layer.weight, std=math.sqrt(2 / layer.in_features))
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class NeXtVlad(nn.Module):
    """NeXtVLAD pooling of one modality: [batch, frames, size] and the frame mask -> [batch, clusters * group size]."""

    def __init__(self, size: int, clusters: int, groups: int, expansion: int):
        super().__init__()
        expanded = expansion * size
        if expanded % groups:
            raise ValueError(f"NeXtVLADModel: a feature of size {size} expanded {expansion} times ({expanded}) does not "
                             f"split into {groups} groups; change --nextvlad_groups or --nextvlad_expansion")
        self.groups, self.clusters, self.group_size = groups, clusters, expanded // groups
        self.expand = _variance_scaled(nn.Linear(size, expanded))
        self.attention = _variance_scaled(nn.Linear(expanded, groups))
        self.assignment = _variance_scaled(nn.Linear(expanded, groups * clusters, bias=False))
        self.assignment_norm = FrameBatchNorm(groups * clusters)
        self.centers = nn.Parameter(torch.randn(clusters, self.group_size) * math.sqrt(2 / self.group_size))
        self.output_size = clusters * self.group_size
        self.output_norm = nn.BatchNorm1d(self.output_size, eps=1e-3, momentum=0.01)

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length, _ = frames.shape
        expanded = self.expand(frames)
        attention = torch.sigmoid(self.attention(expanded)) * mask  # [B, T, G]: padding weighs nothing
        logits = self.assignment_norm(self.assignment(expanded), mask)
        assignment = torch.softmax(logits.view(batch, length * self.groups, self.clusters), dim=-1)
        assignment = assignment * attention.reshape(batch, length * self.groups, 1)
        parts = expanded.reshape(batch, length * self.groups, self.group_size)
        vlad = assignment.transpose(1, 2) @ parts - assignment.sum(dim=1).unsqueeze(-1) * self.centers
        return self.output_norm(F.normalize(vlad, dim=-1).flatten(1))


@register_model(NeXtVladHParams)
class NeXtVLADModel(PooledModalitiesModel):
    """NeXtVLAD per modality, dropout, hidden layer + batch norm, SE context gating, video-level classifier
    (Lin et al. 2018, Sec. 3; see the module docstring)."""

    def __init__(self, feature_size: int, num_classes: int, nextvlad_cluster_size: int = 128,
                 nextvlad_hidden_size: int = 2048, nextvlad_groups: int = 8, nextvlad_expansion: int = 2,
                 nextvlad_gating_reduction: int = 8, nextvlad_dropout: float = 0.5,
                 video_level_classifier_model: str = "MoeModel", moe_num_mixtures: int = 2,
                 l2_penalty: float = 1e-8, modality_sizes: Sequence[int] = ()):
        super().__init__(feature_size, num_classes, l2_penalty, modality_sizes)
        if not 0 <= nextvlad_dropout < 1:
            raise ValueError(f"nextvlad_dropout must be in [0, 1), got {nextvlad_dropout}")
        clusters = modality_split(self.modality_sizes, nextvlad_cluster_size, max(1, nextvlad_cluster_size // 2))
        groups = modality_split(self.modality_sizes, nextvlad_groups, max(1, nextvlad_groups // 2))
        self.poolings = nn.ModuleList(NeXtVlad(size, count, group, nextvlad_expansion)
                                      for size, count, group in zip(self.modality_sizes, clusters, groups))
        pooled = sum(pool.output_size for pool in self.poolings)
        self.head = nn.Sequential(nn.Dropout(nextvlad_dropout),
                                  _variance_scaled(nn.Linear(pooled, nextvlad_hidden_size, bias=False)),
                                  nn.BatchNorm1d(nextvlad_hidden_size, eps=1e-3, momentum=0.01),
                                  ContextGating(nextvlad_hidden_size, reduction=nextvlad_gating_reduction))
        self.head_size = nextvlad_hidden_size
        self.classifier = create_classifier(video_level_classifier_model, nextvlad_hidden_size, num_classes,
                                            moe_num_mixtures=moe_num_mixtures, l2_penalty=l2_penalty)

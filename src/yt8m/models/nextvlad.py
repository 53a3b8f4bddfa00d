"""NeXtVLADModel (Lin, Xiao, Fan 2018, "NeXtVLAD: An Efficient Neural Network to Aggregate Frame-level Features for
Large-scale Video Classification"): NetVLAD over groups of expanded frame features, the best single 2018 model.

Per modality (Sec. 3.2, Fig. 3; the authors' linrongc/youtube-8m nextvlad.py): each frame expanded linearly to
`expansion` x its size and cut into `groups` parts, each part softly assigned to `cluster_size` clusters and weighted
by a sigmoid attention per group, residuals summed over the real frames and groups, intra-normalized and
batch-normalized; the audio stream with half the clusters and half the groups. Then (Sec. 3.3) dropout, a hidden
layer with batch norm, SE context gating and the video-level classifier. Defaults are the paper's single model
(Sec. 4: K 128, G 8, lambda 2, hidden 2048, dropout 0.5, gating reduction 8: configs/nextvlad.yaml, whose logistic
classifier and reverse whitening (--nextvlad_eigenvalues) are not the shared flags' defaults). Padding, and every
frame of a video without frames, has zero attention and is outside the batch-norm statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from yt8m.fields import setting
from yt8m.models.base import SLIM_DECAY, slim_batch_norm
from yt8m.models.pooling_layers import (
    FrameBatchNorm,
    PooledModalitiesModel,
    PoolingHParams,
    modality_split,
    sequence_mask,
)
from yt8m.models.registry import create_classifier, register_model, video_level_model

# The dequantized features' offset from the quantization bins' centres (yt8m.data.format.decode.dequantize adds
# (max - min) / 512 = 4/512), which Lin et al.'s train.py and eval.py take off the rgb feature before scaling it.
DEQUANTIZATION_OFFSET = 4 / 512


@dataclass(frozen=True)
class NeXtVladHParams(PoolingHParams):
    # Lin et al. (Sec. 3.3, 4.2) and their scripts: a logistic classifier with L2 1e-5 on the pooled features.
    video_level_classifier_model: str = setting("LogisticModel", "Frame models and DeepClassifierModel: the "
                                                "video-level classifier on top.", check=video_level_model)
    l2_penalty: float = setting(1e-5, "L2 weight of the model's classifier weights.", at_least=0)
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
                                      at_least=0, below=1)
    nextvlad_eigenvalues: str = setting("", "NeXtVLADModel: a .npy of the rgb feature's PCA eigenvalues "
                                            "(eigenvals.npy of http://data.yt8m.org/yt8m_pca.tgz) to reverse the "
                                            "whitening of rgb as published (Lin et al. Sec. 3.3; audio unscaled); "
                                            "empty: each frame L2-normalized, the starter kit's input.")


def _variance_scaled(layer: nn.Linear) -> nn.Linear:
    """He-normal weights and zero bias (slim.variance_scaling_initializer, as published)."""
    nn.init.normal_(layer.weight, std=math.sqrt(2 / layer.in_features))
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class SqueezeExcitationGating(nn.Module):
    """NeXtVLAD's SE context gating (Lin et al. 2018, Sec. 3.3 and Fig. 4; NeXtVLADModel.create_model):
    y = x * sigmoid(relu(BN(x W1)) W2), W1 [size, size / reduction] and W2 [size / reduction, size] without biases,
    the batch norm (slim's) on the bottleneck: 2 / reduction of context gating's weights."""

    def __init__(self, size: int, reduction: int, decay: float = SLIM_DECAY):
        super().__init__()
        if reduction < 1 or size // reduction < 1:
            raise ValueError(f"gating reduction must be in [1, {size}], got {reduction}")
        self.squeeze = _variance_scaled(nn.Linear(size, size // reduction, bias=False))
        self.norm = slim_batch_norm(size // reduction, decay)
        self.excite = _variance_scaled(nn.Linear(size // reduction, size, bias=False))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features * torch.sigmoid(self.excite(F.relu(self.norm(self.squeeze(features)))))


class NeXtVlad(nn.Module):
    """NeXtVLAD pooling of one modality: [batch, frames, size] and the frame mask -> [batch, clusters * group size]."""

    def __init__(self, size: int, clusters: int, groups: int, expansion: int, decay: float = SLIM_DECAY):
        super().__init__()
        expanded = expansion * size
        if expanded % groups:
            raise ValueError(f"NeXtVLADModel: a feature of size {size} expanded {expansion} times ({expanded}) does "
                             f"not split into {groups} groups; change --nextvlad_groups or --nextvlad_expansion")
        self.groups, self.clusters, self.group_size = groups, clusters, expanded // groups
        self.expand = _variance_scaled(nn.Linear(size, expanded))
        self.attention = _variance_scaled(nn.Linear(expanded, groups))
        self.assignment = _variance_scaled(nn.Linear(expanded, groups * clusters, bias=False))
        self.assignment_norm = FrameBatchNorm(groups * clusters, decay)
        self.centers = nn.Parameter(torch.randn(clusters, self.group_size) * math.sqrt(2 / self.group_size))
        self.output_size = clusters * self.group_size
        self.output_norm = slim_batch_norm(self.output_size, decay)

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


def reverse_whitening(path: str, modality_sizes: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(offset, scale) over the concatenated features such that (x - offset) * scale is Lin et al.'s input
    (train.py and eval.py): rgb (the first feature) less the dequantization offset, times sqrt(eigenvalue) + 1e-4
    (Sec. 3.3, Eq. 11), which undoes the release's division by sqrt(eigenvalue + 1e-4); the others as they come."""
    eigenvalues = np.load(path).reshape(-1)
    rgb, others = modality_sizes[0], sum(modality_sizes[1:])
    if eigenvalues.size < rgb:
        raise ValueError(f"nextvlad_eigenvalues: {path} holds {eigenvalues.size} eigenvalues, the first feature has "
                         f"{rgb} dimensions")
    offset = torch.tensor([DEQUANTIZATION_OFFSET] * rgb + [0.0] * others)
    scale = torch.cat([torch.tensor(np.sqrt(eigenvalues[:rgb]) + 1e-4, dtype=torch.float32), torch.ones(others)])
    return offset, scale


@register_model(NeXtVladHParams)
class NeXtVLADModel(PooledModalitiesModel):
    """NeXtVLAD per modality, dropout, hidden layer + batch norm, SE context gating, video-level classifier
    (Lin et al. 2018, Sec. 3; see the module docstring)."""

    def __init__(self, feature_size: int, num_classes: int, hparams: NeXtVladHParams = NeXtVladHParams(),
                 modality_sizes: Sequence[int] = ()):
        super().__init__(feature_size, num_classes, hparams, modality_sizes)
        decay, hidden = hparams.pooling_batch_norm_decay, hparams.nextvlad_hidden_size
        eigenvalues = hparams.nextvlad_eigenvalues
        whitening = reverse_whitening(eigenvalues, self.modality_sizes) if eigenvalues else None
        self.register_buffer("input_offset", whitening[0] if whitening else None)
        self.register_buffer("input_scale", whitening[1] if whitening else None)
        cluster_size, group_count = hparams.nextvlad_cluster_size, hparams.nextvlad_groups
        clusters = modality_split(self.modality_sizes, cluster_size, max(1, cluster_size // 2))
        groups = modality_split(self.modality_sizes, group_count, max(1, group_count // 2))
        self.poolings = nn.ModuleList(NeXtVlad(size, count, group, hparams.nextvlad_expansion, decay)
                                      for size, count, group in zip(self.modality_sizes, clusters, groups))
        pooled = sum(cast(int, pool.output_size) for pool in self.poolings)
        self.head = nn.Sequential(nn.Dropout(hparams.nextvlad_dropout),
                                  _variance_scaled(nn.Linear(pooled, hidden, bias=False)),
                                  slim_batch_norm(hidden, decay),
                                  SqueezeExcitationGating(hidden, hparams.nextvlad_gating_reduction, decay))
        self.head_size = hidden
        self.classifier = create_classifier(hparams, hidden, num_classes)

    input_offset: Optional[torch.Tensor]  # buffers: set with --nextvlad_eigenvalues
    input_scale: Optional[torch.Tensor]

    def normalize_input(self, features: torch.Tensor) -> torch.Tensor:
        if self.input_scale is None or self.input_offset is None:
            return super().normalize_input(features)
        return (features - self.input_offset) * self.input_scale

    def frame_mask(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        """1 on the real frames, 0 elsewhere, a video without frames all 0 (Lin et al.'s tf.sequence_mask): it pools
        to the output batch norm of a zero vector, as there, not to its padding frame's encoding."""
        return sequence_mask(features, num_frames)

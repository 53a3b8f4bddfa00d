"""WILLOW's learnable temporal pooling (Miech, Laptev, Sivic 2017, "Learnable pooling with Context Gating for
video classification"): NetVLADModel, NetRVLADModel, NetFVModel, SoftDbofModel and GatedDbofModel.

Each model (Sec. 3 and Fig. 1; the authors' Youtube-8M-WILLOW frame_level_models.py, its pooling layers also in
LOUPE's loupe.py): batch norm of the input frames, a pooling per modality over the real frames (the audio one with a
fraction of the visual one's clusters: half, an eighth for the bags of frames), the pooled vectors concatenated, a
hidden fully connected layer, context gating (Sec. 3.2), then the video-level classifier
(--video_level_classifier_model, MoeModel) whose probabilities go through context gating too (--moe_prob_gating),
which makes the MoE WILLOW's gated MoE (GatedMoeModel). The gate on the probabilities is the frame model's own
hyper-parameter rather than a different classifier default, so that DbofModel's and LstmModel's MoeModel default
(one flag, one default) stays as it is. Without --willow_batch_norm every batch norm but the probability gate's
becomes a bias, as in the originals (whose MoE gate has no other form).

Frames: all real frames, each weighted 1 (the published models sample 300 frames with replacement from the real
ones, utils.SampleRandomFrames); padding has zero weight in every cluster assignment and in the batch-norm
statistics, so it never changes the output, and evaluation is deterministic. Defaults are the published single
models (the authors' README recipes: configs/netvlad.yaml and the others): NetVLAD and NetRVLAD 256 clusters, NetFV
128 Gaussians, Soft-DBoF 8000 clusters, Gated Soft-DBoF 4096, a hidden layer of 1024 units with a bias and no ReLU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence, cast

import torch
import torch.nn.functional as F
from torch import nn

from yt8m.fields import setting
from yt8m.models.base import SLIM_DECAY, slim_batch_norm
from yt8m.models.gating import ContextGating
from yt8m.models.pooling_layers import FrameBatchNorm, PooledModalitiesModel, PoolingHParams, modality_split
from yt8m.models.registry import create_classifier, register_model


@dataclass(frozen=True)
class WillowHParams(PoolingHParams):
    """What every WILLOW model has besides its number of clusters."""

    willow_hidden_size: int = setting(1024, "WILLOW models (NetVLADModel, NetRVLADModel, NetFVModel, SoftDbofModel, "
                                            "GatedDbofModel): units of the hidden layer on the pooled features.",
                                      at_least=1)
    willow_batch_norm: bool = setting(True, "WILLOW models: batch-normalize the input frames, the cluster logits and "
                                            "the hidden layer's context gating (else biases).")
    context_gating: bool = setting(True, "WILLOW models: context gating on the hidden layer (Miech et al. Sec. 3.2).")
    moe_prob_gating: bool = setting(True, "WILLOW models: context gating on the classifier's probabilities "
                                          "(with MoeModel: WILLOW's gated MoE).")


# The L2 weight WILLOW's commands give the classifier of these models (--moe_l2 1e-6); Soft-DBoF's keeps the starter's.
WILLOW_L2 = 1e-6


@dataclass(frozen=True)
class NetVladHParams(WillowHParams):
    l2_penalty: float = setting(WILLOW_L2, "L2 weight of the model's classifier weights.", at_least=0)
    netvlad_cluster_size: int = setting(256, "NetVLADModel, NetRVLADModel: clusters of the first (rgb) feature; "
                                             "the others (audio) get half.", at_least=1)


@dataclass(frozen=True)
class NetFvHParams(WillowHParams):
    l2_penalty: float = setting(WILLOW_L2, "L2 weight of the model's classifier weights.", at_least=0)
    fv_cluster_size: int = setting(128, "NetFVModel: Gaussians of the first (rgb) feature; the others get half.",
                                   at_least=1)


@dataclass(frozen=True)
class SoftDbofHParams(WillowHParams):
    # WILLOW's SoftDbofModelLF gates neither its hidden layer nor its probabilities.
    context_gating: bool = setting(False, "WILLOW models: context gating on the hidden layer (Miech et al. Sec. 3.2).")
    moe_prob_gating: bool = setting(False, "WILLOW models: context gating on the classifier's probabilities "
                                           "(with MoeModel: WILLOW's gated MoE).")
    softdbof_cluster_size: int = setting(8000, "SoftDbofModel: clusters of the first (rgb) feature; the others "
                                               "(audio) get an eighth.", at_least=1)


@dataclass(frozen=True)
class GatedDbofHParams(WillowHParams):
    # WILLOW's GatedDbofModelLF gates its visual bag only, and its command sets --moe_l2 1e-6.
    l2_penalty: float = setting(WILLOW_L2, "L2 weight of the model's classifier weights.", at_least=0)
    context_gating: bool = setting(False, "WILLOW models: context gating on the hidden layer (Miech et al. Sec. 3.2).")
    moe_prob_gating: bool = setting(False, "WILLOW models: context gating on the classifier's probabilities "
                                           "(with MoeModel: WILLOW's gated MoE).")
    gateddbof_cluster_size: int = setting(4096, "GatedDbofModel: clusters of the first (rgb) feature, whose bag is "
                                                "gated; the others (audio, plain Soft-DBoF) get an eighth.",
                                          at_least=1)


class ClusterAssignment(nn.Module):
    """Soft assignment of each frame to `clusters` (softmax of a linear map, batch-normalized or with a bias),
    weighted by the frame mask so that padding is in no cluster."""

    def __init__(self, size: int, clusters: int, batch_norm: bool, decay: float = SLIM_DECAY):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(size, clusters) / math.sqrt(size))
        self.norm = FrameBatchNorm(clusters, decay) if batch_norm else None
        self.bias = None if batch_norm else nn.Parameter(torch.randn(clusters) / math.sqrt(size))

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = frames @ self.weight
        logits = self.norm(logits, mask) if self.norm is not None else logits + cast(torch.Tensor, self.bias)
        return torch.softmax(logits, dim=-1) * mask


def flat_normalized(per_cluster: torch.Tensor) -> torch.Tensor:
    """[batch, clusters, dims] -> [batch, clusters * dims]: intra-normalized (each cluster's vector L2-normalized),
    then the whole L2-normalized (NetVLAD, Arandjelovic et al. 2016)."""
    return F.normalize(F.normalize(per_cluster, dim=-1).flatten(1), dim=-1)


class NetVlad(nn.Module):
    """NetVLAD (WILLOW Sec. 3.1): sum over frames of a_k(x) (x - c_k) per cluster k; without `residuals`, NetRVLAD:
    sum of a_k(x) x, no cluster centres (fewer parameters, about as accurate)."""

    def __init__(self, size: int, clusters: int, batch_norm: bool, decay: float = SLIM_DECAY,
                 residuals: bool = True):
        super().__init__()
        self.assignment = ClusterAssignment(size, clusters, batch_norm, decay)
        self.centers = nn.Parameter(torch.randn(clusters, size) / math.sqrt(size)) if residuals else None
        self.output_size = clusters * size

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        assignment = self.assignment(frames, mask)
        vlad = assignment.transpose(1, 2) @ frames
        if self.centers is not None:
            vlad = vlad - assignment.sum(dim=1).unsqueeze(-1) * self.centers
        return flat_normalized(vlad)


class NetFv(nn.Module):
    """NetFV (WILLOW Sec. 3.1; LOUPE's NetFV.forward): a learnable Fisher vector. Per Gaussian k (soft assignment
    a_k, mean c_k, diagonal standard deviation s_k = w_k^2 + 1e-6), the first order sum a_k (x - c_k) / s_k,
    normalized as NetVLAD's, and the second order sum a_k ((x - c_k)^2 / s_k^2 - 1), only L2-normalized whole."""

    def __init__(self, size: int, clusters: int, batch_norm: bool, decay: float = SLIM_DECAY):
        super().__init__()
        self.assignment = ClusterAssignment(size, clusters, batch_norm, decay)
        self.centers = nn.Parameter(torch.randn(clusters, size) / math.sqrt(size))
        self.deviation_roots = nn.Parameter(1 + torch.randn(clusters, size) / math.sqrt(size))
        self.output_size = 2 * clusters * size

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        assignment = self.assignment(frames, mask)
        weights = assignment.sum(dim=1).unsqueeze(-1)
        deviation = self.deviation_roots.square() + 1e-6  # LOUPE's covar_weights: squared, so positive
        moment1 = assignment.transpose(1, 2) @ frames
        moment2 = assignment.transpose(1, 2) @ frames.square()
        first = (moment1 - weights * self.centers) / deviation
        second = (moment2 - 2 * moment1 * self.centers + weights * self.centers.square()) / deviation.square()
        second = (second - weights).flatten(1)
        return torch.cat([flat_normalized(first), F.normalize(second, dim=-1)], dim=-1)


class SoftBagOfFrames(nn.Module):
    """Soft-DBoF (WILLOW Sec. 3.1): the sum over frames of the soft cluster assignments (a soft bag of visual
    words), L2-normalized."""

    def __init__(self, size: int, clusters: int, batch_norm: bool, decay: float = SLIM_DECAY):
        super().__init__()
        self.assignment = ClusterAssignment(size, clusters, batch_norm, decay)
        self.output_size = clusters

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.assignment(frames, mask).sum(dim=1), dim=-1)


class GatedBagOfFrames(nn.Module):
    """Gated Soft-DBoF (WILLOW's GatedDBoF, frame_level_models.py): the soft bag of frames re-weighted per cluster
    by a gate read from each cluster's strongest assignment over the frames, through a low-rank map (R [clusters,
    size], W [size, clusters]): L2(sigmoid(BN(L2(max_t a_t) R W)) * sum_t a_t), a bias in place of BN without it."""

    def __init__(self, size: int, clusters: int, batch_norm: bool, decay: float = SLIM_DECAY):
        super().__init__()
        self.assignment = ClusterAssignment(size, clusters, batch_norm, decay)
        self.reduce = nn.Parameter(torch.randn(clusters, size) / math.sqrt(size))
        self.expand = nn.Parameter(torch.randn(size, clusters) / math.sqrt(size))
        self.norm = slim_batch_norm(clusters, decay) if batch_norm else None  # a video-level batch norm
        self.bias = None if batch_norm else nn.Parameter(torch.randn(clusters) / math.sqrt(size))
        self.output_size = clusters

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        assignment = self.assignment(frames, mask)
        # Padding's assignments are 0, below any real frame's (a softmax is positive): the maximum is the real ones'.
        logits = F.normalize(assignment.amax(dim=1), dim=-1) @ self.reduce @ self.expand
        logits = self.norm(logits) if self.norm is not None else logits + cast(torch.Tensor, self.bias)
        return F.normalize(torch.sigmoid(logits) * assignment.sum(dim=1), dim=-1)


class WillowModel(PooledModalitiesModel):
    """The WILLOW architecture around one pooling kind (see the module docstring); subclasses name their pooling of
    each modality (`pooling_kinds`: rgb first, the last one for the rest, each made as Kind(size, clusters, batch_norm,
    decay, **pooling_options)) and the hyper-parameter of their number of clusters (`cluster_field`)."""

    audio_cluster_divisor = 2
    cluster_field = ""
    pooling_kinds: ClassVar[tuple[type[nn.Module], ...]] = ()
    pooling_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, feature_size: int, num_classes: int, hparams: WillowHParams,
                 modality_sizes: Sequence[int] = ()):
        super().__init__(feature_size, num_classes, hparams, modality_sizes)
        decay, batch_norm, hidden_size = (hparams.pooling_batch_norm_decay, hparams.willow_batch_norm,
                                          hparams.willow_hidden_size)
        cluster_size = getattr(hparams, self.cluster_field)
        audio_clusters = max(1, cluster_size // self.audio_cluster_divisor)
        clusters = modality_split(self.modality_sizes, cluster_size, audio_clusters)
        self.input_norm = FrameBatchNorm(feature_size, decay) if batch_norm else None
        self.poolings = nn.ModuleList(self.make_pooling(modality, size, count, batch_norm, decay)
                                      for modality, (size, count) in enumerate(zip(self.modality_sizes, clusters)))
        hidden = nn.Linear(sum(cast(int, pool.output_size) for pool in self.poolings), hidden_size)
        nn.init.normal_(hidden.weight, std=1 / math.sqrt(cluster_size))  # as published; the pooled parts have norm 1
        nn.init.normal_(hidden.bias, std=0.01)
        gating = ContextGating(hidden_size, batch_norm, decay) if hparams.context_gating else nn.Identity()
        self.head = nn.Sequential(hidden, gating)
        self.head_size = hidden_size
        self.classifier = create_classifier(hparams, hidden_size, num_classes)
        # WILLOW's MoeModel always batch-normalizes its gate (gating_prob_bn) and leaves its weights unpenalized.
        self.probability_gating = ContextGating(num_classes, True, decay) if hparams.moe_prob_gating else None

    def make_pooling(self, modality: int, size: int, clusters: int, batch_norm: bool, decay: float) -> nn.Module:
        """The pooling of feature number `modality` (0: rgb), of `size` dimensions, into `clusters`."""
        kind = self.pooling_kinds[min(modality, len(self.pooling_kinds) - 1)]
        return kind(size, clusters, batch_norm, decay, **self.pooling_options)


@register_model(NetVladHParams)
class NetVLADModel(WillowModel):
    """WILLOW's NetVLAD model (Miech et al. 2017, Sec. 3.1 and 4.1; the best single model, "Gated NetVLAD")."""

    cluster_field = "netvlad_cluster_size"
    pooling_kinds = (NetVlad,)


@register_model(NetVladHParams)
class NetRVLADModel(NetVLADModel):
    """WILLOW's NetRVLAD model (Miech et al. 2017, Sec. 3.1): NetVLAD without the cluster centres ("residual-less")."""

    pooling_options = {"residuals": False}


@register_model(NetFvHParams)
class NetFVModel(WillowModel):
    """WILLOW's NetFV model (Miech et al. 2017, Sec. 3.1 and 4.1; "Gated NetFV", 128 Gaussians)."""

    cluster_field = "fv_cluster_size"
    pooling_kinds = (NetFv,)


@register_model(SoftDbofHParams)
class SoftDbofModel(WillowModel):
    """WILLOW's Soft-DBoF model (Miech et al. 2017, Sec. 3.1 and 4.1; SoftDbofModelLF): soft bags of frames, 8000
    visual clusters and an eighth of that for audio, as published."""

    audio_cluster_divisor = 8
    cluster_field = "softdbof_cluster_size"
    pooling_kinds = (SoftBagOfFrames,)


@register_model(GatedDbofHParams)
class GatedDbofModel(WillowModel):
    """WILLOW's Gated Soft-DBoF model (GatedDbofModelLF): the visual bag of frames gated (GatedBagOfFrames), the
    audio one a plain Soft-DBoF of an eighth of the clusters; 4096 visual clusters, as published."""

    audio_cluster_divisor = 8
    cluster_field = "gateddbof_cluster_size"
    pooling_kinds = (GatedBagOfFrames, SoftBagOfFrames)

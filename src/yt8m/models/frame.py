"""Frame-level models of the starter kit: FrameLevelLogisticModel, DbofModel (deep bag of frames) and
LstmModel, on zero-padded `[batch, frames, features]` input whose padding never changes the output."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from yt8m.fields import setting
from yt8m.kernels import use_fused_kernels
from yt8m.kernels.ops import batch_norm_relu6_max_pool
from yt8m.models.base import BaseModel, ClassifierHParams, MoeHParams, starter_linear
from yt8m.models.registry import create_classifier, register_model, video_level_model


def _frame_counts(features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
    """Real frames per video, in [1, frames]: None means all; a video without frames reads one
    (zero) padding frame, as the starter kit's samplers do."""
    batch, frames = features.shape[:2]
    if num_frames is None:
        return torch.full((batch,), frames, dtype=torch.long, device=features.device)
    return num_frames.to(device=features.device, dtype=torch.long).clamp(1, frames)


@dataclass(frozen=True)
class FrameClassifierHParams(MoeHParams):
    """A frame model's video-level classifier on its pooled frames (with a MoE's hyper-parameters, its default)."""

    video_level_classifier_model: str = setting("MoeModel", "Frame models and DeepClassifierModel: the video-level "
                                                "classifier on top.",
                                                check=video_level_model)


@dataclass(frozen=True)
class DbofHParams(FrameClassifierHParams):
    iterations: int = setting(30, "DbofModel: number of frames sampled per video.", at_least=1)
    sample_random_frames: bool = setting(True, "DbofModel: sample random frames (else a random contiguous run).")
    dbof_cluster_size: int = setting(8192, "DbofModel: number of units in the cluster layer.", at_least=1)
    dbof_hidden_size: int = setting(1024, "DbofModel: number of units in the hidden layer.", at_least=1)
    dbof_add_batch_norm: bool = setting(True, "DbofModel: add batch normalization layers.")
    dbof_pooling_method: str = setting("max", "DbofModel: frame pooling, 'max' or 'average'.",
                                       choices=lambda: ("max", "average"))


@dataclass(frozen=True)
class LstmHParams(FrameClassifierHParams):
    lstm_cells: int = setting(1024, "LstmModel: units per LSTM layer.", at_least=1)
    lstm_layers: int = setting(2, "LstmModel: number of stacked LSTM layers.", at_least=1)


@register_model(ClassifierHParams)
class FrameLevelLogisticModel(BaseModel):
    """Logistic regression on the average of the real frames (padding excluded)."""

    frame_level = True

    def __init__(self, feature_size: int, num_classes: int, hparams: ClassifierHParams = ClassifierHParams()):
        super().__init__(feature_size, num_classes, hparams)
        self.linear = starter_linear(feature_size, num_classes)

    classifier_name = "linear"

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        return self.linear(self.shared_features(features, num_frames))

    def shared_features(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        counts = _frame_counts(features, num_frames)
        real = torch.arange(features.shape[1], device=features.device) < counts[:, None]
        return (features * real.unsqueeze(-1)).sum(dim=1) / counts.unsqueeze(-1)

    @property
    def shared_size(self) -> int:
        return self.feature_size

    def penalized_weights(self) -> list[torch.Tensor]:
        return [self.linear.weight]


@register_model(DbofHParams)
class DbofModel(BaseModel):
    """Deep bag of frames: sample `iterations` real frames per video, project each into a
    `dbof_cluster_size` space (batch norm or bias, ReLU6), pool over frames (max or average),
    a `dbof_hidden_size` layer (batch norm or bias, ReLU6), then the video-level classifier.

    Training samples frames at random with replacement (`sample_random_frames`) or a random
    contiguous run, as the starter kit does. In eval mode sampling is deterministic, so a video's
    prediction does not change from run to run: `iterations` evenly spaced frames, or the middle run.
    Batch norm uses slim's epsilon (1e-3) with a moving-average decay of 0.99 (slim: 0.999), so that
    short runs also evaluate with settled statistics.
    """

    frame_level = True
    normalizes_input = True  # the sampled frames only (dequantized too): a tenth of a 300-frame video's

    def __init__(self, feature_size: int, num_classes: int, hparams: DbofHParams = DbofHParams()):
        super().__init__(feature_size, num_classes, hparams)
        clusters, hidden, batch_norm = hparams.dbof_cluster_size, hparams.dbof_hidden_size, hparams.dbof_add_batch_norm
        self.iterations = hparams.iterations
        self.sample_random_frames = hparams.sample_random_frames
        self.pooling = hparams.dbof_pooling_method
        self.input_norm = self._batch_norm(feature_size, batch_norm)
        self.cluster_weights = nn.Parameter(torch.randn(feature_size, clusters) / math.sqrt(feature_size))
        self.cluster_norm, self.cluster_bias = self._norm_or_bias(clusters, batch_norm, 1 / math.sqrt(feature_size))
        self.hidden_weights = nn.Parameter(torch.randn(clusters, hidden) / math.sqrt(clusters))
        self.hidden_norm, self.hidden_bias = self._norm_or_bias(hidden, batch_norm, 0.01)
        self.classifier = create_classifier(hparams, hidden, num_classes)

    @staticmethod
    def _batch_norm(size: int, enabled: bool) -> nn.Module:
        return nn.BatchNorm1d(size, eps=1e-3, momentum=0.01) if enabled else nn.Identity()

    def _norm_or_bias(self, size: int, batch_norm: bool,
                      bias_stddev: float) -> tuple[nn.Module, Optional[nn.Parameter]]:
        if batch_norm:
            return self._batch_norm(size, True), None
        return nn.Identity(), nn.Parameter(torch.randn(size) * bias_stddev)

    def frame_indices(self, counts: torch.Tensor) -> torch.Tensor:
        """[batch, iterations] indices of real frames to read, given each video's frame count."""
        steps = torch.arange(self.iterations, device=counts.device)
        if self.sample_random_frames:
            if self.training:
                uniform = torch.rand(len(counts), self.iterations, device=counts.device)
                return (uniform * counts[:, None]).long()
            return ((steps + 0.5) * counts[:, None] / self.iterations).long()
        last_start = (counts - self.iterations).clamp(min=0)
        if self.training:
            start = (torch.rand(len(counts), device=counts.device) * (last_start + 1)).long()
        else:
            start = last_start // 2
        return torch.minimum(start[:, None] + steps, counts[:, None] - 1)

    classifier_name = "classifier"

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        return self.classifier.compute_logits(self.shared_features(features, num_frames), None)

    def shared_features(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        batch, _, size = features.shape
        index = self.frame_indices(_frame_counts(features, num_frames))
        sampled = features.gather(1, index.unsqueeze(-1).expand(-1, -1, size))
        if sampled.dtype == torch.uint8:  # sampled first: only a tenth of a 300-frame video's frames is dequantized
            real = None if num_frames is None else (index < num_frames.to(index.device)[:, None]).unsqueeze(-1)
            sampled = self.dequantize_frames(sampled, real)
        frames = F.normalize(sampled.reshape(-1, size), dim=-1)
        activations = self.input_norm(frames) @ self.cluster_weights
        if self._fused_pooling_applies(activations):
            pooled = self._fused_cluster_pooling(activations)
        else:
            clusters = self._activate(self.cluster_norm, activations, self.cluster_bias)
            clusters = clusters.view(batch, self.iterations, -1)
            pooled = clusters.amax(dim=1) if self.pooling == "max" else clusters.mean(dim=1)
        return self._activate(self.hidden_norm, pooled @ self.hidden_weights, self.hidden_bias)

    @property
    def shared_size(self) -> int:
        return self.hidden_weights.shape[1]

    def _fused_pooling_applies(self, activations: torch.Tensor) -> bool:
        """Training with batch norm and max pooling on float32 CPU tensors: one kernel each way instead of a dozen
        passes over [videos x frames, clusters] (DbofModel's step: bench/bench_train.py)."""
        norm = self.cluster_norm
        return (self.training and self.pooling == "max" and isinstance(norm, nn.BatchNorm1d) and
                norm.momentum is not None and activations.shape[0] > 1 and
                use_fused_kernels("dbof", activations, norm.weight, norm.bias))

    def _fused_cluster_pooling(self, activations: torch.Tensor) -> torch.Tensor:
        norm = self.cluster_norm
        assert isinstance(norm, nn.BatchNorm1d) and norm.running_mean is not None and norm.running_var is not None \
            and norm.num_batches_tracked is not None and norm.momentum is not None  # _fused_pooling_applies
        pooled, mean, var = batch_norm_relu6_max_pool(activations, norm.weight, norm.bias, self.iterations, norm.eps)
        rows = activations.shape[0]
        with torch.no_grad():  # the running statistics, as nn.BatchNorm1d keeps them (unbiased variance)
            norm.running_mean.lerp_(mean, norm.momentum)
            norm.running_var.lerp_(var * (rows / (rows - 1)), norm.momentum)
            norm.num_batches_tracked.add_(1)
        return pooled

    @staticmethod
    def _activate(norm: nn.Module, activation: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return F.relu6(norm(activation) if bias is None else activation + bias)


@register_model(LstmHParams)
class LstmModel(BaseModel):
    """A stack of `lstm_layers` LSTMs of `lstm_cells` units over the real frames (packed sequences,
    so padding never enters the state); the last layer's final state feeds the video-level classifier."""

    frame_level = True

    def __init__(self, feature_size: int, num_classes: int, hparams: LstmHParams = LstmHParams()):
        super().__init__(feature_size, num_classes, hparams)
        self.lstm = nn.LSTM(feature_size, hparams.lstm_cells, hparams.lstm_layers, batch_first=True)
        self._init_like_basic_lstm_cell(feature_size, hparams.lstm_cells)
        self.classifier = create_classifier(hparams, hparams.lstm_cells, num_classes)

    def _init_like_basic_lstm_cell(self, feature_size: int, cells: int) -> None:
        """tf BasicLSTMCell: Glorot-uniform over its [input + cells, 4 * cells] kernel, zero biases,
        and forget_bias=1.0 added to the forget gate."""
        for name, parameter in self.lstm.named_parameters():
            layer_input = feature_size if name.endswith("_l0") else cells
            if name.startswith("weight"):
                limit = math.sqrt(6 / (layer_input + cells + 4 * cells))
                nn.init.uniform_(parameter, -limit, limit)
            else:
                nn.init.zeros_(parameter)
                if name.startswith("bias_ih"):
                    nn.init.ones_(parameter[cells:2 * cells])  # PyTorch gate order: input, forget, cell, output

    classifier_name = "classifier"

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        return self.classifier.compute_logits(self.shared_features(features, num_frames), None)

    def shared_features(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        lengths = _frame_counts(features, num_frames).cpu()
        packed = pack_padded_sequence(features, lengths, batch_first=True, enforce_sorted=False)
        _, (hidden, _) = self.lstm(packed)
        return hidden[-1]

    @property
    def shared_size(self) -> int:
        return self.lstm.hidden_size

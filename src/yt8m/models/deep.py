"""DeepClassifierModel: a video-level multi-layer network (batch norm, ReLU, dropout) feeding a video-level
classifier (MoeModel, LogisticModel or GatedMoeModel), as the YouTube-8M 2017-2018 entries put on video features."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, cast

import torch
from torch import nn

from yt8m.fields import setting
from yt8m.models.base import BaseModel
from yt8m.models.frame import FrameClassifierHParams
from yt8m.models.registry import create_classifier, register_model


@dataclass(frozen=True)
class DeepClassifierHParams(FrameClassifierHParams):
    """The hidden layers; the classifier is --video_level_classifier_model (with the MoE's hyper-parameters)."""

    deep_hidden_layers: int = setting(2, "DeepClassifierModel: hidden layers (0: batch norm, then the classifier).",
                                      at_least=0)
    deep_hidden_size: int = setting(1024, "DeepClassifierModel: units per hidden layer.", at_least=1)
    deep_dropout: float = setting(0.3, "DeepClassifierModel: dropout probability after each hidden layer.",
                                  at_least=0, below=1)


@register_model(DeepClassifierHParams)
class DeepClassifierModel(BaseModel):
    """Batch norm of the (L2-normalized) input, then `deep_hidden_layers` x [linear, batch norm, ReLU, dropout
    `deep_dropout`] of `deep_hidden_size` units, then the video-level classifier `video_level_classifier_model`.

    The hidden layers have no bias: the batch norm after each has its own shift. `l2_penalty` covers the hidden
    weights as it does the classifier's.
    """

    def __init__(self, feature_size: int, num_classes: int, hparams: DeepClassifierHParams = DeepClassifierHParams()):
        super().__init__(feature_size, num_classes, hparams)
        size = hparams.deep_hidden_size
        self.input_norm = nn.BatchNorm1d(feature_size)
        self.hidden = nn.ModuleList()
        width = feature_size
        for _ in range(hparams.deep_hidden_layers):
            self.hidden.append(nn.Sequential(nn.Linear(width, size, bias=False), nn.BatchNorm1d(size), nn.ReLU(),
                                             nn.Dropout(hparams.deep_dropout)))
            width = size
        self.classifier = create_classifier(hparams, width, num_classes)

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.classifier.compute_logits(self.hidden_features(features), None)

    def compute_output(self, features: torch.Tensor,
                       num_frames: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        # The classifier's own output: MoeModel's gives its probabilities in the pass of its logits (fused on CPU).
        return self.classifier.compute_output(self.hidden_features(features), None)

    def hidden_features(self, features: torch.Tensor) -> torch.Tensor:
        """What the classifier sees: the last hidden layer's output (without hidden layers, the batch-normalized
        input)."""
        hidden = self.input_norm(features)
        for layer in self.hidden:
            hidden = layer(hidden)
        return hidden

    def penalized_weights(self) -> list[torch.Tensor]:
        return [cast(nn.Linear, layer[0]).weight for layer in self.hidden if isinstance(layer, nn.Sequential)]

"""The contract every model keeps: L2-normalized input in (frames dequantized on the model's device; video-level
features as stored with --input_l2_normalize false), every class's logits and probabilities out, L2 penalties."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from yt8m.config import config_problems
from yt8m.data.format.decode import dequantize, quantization_scale_bias
from yt8m.data.reading.batch import Batch
from yt8m.fields import setting


@dataclass(frozen=True)
class ClassifierHParams:
    """What every model has: the starter kit's L2 penalty of its classifier weights."""

    l2_penalty: float = setting(1e-8, "L2 weight of the model's classifier weights.", at_least=0)


@dataclass(frozen=True)
class MoeHParams(ClassifierHParams):
    """A mixture of experts (MoeModel, and the classifier frame models put on pooled frames by default)."""

    moe_num_mixtures: int = setting(2, "MoeModel: number of experts per class (plus one dummy expert).", at_least=1)


# The float32 value of each uint8 quantized value, as the data layer's dequantize computes it (float32 q * scale +
# bias, rounded after the product and after the sum).
DEQUANTIZED = dequantize(np.arange(256, dtype=np.uint8))
_SCALE, _BIAS = map(float, quantization_scale_bias())


class BaseModel(nn.Module):
    """Input `[batch, features]` (video-level) or `[batch, frames, features]` with `num_frames`
    (frame-level, zero-padded; float32, or uint8 as stored: dequantized here, on the model's device, after any frame
    sampling); output `{"logits": [batch, classes], "predictions": sigmoid(logits)}`.

    A model is built from its hyper-parameters' dataclass, as registered (`Model(feature_size, num_classes, hparams)`,
    plus `modality_sizes` where it splits modalities): their defaults and valid values are written there once, and
    checked here. Subclasses implement `compute_logits` on already normalized input (and may override
    `compute_output`), and list the weights their own `l2_penalty` applies to in `penalized_weights` (sub-models list
    their own).
    """

    frame_level: ClassVar[bool] = False
    # True for a model that reads only some of the frames (DbofModel): it normalizes those itself, the same values
    # without the work on the frames it skips.
    normalizes_input: ClassVar[bool] = False
    # True for a model that treats each feature of --feature_names apart (learnable pooling per modality): it is
    # built with `modality_sizes`, the sizes of the concatenated input's parts, in order.
    splits_modalities: ClassVar[bool] = False
    # Frame models: the attribute holding the video-level classifier on `shared_features` (a multi-task trunk is the
    # model without it: yt8m.models.multihead). None: the model is one classifier on its input (video-level models).
    classifier_name: ClassVar[Optional[str]] = None
    dequantized_values: torch.Tensor  # frame-level models' buffer of the 256 dequantized values

    def __init__(self, feature_size: int, num_classes: int, hparams: ClassifierHParams):
        super().__init__()
        if feature_size < 1 or num_classes < 1:
            raise ValueError(f"{type(self).__name__}: feature_size ({feature_size}) and num_classes "
                             f"({num_classes}) must be positive")
        problems = config_problems(hparams)
        if problems:
            raise ValueError(f"{type(self).__name__}: " + "; ".join(problems))
        self.feature_size = feature_size
        self.num_classes = num_classes
        self.hparams = hparams
        self.l2_penalty = hparams.l2_penalty
        # The model section's --input_l2_normalize (yt8m.models.config.build_model sets it): False, video-level
        # features reach compute_logits as stored. Frames are always normalized.
        self.input_l2_normalize = True
        if self.frame_level:  # not kept in checkpoints: a constant, moved with the model
            self.register_buffer("dequantized_values", torch.from_numpy(DEQUANTIZED.copy()), persistent=False)

    def forward(self, features: torch.Tensor, num_frames: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        return self.compute_output(self.prepare_input(features, num_frames), num_frames)

    def prepare_input(self, features: torch.Tensor, num_frames: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The input as `compute_logits` takes it: shape checked, uint8 frames dequantized (padding zero) and
        L2-normalized, unless `normalizes_input` (the model reads raw frames, uint8 or float32, and does both on the
        frames it samples); video-level features L2-normalized unless `input_l2_normalize` is False."""
        self._check_shape(features)
        if self.frame_level and features.dtype == torch.uint8 and not self.normalizes_input:
            features = self.dequantize_frames(features, real_frames(features, num_frames))
        if self.frame_level and features.shape[1] == 0:
            # Videos without frames read one zero padding frame, as the starter kit's frame samplers do.
            features = features.new_zeros(features.shape[0], 1, features.shape[2], dtype=torch.float32)
        if not self.normalizes_input and (self.frame_level or self.input_l2_normalize):
            features = self.normalize_input(features)
        return features

    def dequantize_frames(self, frames: torch.Tensor, real: Optional[torch.Tensor]) -> torch.Tensor:
        """float32 values of uint8 quantized frames, bit for bit yt8m.data.format.decode.dequantize's, zero where `real`
        (bool, broadcast over the features; None: everywhere) is False: the padding, which is zero as float32.

        One elementwise pass where compiled. Eager kernels round the product and the sum apart, as numpy does;
        compiled code may fuse them into one FMA, rounded once (Triton does by default), which changes 157 of the
        256 values: there the values are looked up instead.
        """
        if torch.compiler.is_compiling():
            values = self.dequantized_values[frames.long()]  # fused by the compiler: no int64 copy is made
        else:
            values = frames.float().mul_(_SCALE).add_(_BIAS)
        return values if real is None else values.masked_fill_(~real, 0.0)

    def normalize_input(self, features: torch.Tensor) -> torch.Tensor:
        """The starter kit's input: L2-normalized along the feature axis (per frame for frame-level input, all-zero
        padding frames staying zero). A model whose paper feeds it otherwise overrides this."""
        return F.normalize(features, dim=-1)

    def compute_output(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The output dict from what `compute_logits` takes; a model whose last step gives the probabilities
        in the same pass as the logits overrides it."""
        logits = self.compute_logits(features, num_frames)
        return {"logits": logits, "predictions": torch.sigmoid(logits)}

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        """Logits [batch, classes] from normalized features, raw ones where `normalizes_input` (frame models:
        `num_frames` None = all)."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute_logits")

    def shared_features(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        """What the classifier (`classifier_name`) reads, [batch, shared_size], from normalized features (raw ones
        where `normalizes_input`); a model without a classifier of its own reads the features themselves."""
        return features

    @property
    def shared_size(self) -> int:
        return self.feature_size

    def penalized_weights(self) -> list[torch.Tensor]:
        """The weights this model's own `l2_penalty` applies to (not those of its sub-models)."""
        return []

    def l2_penalties(self) -> list[tuple[torch.Tensor, float]]:
        """(weight, l2_penalty) of this model's and its sub-models' penalized weights: the loss's penalty term is
        sum of l2_penalty * sum(w^2) / 2 over them (slim.l2_regularizer), whose gradient the trainer adds."""
        return [(weight, module.l2_penalty) for module in self.modules() if isinstance(module, BaseModel)
                for weight in module.penalized_weights()]

    def regularization_loss(self) -> torch.Tensor:
        """Sum over this model and its sub-models of l2_penalty * sum(w^2) / 2 (slim.l2_regularizer), for loops
        of one's own; `yt8m train` adds its gradient in the optimizer step instead."""
        total = torch.zeros((), device=next(self.parameters()).device)
        for weight, penalty in self.l2_penalties():
            flat = weight.reshape(-1)
            total = total + torch.dot(flat, flat) * (penalty / 2)
        return total

    def _check_shape(self, features: torch.Tensor) -> None:
        expected = "[batch, frames, features]" if self.frame_level else "[batch, features]"
        if features.dim() != (3 if self.frame_level else 2) or features.shape[-1] != self.feature_size:
            raise ValueError(f"{type(self).__name__} expects input {expected} with features = "
                             f"{self.feature_size}, got shape {tuple(features.shape)}")


def real_frames(features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """bool [batch, frames, 1]: True at each video's real frames of `features` [batch, frames, ...]; None (all real)
    without `num_frames`."""
    if num_frames is None:
        return None
    frames = torch.arange(features.shape[1], device=features.device)
    return (frames < num_frames.to(features.device)[:, None]).unsqueeze(-1)


def forward(model: nn.Module, batch: Batch, heads: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """The model's output on a batch, the one call training, evaluation and prediction make: `{"logits",
    "predictions"}`, or for a multi-head model (yt8m.models.multihead) those of `heads`, `{key: {head: tensor}}`."""
    if heads is None:
        return model(batch.features, batch.num_frames)
    return model(batch.features, batch.num_frames, heads)


# slim.batch_norm's moving-average decay, which every TensorFlow model this package reproduces kept.
SLIM_DECAY = 0.999


def slim_batch_norm(size: int, decay: float = SLIM_DECAY) -> nn.BatchNorm1d:
    """nn.BatchNorm1d as slim.batch_norm's defaults make it: epsilon 1e-3 (torch: 1e-5) and moving averages that
    keep `decay` of their value a step (torch momentum = 1 - decay)."""
    return nn.BatchNorm1d(size, eps=1e-3, momentum=1 - decay)


def starter_linear(in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    """A layer initialized as slim.fully_connected: Glorot-uniform weights, zero bias."""
    layer = nn.Linear(in_features, out_features, bias=bias)
    nn.init.xavier_uniform_(layer.weight)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer

"""How big a model is (parameters, and megabytes as float32 checkpoints store it) and `--max_model_size_mb`, the
limit `yt8m train` checks before it touches the train dir (the Kaggle 2018 competition allowed 1 GB)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from yt8m.data.reading.spec import FeatureSpec
from yt8m.models.config import ModelConfig, build_model

BYTES_PER_VALUE = 4  # float32, as checkpoints hold every parameter and buffer
BYTES_PER_MB = 1024 * 1024
COUNTED = ("parameters and the buffers a checkpoint holds (e.g. batch-norm statistics) at 4 bytes (float32) a value; "
           "MB = 2^20 bytes")


class ModelTooLargeError(ValueError):
    """The model is larger than --max_model_size_mb: refused before training starts."""


@dataclass(frozen=True)
class ModelSize:
    """A model's values: `parameters` (what training learns) and `buffer_values` (e.g. running statistics)."""

    parameters: int
    buffer_values: int

    @property
    def megabytes(self) -> float:
        return (self.parameters + self.buffer_values) * BYTES_PER_VALUE / BYTES_PER_MB

    def as_dict(self) -> dict[str, Any]:
        """What logs and export metadata record."""
        return {"parameters": self.parameters, "buffer_values": self.buffer_values,
                "size_mb": round(self.megabytes, 6), "counted": COUNTED}

    def describe(self) -> str:
        return f"{self.parameters:,} parameters, {self.megabytes:.3f} MB"


def model_size(model: nn.Module) -> ModelSize:
    """The size of `model`; a tensor shared by several modules counts once. Buffers not kept in checkpoints
    (constants such as the frame models' dequantization values) do not count."""
    parameters = {id(parameter): parameter for parameter in model.parameters()}
    kept = {id(tensor): tensor for tensor in model.state_dict(keep_vars=True).values() if id(tensor) not in parameters}
    return ModelSize(parameters=sum(parameter.numel() for parameter in parameters.values()),
                     buffer_values=sum(buffer.numel() for buffer in kept.values()))


def config_model_size(model: ModelConfig, features: FeatureSpec) -> ModelSize:
    """The size of the model a model section describes on `features`, built on the meta device: no memory is
    allocated and no random numbers are drawn, so a model too large to build is measured as cheaply as a small one."""
    with torch.device("meta"):
        return model_size(build_model(model, features))


def check_model_size(model: ModelConfig, features: FeatureSpec, limit_mb: float,
                     network: Optional[nn.Module] = None) -> ModelSize:
    """The size of the section's model (of `network` when given: a multi-task model, built once its tasks' data is
    known); ModelTooLargeError when it exceeds `limit_mb` (--max_model_size_mb; 0: no limit)."""
    size = config_model_size(model, features) if network is None else model_size(network)
    if limit_mb and size.megabytes > limit_mb:
        raise ModelTooLargeError(
            f"--model {model.name} has {size.describe()}, over --max_model_size_mb {limit_mb:g}, counting {COUNTED}: "
            f"choose smaller hyper-parameters or raise the limit")
    return size

"""Models by their starter-kit class names (`--model MoeModel`), each with typed hyper-parameters whose
names and defaults are the ModelConfig fields (the starter kit's flags)."""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

from yt8m.models.base import BaseModel

M = TypeVar("M", bound=type[BaseModel])
_MODELS: dict[str, type[BaseModel]] = {}
_NOT_HPARAMS = ("self", "feature_size", "num_classes")


def register_model(cls: M) -> M:
    """Class decorator: make the model available by its class name."""
    if cls.__name__ in _MODELS:
        raise ValueError(f"a model named {cls.__name__} is already registered")
    _MODELS[cls.__name__] = cls
    return cls


def list_models() -> list[str]:
    return sorted(_MODELS)


def model_class(name: str) -> type[BaseModel]:
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    return _MODELS[name]


def hparam_names(name: str) -> list[str]:
    """The constructor's hyper-parameters: ModelConfig field names."""
    parameters = inspect.signature(model_class(name).__init__).parameters
    return [p for p in parameters if p not in _NOT_HPARAMS]


def create_model(name: str, feature_size: int, num_classes: int, **hparams: Any) -> BaseModel:
    """Build a model; hyper-parameters it does not take are ignored, so callers may pass all of them."""
    accepted = {key: value for key, value in hparams.items() if key in hparam_names(name)}
    return model_class(name)(feature_size, num_classes, **accepted)


def is_frame_level(name: str) -> bool:
    return model_class(name).frame_level


def model_hparams(name: str, config: Any) -> dict[str, Any]:
    """The fields of `config` (a ModelConfig or subclass) that this model uses."""
    return {field: getattr(config, field) for field in hparam_names(name)}


def create_classifier(name: str, feature_size: int, num_classes: int, **hparams: Any) -> BaseModel:
    """The video-level model a frame-level model puts on its pooled features
    (`--video_level_classifier_model`)."""
    if is_frame_level(name):
        raise ValueError(f"video_level_classifier_model must be a video-level model, got {name!r}")
    return create_model(name, feature_size, num_classes, **hparams)

"""Models by name (`--model MoeModel`) or import path (`--model mymodels:MyModel`), each with the dataclass of its
hyper-parameters: their names, defaults, help and valid values, which are the model's config fields and flags;
`create_model` builds one by name."""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, TypeVar

from torch import nn

from yt8m.config import config_from_dict
from yt8m.models.adapter import adapted_model
from yt8m.models.base import BaseModel
from yt8m.plugins.registry import Registry, described
from yt8m.plugins.signature import annotated_hparams, constructor_parameters, is_frozen_dataclass

M = TypeVar("M", bound=type[nn.Module])
# What a model's constructor takes, after self: its hyper-parameters whole, as `GPT(config)` (a model that splits
# modalities also takes their sizes).
CONSTRUCTOR = ["feature_size", "num_classes", "hparams"]
ENTRY_POINT_GROUP = "yt8m.models"


@dataclass(frozen=True)
class ModelEntry:
    """A registered model: its class (a BaseModel) and its hyper-parameters' frozen dataclass."""

    cls: type[BaseModel]
    hparams: type


def adopt_model(name: str, obj: Any, hparams: Optional[type] = None) -> ModelEntry:
    """What a name or import path finds, as a model: a BaseModel taking its hyper-parameters' dataclass (given, or
    its constructor's `hparams` annotation), or a plain nn.Module made one (yt8m.models.adapter). A TypeError says
    what the class lacks."""
    if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        raise TypeError(f"{described(obj)} is not a model: a model is an nn.Module class whose forward(features[, "
                        "num_frames]) returns logits [batch, classes], or a yt8m BaseModel")
    if issubclass(obj, BaseModel):
        return ModelEntry(obj, _base_model_hparams(obj, hparams))
    return ModelEntry(*adapted_model(obj))


# A model instance is refused as a run's model: training builds the model afresh from its class and hyper-parameters
# (an instance's weights would be silently dropped).
MODELS: Registry[ModelEntry] = Registry("model", ENTRY_POINT_GROUP, adopt_model, instances=(
    "a run builds its model afresh: pass the model's class, and its hyper-parameters by name "
    "(model=MyModel, hidden=64)"))


def register_model(model: Any = None) -> Any:
    """Class decorator: make a model available by its class name (`--model MyModel`); as `@register_model`, or
    `@register_model(HParams)` for a BaseModel whose constructor's `hparams` annotation is a base class's.

    A BaseModel takes (feature_size, num_classes, hparams), `hparams` a frozen dataclass of settings; a plain
    nn.Module takes feature_size, num_classes and keyword hyper-parameters with defaults, and its forward(features[,
    num_frames]) returns logits (yt8m.models.adapter). The hyper-parameters are the model's own config fields, given
    as `--model.NAME` (or `model: {name: ..., NAME: ...}` in YAML), each of its own type and default; one that no
    other model has is also taken by its flat name (`--NAME`).

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> @register_model
        ... class TwoLayer(nn.Module):
        ...     def __init__(self, feature_size: int, num_classes: int, hidden: int = 64):
        ...         super().__init__()
        ...         self.layers = nn.Sequential(nn.Linear(feature_size, hidden), nn.ReLU(),
        ...                                     nn.Linear(hidden, num_classes))
        ...     def forward(self, features):
        ...         return self.layers(features)
        >>> create_model("TwoLayer", 8, 3, hidden=16)(torch.rand(2, 8))["predictions"].shape
        torch.Size([2, 3])
        >>> MODELS.remove("TwoLayer")
    """
    if isinstance(model, type) and issubclass(model, nn.Module):
        return _register(model, None)
    return lambda cls: _register(cls, model)


def _register(cls: M, hparams: Optional[type]) -> M:
    entry = adopt_model(cls.__name__, cls, hparams)
    MODELS.add(cls.__name__, entry, cls, builtin=cls.__module__.startswith("yt8m."))
    return cls


@contextlib.contextmanager
def registered_model(cls: type[nn.Module], hparams: Optional[type] = None) -> Iterator[type[nn.Module]]:
    """Within the block, `cls` is a registered model (as `register_model` makes it); after, it is gone again: a model
    of a test's or a notebook's own, without leaving the registry changed."""
    with MODELS.scoped(cls.__name__, adopt_model(cls.__name__, cls, hparams), cls):
        yield cls


def _base_model_hparams(cls: type[BaseModel], hparams: Optional[type]) -> type:
    if hparams is None:
        hparams = annotated_hparams(cls)
    if hparams is None:
        raise TypeError(f"{cls.__name__}.__init__ takes no `hparams` annotated with its hyper-parameters' frozen "
                        "dataclass: annotate it, or register the model as register_model(HParams)")
    if not is_frozen_dataclass(hparams):
        raise TypeError(f"{cls.__name__}: its hyper-parameters {getattr(hparams, '__name__', hparams)} must be a "
                        "frozen dataclass")
    names = [parameter.name for parameter in constructor_parameters(cls)]
    expected = CONSTRUCTOR + (["modality_sizes"] if cls.splits_modalities else [])
    if names != expected:
        raise TypeError(f"{cls.__name__}.__init__ takes ({', '.join(names)}), but a model takes "
                        f"({', '.join(expected)}): its hyper-parameters {hparams.__name__} whole")
    return hparams


def list_models() -> list[str]:
    """The registered models' names (built-in, registered, installed packages' entry points)."""
    return MODELS.names()


def model_class(name: str) -> type[BaseModel]:
    """The class of model `name` (a registered name or an import path); a ValueError says why there is none."""
    return MODELS.get(name).cls


def hparams_class(name: str) -> type:
    return MODELS.get(name).hparams


def hparam_names(name: str) -> list[str]:
    return [f.name for f in dataclasses.fields(hparams_class(name))]


def hparam_fields(load: bool = True) -> list[tuple[dataclasses.Field, Any]]:
    """(field, type) of every registered model's hyper-parameters, one per name (the first model's), in registration
    order; `load`: installed packages' models included."""
    seen: dict[str, tuple[dataclasses.Field, Any]] = {}
    for entry in MODELS.entries(load):
        types = typing.get_type_hints(entry.component.hparams)
        for f in dataclasses.fields(entry.component.hparams):
            seen.setdefault(f.name, (f, types[f.name]))
    return list(seen.values())


def create_model(name: str, feature_size: int, num_classes: int, hparams: Any = None,
                 modality_sizes: Optional[Sequence[int]] = None, **values: Any) -> BaseModel:
    """Build model `name` with its hyper-parameters: `hparams` (its dataclass), or `values` by name, each missing
    one at the model's default; other models' hyper-parameters among them are ignored, so that callers may pass a
    set of them for several models (a ValueError lists an invalid value or a name no model has).
    `modality_sizes` (default: one modality of `feature_size`) reaches only the models that split modalities."""
    cls = model_class(name)
    if hparams is None:
        others = {f.name for f, _ in hparam_fields()} - set(hparam_names(name))
        own = {key: value for key, value in values.items() if key not in others}
        hparams = config_from_dict(hparams_class(name), own, source=f"{name} hyper-parameters")
    elif values:
        raise TypeError("give a model's hyper-parameters as `hparams` or by name, not both")
    if not cls.splits_modalities:
        return cls(feature_size, num_classes, hparams)
    sizes = tuple(modality_sizes or (feature_size,))
    if sum(sizes) != feature_size:
        raise ValueError(f"{name}: modality sizes {list(sizes)} do not add up to feature_size {feature_size}")
    # A model that splits modalities takes their sizes too (checked at registration); BaseModel's signature does not.
    return cls(feature_size, num_classes, hparams, sizes)  # type: ignore[call-arg]


def is_frame_level(name: str) -> bool:
    return model_class(name).frame_level


def known_model(name: str) -> Optional[str]:
    """The `check` of a model name field: None, or why `name` is not a model."""
    return MODELS.problem(name)


# What a model passes on to its --video_level_classifier_model: a classifier with other hyper-parameters would
# silently build with their defaults instead of the flags (or, DeepClassifierModel on itself, never end).
CLASSIFIER_HPARAMS = ("moe_num_mixtures", "l2_penalty")


def video_level_model(name: str) -> Optional[str]:
    """The `check` of --video_level_classifier_model."""
    return known_model(name) or classifier_problem(name)


def classifier_problem(name: str) -> Optional[str]:
    if is_frame_level(name):
        return f"{name!r} is a frame-level model: the classifier must be a video-level model"
    own = [field for field in hparam_names(name) if field not in CLASSIFIER_HPARAMS]
    if own:
        return (f"{name!r} has hyper-parameters a classifier is not given ({', '.join(own)}): choose a model with "
                f"only {' and '.join(CLASSIFIER_HPARAMS)}, e.g. MoeModel, LogisticModel or GatedMoeModel")
    return None


def create_classifier(hparams: Any, feature_size: int, num_classes: int) -> BaseModel:
    """The video-level model a frame-level model (or DeepClassifierModel) puts on its features: its
    `video_level_classifier_model`, given the model's own values of the classifier's hyper-parameters."""
    name = hparams.video_level_classifier_model
    problem = classifier_problem(name)
    if problem:
        raise ValueError(f"video_level_classifier_model: {problem}")
    values = {field: getattr(hparams, field) for field in hparam_names(name)}
    return create_model(name, feature_size, num_classes, **values)

"""Models by their class names (`--model MoeModel`), each registered with the dataclass of its hyper-parameters:
their names, defaults, help and valid values, which are the model's config fields and flags; `create_model` builds
one by name."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import typing
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar

from yt8m.config import config_from_dict
from yt8m.fields import closest
from yt8m.models.base import BaseModel

M = TypeVar("M", bound=type[BaseModel])
_MODELS: dict[str, type[BaseModel]] = {}
_HPARAMS: dict[str, type] = {}
# What a model's constructor takes, after self: its hyper-parameters whole, as `GPT(config)` (a model that splits
# modalities also takes their sizes).
CONSTRUCTOR = ["feature_size", "num_classes", "hparams"]


def register_model(hparams: type) -> Callable[[M], M]:
    """Class decorator: make the model available by its class name, with `hparams` (a frozen dataclass of settings)
    as its hyper-parameters; its constructor takes (feature_size, num_classes, hparams). A field another model also
    has must agree with it in type (they are one flag); its default is the model's own."""
    def register(cls: M) -> M:
        if cls.__name__ in _MODELS:
            raise ValueError(f"a model named {cls.__name__} is already registered")
        _check_constructor(cls, hparams)
        _check_shared_fields(cls.__name__, hparams)
        _MODELS[cls.__name__], _HPARAMS[cls.__name__] = cls, hparams
        return cls

    return register


@contextlib.contextmanager
def registered_model(cls: type[BaseModel], hparams: type) -> Iterator[type[BaseModel]]:
    """Within the block, `cls` is a registered model (as `register_model(hparams)(cls)` makes it); after, it is gone
    again: a model of a test's or a plugin's own, without leaving the registry changed."""
    register_model(hparams)(cls)
    try:
        yield cls
    finally:
        del _MODELS[cls.__name__], _HPARAMS[cls.__name__]


def _check_constructor(cls: type[BaseModel], hparams: type) -> None:
    # __dataclass_params__ is not in a dataclass's type: read by name.
    if not (dataclasses.is_dataclass(hparams) and getattr(hparams, "__dataclass_params__").frozen):  # noqa: B009
        raise TypeError(f"{cls.__name__}: its hyper-parameters {hparams.__name__} must be a frozen dataclass")
    names = list(inspect.signature(cls).parameters)
    expected = CONSTRUCTOR + (["modality_sizes"] if cls.splits_modalities else [])
    if names != expected:
        raise TypeError(f"{cls.__name__}.__init__ takes ({', '.join(names)}), but a model takes "
                        f"({', '.join(expected)}): its hyper-parameters {hparams.__name__} whole")


def _check_shared_fields(name: str, hparams: type) -> None:
    known = {f.name: kind for f, kind in hparam_fields()}
    types = typing.get_type_hints(hparams)
    for new in dataclasses.fields(hparams):
        if known.get(new.name, types[new.name]) != types[new.name]:
            raise TypeError(f"{name}'s hyper-parameter {new.name} differs from another model's in type: a name is "
                            "one flag")


def list_models() -> list[str]:
    return sorted(_MODELS)


def model_class(name: str) -> type[BaseModel]:
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}{closest(name, list_models())}; known models: "
                         f"{', '.join(list_models())}")
    return _MODELS[name]


def hparams_class(name: str) -> type:
    model_class(name)
    return _HPARAMS[name]


def hparam_names(name: str) -> list[str]:
    return [f.name for f in dataclasses.fields(hparams_class(name))]


def hparam_fields() -> list[tuple[dataclasses.Field, Any]]:
    """(field, type) of every registered model's hyper-parameters, one per name (its flag), in registration order;
    where models give a name different defaults, the field's `shown_default` says which model has which."""
    seen: dict[str, tuple[dataclasses.Field, Any]] = {}
    defaults: dict[str, dict[str, Any]] = {}
    for model, cls in _HPARAMS.items():
        types = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            seen.setdefault(f.name, (f, types[f.name]))
            defaults.setdefault(f.name, {})[model] = f.default
    return [(_with_shown_default(f, defaults[f.name]), kind) for f, kind in seen.values()]


def _with_shown_default(f: dataclasses.Field, by_model: dict[str, Any]) -> dataclasses.Field:
    if len(set(map(repr, by_model.values()))) == 1:
        return f
    groups: dict[str, list[str]] = {}
    for model, default in by_model.items():
        groups.setdefault(repr(default), []).append(model)
    shown = "; ".join(f"{value} for {', '.join(models)}" for value, models in groups.items())
    metadata = {**f.metadata, "shown_default": f"the model's: {shown}"}
    shown_field: dataclasses.Field = dataclasses.field(default=f.default, metadata=metadata)
    shown_field.name = f.name
    return shown_field


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
    return cls(feature_size, num_classes, hparams, sizes)  # type: ignore[call-arg]


def is_frame_level(name: str) -> bool:
    return model_class(name).frame_level


def known_model(name: str) -> Optional[str]:
    """The `check` of a model name field: None, or why `name` is not a model."""
    if name not in _MODELS:
        return f"{name!r} is not a model{closest(name, list_models())} (known: {', '.join(list_models())})"
    return None


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

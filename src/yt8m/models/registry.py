"""Models by their class names (`--model MoeModel`), each registered with the dataclass of its hyper-parameters:
their names, defaults, help and valid values, which are the model's config fields and flags."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, Callable, Optional, Sequence, TypeVar

from yt8m.config import ConfigError, config_from_dict
from yt8m.fields import closest
from yt8m.models.base import BaseModel

M = TypeVar("M", bound=type[BaseModel])
_MODELS: dict[str, type[BaseModel]] = {}
_HPARAMS: dict[str, type] = {}


def register_model(hparams: type) -> Callable[[M], M]:
    """Class decorator: make the model available by its class name, with `hparams` (a dataclass) as its
    hyper-parameters; its constructor takes exactly those, with the same defaults, after (feature_size, num_classes).
    A field another model also has must agree with it in type (they are one flag); its default is the model's own."""
    def register(cls: M) -> M:
        if cls.__name__ in _MODELS:
            raise ValueError(f"a model named {cls.__name__} is already registered")
        _check_constructor(cls, hparams)
        _check_shared_fields(cls.__name__, hparams)
        _MODELS[cls.__name__], _HPARAMS[cls.__name__] = cls, hparams
        return cls

    return register


def _check_constructor(cls: type, hparams: type) -> None:
    parameters = list(inspect.signature(cls.__init__).parameters.values())[3:]  # after self, feature_size, classes
    if cls.splits_modalities:
        parameters = [p for p in parameters if p.name != "modality_sizes"]
    declared = {f.name: f.default for f in dataclasses.fields(hparams)}
    taken = {p.name: p.default for p in parameters}
    if taken != declared:
        raise TypeError(f"{cls.__name__}.__init__ takes {taken} after (feature_size, num_classes), but its "
                        f"hyper-parameters {hparams.__name__} declare {declared}")


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
    field = dataclasses.field(default=f.default, metadata={**f.metadata, "shown_default": f"the model's: {shown}"})
    field.name = f.name
    return field


def create_model(name: str, feature_size: int, num_classes: int, modality_sizes: Optional[Sequence[int]] = None,
                 **hparams: Any) -> BaseModel:
    """Build a model; hyper-parameters it does not take are ignored, so callers may pass all of them.
    `modality_sizes` (default: one modality of `feature_size`) reaches only the models that split modalities."""
    accepted = {key: value for key, value in hparams.items() if key in hparam_names(name)}
    cls = model_class(name)
    if cls.splits_modalities:
        sizes = tuple(modality_sizes or (feature_size,))
        if sum(sizes) != feature_size:
            raise ValueError(f"{name}: modality sizes {list(sizes)} do not add up to feature_size {feature_size}")
        accepted["modality_sizes"] = sizes
    return cls(feature_size, num_classes, **accepted)


def create_model_from_config(config: Any) -> BaseModel:
    """The model a config (`model`, `model_hparams`, `feature_sizes`, `num_classes`) describes."""
    return create_model(config.model, sum(config.feature_sizes), config.num_classes,
                        modality_sizes=config.feature_sizes, **model_hparams(config.model, config))


def is_frame_level(name: str) -> bool:
    return model_class(name).frame_level


def model_hparams(name: str, config: Any) -> dict[str, Any]:
    """The hyper-parameters of model `name` in `config.model_hparams`, each missing one at the model's default."""
    given = config.model_hparams
    return {f.name: given.get(f.name, f.default) for f in dataclasses.fields(hparams_class(name))}


def resolve_hparams(name: str, given: dict[str, Any], source: str,
                    known_fields: Sequence[str] = ()) -> tuple[dict[str, Any], list[str], list[str]]:
    """Model `name`'s hyper-parameters from `given` (text from flags, or values): (all of them typed, at the model's
    defaults where not given; problems: an ill-typed or invalid value, a name no model has, suggesting among the
    hyper-parameters and `known_fields`; the given names of other models' hyper-parameters, which `name` ignores)."""
    everyone = {f.name for f, _ in hparam_fields()}
    own = set(hparam_names(name))
    unknown = sorted(set(given) - everyone)
    problems = [f"{source}: unknown field '{key}'{closest(key, sorted(everyone | set(known_fields)))}"
                for key in unknown]
    try:
        typed = config_from_dict(hparams_class(name), {key: value for key, value in given.items() if key in own},
                                 source=source)
    except ConfigError as err:
        return {}, problems + err.problems, []
    return dataclasses.asdict(typed), problems, sorted(set(given) & everyone - own)


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
    return known_model(name) or _classifier_problem(name)


def _classifier_problem(name: str) -> Optional[str]:
    if is_frame_level(name):
        return f"{name!r} is a frame-level model: the classifier must be a video-level model"
    own = [field for field in hparam_names(name) if field not in CLASSIFIER_HPARAMS]
    if own:
        return (f"{name!r} has hyper-parameters a classifier is not given ({', '.join(own)}): choose a model with "
                f"only {' and '.join(CLASSIFIER_HPARAMS)}, e.g. MoeModel, LogisticModel or GatedMoeModel")
    return None


def create_classifier(name: str, feature_size: int, num_classes: int, **hparams: Any) -> BaseModel:
    """The video-level model a frame-level model (or DeepClassifierModel) puts on its features
    (`--video_level_classifier_model`)."""
    problem = _classifier_problem(name)
    if problem:
        raise ValueError(f"video_level_classifier_model: {problem}")
    return create_model(name, feature_size, num_classes, **hparams)

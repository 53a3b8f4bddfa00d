"""Hyper-parameters read off a component's constructor: the frozen dataclass its `hparams` argument is typed with,
or one made from its keyword arguments and their defaults; either way they are flags and config fields."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Optional, Sequence

from yt8m.fields import setting

HPARAMS_ARGUMENT = "hparams"


def constructor_parameters(cls: type) -> list[inspect.Parameter]:
    """The parameters of `cls(...)` (after self), in order."""
    return list(inspect.signature(cls).parameters.values())


def is_frozen_dataclass(kind: Any) -> bool:
    # __dataclass_params__ is not in a dataclass's type: read by name.
    return (isinstance(kind, type) and dataclasses.is_dataclass(kind)
            and getattr(kind, "__dataclass_params__").frozen)  # noqa: B009


def annotated_hparams(cls: type) -> Optional[type]:
    """The dataclass the constructor's `hparams` argument is annotated with; None where it takes no such argument."""
    parameters = _evaluated_parameters(cls)
    if HPARAMS_ARGUMENT not in parameters:
        return None
    kind = parameters[HPARAMS_ARGUMENT].annotation
    if not is_frozen_dataclass(kind):
        raise TypeError(f"{cls.__name__}.__init__'s {HPARAMS_ARGUMENT} argument must be annotated with a frozen "
                        f"dataclass (its hyper-parameters), got {kind!r}")
    return kind


def signature_hparams(component: Callable, given: Sequence[str], base: Optional[type] = None) -> type:
    """A frozen dataclass of `component`'s arguments other than those yt8m gives (`given`), each with its default and
    its annotation's type (or its default's); `base`'s fields come first. An argument without a default, or of no
    type one can tell, is a TypeError: it would be a flag without a value or a type."""
    name = getattr(component, "__name__", type(component).__name__)
    where = f"{name}.__init__" if isinstance(component, type) else name
    fields = []
    for parameter in _evaluated_parameters(component).values():
        if parameter.name in given or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.default is inspect.Parameter.empty:
            taken = f"besides {', '.join(given)} " if given else ""
            raise TypeError(f"{where}'s argument {parameter.name} needs a default: each argument {taken}is a "
                            f"hyper-parameter, set by name (a flag, a config field) and at its default where not "
                            f"given; write {parameter.name}: TYPE = DEFAULT")
        annotated = parameter.annotation is not inspect.Parameter.empty and not isinstance(parameter.annotation, str)
        kind = parameter.annotation if annotated else _type_of(parameter.default)
        if kind is None:
            raise TypeError(f"{where}'s argument {parameter.name} needs a type annotation: its default is None, "
                            f"which tells no type (write {parameter.name}: Optional[TYPE] = None)")
        fields.append((parameter.name, kind, setting(parameter.default, f"{name}'s argument {parameter.name}.")))
    return dataclasses.make_dataclass(f"{name}HParams", fields, bases=(base,) if base else (), frozen=True)


def _type_of(default: Any) -> Optional[type]:
    return None if default is None else type(default)


def _evaluated_parameters(component: Callable) -> dict[str, inspect.Parameter]:
    """The parameters of calling `component`, their annotations evaluated (left as text where they do not resolve:
    the defaults' types stand in)."""
    try:
        return dict(inspect.signature(component, eval_str=True).parameters)
    except Exception:  # an annotation naming what its module cannot resolve
        return dict(inspect.signature(component).parameters)

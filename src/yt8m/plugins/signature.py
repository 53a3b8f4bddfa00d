"""Hyper-parameters read off a component's constructor: the frozen dataclass its `hparams` argument is typed with,
or one made from its keyword arguments and their defaults; either way they are flags and config fields."""

from __future__ import annotations

import dataclasses
import inspect
import typing
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
    if HPARAMS_ARGUMENT not in inspect.signature(cls).parameters:
        return None
    hints = _hints(cls.__init__)
    kind = hints.get(HPARAMS_ARGUMENT)
    if not is_frozen_dataclass(kind):
        raise TypeError(f"{cls.__name__}.__init__'s {HPARAMS_ARGUMENT} argument must be annotated with a frozen "
                        f"dataclass (its hyper-parameters), got {kind!r}")
    return kind


def signature_hparams(component: Callable, given: Sequence[str], base: Optional[type] = None) -> type:
    """A frozen dataclass of `component`'s arguments other than those yt8m gives (`given`), each with its default and
    its annotation's type (or its default's); `base`'s fields come first. An argument without a default, or of no
    type one can tell, is a TypeError: it would be a flag without a value or a type."""
    name = getattr(component, "__name__", type(component).__name__)
    hints = _hints(component.__init__ if isinstance(component, type) else component)
    fields = []
    for parameter in inspect.signature(component).parameters.values():
        if parameter.name in given or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.default is inspect.Parameter.empty:
            raise TypeError(f"{name}'s argument {parameter.name} needs a default (it is a hyper-parameter: a flag "
                            f"and config field whose default is the argument's)")
        kind = hints.get(parameter.name, _type_of(parameter.default))
        if kind is None:
            raise TypeError(f"{name}'s argument {parameter.name} needs a type annotation (its default is None)")
        fields.append((parameter.name, kind, setting(parameter.default, f"{name}'s argument {parameter.name}.")))
    return dataclasses.make_dataclass(f"{name}HParams", fields, bases=(base,) if base else (), frozen=True)


def _type_of(default: Any) -> Optional[type]:
    return None if default is None else type(default)


def _hints(function: Callable) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: fall back to the defaults' types
        return {}

"""The configs the Python API's functions take: keyword arguments named as the flags over `config=` (a config
object, a YAML file's path or a dict), components given as objects named, checked as the commands check them."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Union, cast

from yt8m.api.components import named_components
from yt8m.config import C, DataclassInstance, config_from_dict, config_values, flattened, load_yaml

# What `config=` takes: the command's config object, a YAML file's path (read as `--config FILE` is), or a mapping
# of the same names (flat, dotted or nested by section).
ConfigGiven = Union[DataclassInstance, str, "os.PathLike[str]", dict[str, Any], None]


def given_values(cls: type, config: ConfigGiven, values: dict[str, Any]) -> dict[str, Any]:
    """The config's settings by flag (a config object's, a YAML file's or a dict's) with `values` over them, the
    components given as objects named; a config of another class is a ValueError."""
    return named_components({**_config_settings(cls, config), **flattened(cls, values)})


def _config_settings(cls: type, config: ConfigGiven) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, cls):
        return config_values(cast(DataclassInstance, config))
    if isinstance(config, (str, os.PathLike)):
        return flattened(cls, load_yaml(os.fspath(config)))
    if isinstance(config, dict):
        return flattened(cls, config)
    raise ValueError(f"config must be a {cls.__name__}, a YAML file's path or a dict, got {type(config).__name__}")


def checked_config(cls: type[C], config: ConfigGiven, values: dict[str, Any], source: str,
                   checks: Optional[Callable[[Any, Any], list[str]]] = None) -> C:
    """The config of `values` over `config`, typed and checked as the command's flags are (a config built by hand is
    read back by its values, so a value of the wrong type is one of the problems, not a TypeError): a ConfigError (a
    ValueError) lists every problem."""
    return config_from_dict(cls, given_values(cls, config, values), source=source, checks=checks)

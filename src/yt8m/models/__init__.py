"""Models by name: `create_model("MoeModel", feature_size, num_classes, **hparams)`.

Importing the package imports every module in it, so a model is its file: its class, registered with its
hyper-parameters' dataclass (`@register_model(HParams)`), which also gives it its flags and config fields.
"""

import importlib
import pkgutil

from yt8m.models.base import BaseModel
from yt8m.models.registry import (
    create_model,
    hparam_fields,
    hparam_names,
    hparams_class,
    is_frame_level,
    known_model,
    list_models,
    model_class,
    register_model,
    registered_model,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["BaseModel", "create_model", "hparam_fields", "hparam_names", "hparams_class", "is_frame_level",
           "known_model", "list_models", "model_class", "register_model", "registered_model"]

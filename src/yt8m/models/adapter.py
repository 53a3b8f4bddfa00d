"""A plain nn.Module as a yt8m model: its forward(features[, num_frames]) returns logits, and yt8m does the rest
(uint8 frames dequantized, padding frames zero, input L2-normalized, the output dict, the L2 penalty)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, ClassVar, Optional

import torch
from torch import nn

from yt8m.models.base import BaseModel, ClassifierHParams
from yt8m.plugins.faults import calling
from yt8m.plugins.signature import annotated_hparams, signature_hparams

# What yt8m gives a plain module's constructor; its other arguments are its hyper-parameters.
GIVEN = ("feature_size", "num_classes")


class ModuleAdapter(BaseModel):
    """Runs `module_class`, a plain nn.Module, as a model. Its input is what every model gets (normalized frames
    with the padding zero, or one vector per video); its logits [batch, classes] become the output dict. The L2
    penalty (`l2_penalty`, the starter kit's 1e-8) applies to its weight matrices, as to a built-in's classifier."""

    module_class: ClassVar[type[nn.Module]]
    module_hparams: ClassVar[Optional[type]]  # the dataclass its constructor takes whole; None: keyword arguments

    def __init__(self, feature_size: int, num_classes: int, hparams: Any):
        super().__init__(feature_size, num_classes, hparams)
        self.module = self.module_class(feature_size=feature_size, num_classes=num_classes, **self._arguments())

    def _arguments(self) -> dict[str, Any]:
        own = self.module_hparams or self.module_class
        names = ([f.name for f in dataclasses.fields(own)] if self.module_hparams else
                 [name for name in inspect.signature(own).parameters if name not in GIVEN])
        values = {name: getattr(self.hparams, name) for name in names if hasattr(self.hparams, name)}
        return {"hparams": self.module_hparams(**values)} if self.module_hparams else values

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        inputs = (features, num_frames) if self.frame_level else (features,)
        # The user's forward raising is named in one line; running out of memory is the loop's to report.
        logits = calling(f"model {self.module_class.__qualname__}", f"{self.module_class.__qualname__}.forward",
                         self.module, *inputs, passing=(torch.OutOfMemoryError,))
        expected = (features.shape[0], self.num_classes)
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != expected:
            raise ValueError(f"{self.module_class.__qualname__}.forward returned {_returned(logits)}, expected a "
                             f"tensor of logits [batch, classes] = {list(expected)} ({_input_described(features)}): "
                             "return one logit per class for each video (yt8m applies the sigmoid and makes the "
                             "output dict)")
        return logits

    def penalized_weights(self) -> list[torch.Tensor]:
        return [weight for weight in self.module.parameters() if weight.dim() >= 2]


def _returned(value: Any) -> str:
    """What a forward returned, for its error: a tensor's shape, a dict's keys, a sequence's length, or the type."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, dict):
        return f"a dict (keys {', '.join(map(repr, value))})"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _input_described(features: torch.Tensor) -> str:
    if features.dim() == 3:
        return f"for frames [batch, frames, features] = {list(features.shape)}"
    return f"for features [batch, features] = {list(features.shape)}"


def adapted_model(cls: type[nn.Module]) -> tuple[type[BaseModel], type]:
    """(the model class running `cls`, its hyper-parameters' dataclass: `cls`'s own and l2_penalty). A TypeError
    says what `cls` lacks: feature_size and num_classes in its constructor, a forward taking the features."""
    parameters = inspect.signature(cls).parameters
    missing = [name for name in GIVEN if name not in parameters]
    if missing:
        raise TypeError(f"{cls.__name__}.__init__ takes ({', '.join(parameters)}), but yt8m builds a model as "
                        f"{cls.__name__}(feature_size=..., num_classes=..., **hyper-parameters) (the input's size and "
                        f"the run's classes): add the argument {' and '.join(missing)}")
    frame_level = _frame_level(cls)
    own = annotated_hparams(cls)
    hparams = own or signature_hparams(cls, GIVEN)
    if "l2_penalty" not in {f.name for f in dataclasses.fields(hparams)}:
        hparams = dataclasses.make_dataclass(hparams.__name__, [], bases=(hparams, ClassifierHParams), frozen=True)
    adapter = type(cls.__name__, (ModuleAdapter,), {
        "module_class": cls, "module_hparams": own, "frame_level": frame_level, "__module__": cls.__module__,
        "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    return adapter, hparams


def _frame_level(cls: type[nn.Module]) -> bool:
    """A forward taking (features, num_frames) reads frames; one taking (features) a vector per video."""
    parameters = [p for p in inspect.signature(cls.forward).parameters.values()
                  if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not parameters or len(parameters) > 2:
        raise TypeError(f"{cls.__name__}.forward takes ({', '.join(p.name for p in parameters)}), but yt8m calls it as "
                        "forward(features) for video-level input or forward(features, num_frames) for frames (a "
                        "setting it needs is a hyper-parameter: an argument of __init__ with a default)")
    return len(parameters) == 2

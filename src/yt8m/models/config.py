"""The `model` section of the train and eval configs: the model by name, its hyper-parameters as its own dataclass,
and the multi-task trunk's layers; and the model such a section describes on a run's features."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from yt8m.config import ComponentSection, config_from_dict
from yt8m.data.reading.spec import FeatureSpec
from yt8m.fields import setting
from yt8m.models.base import BaseModel
from yt8m.models.registry import (
    create_model,
    hparam_fields,
    hparams_class,
    known_model,
    model_class,
    recorded_model_name,
)

# The settings that define what a checkpoint's model is: resuming, evaluating or predicting with other values would
# load weights into a different network or score a different task.
MODEL_IDENTITY_FIELDS = ("model", "feature_names", "feature_sizes", "frame_features", "num_classes", "label_loss",
                         "trunk_hidden_sizes")
MODEL_HPARAMS_HELP = ("The model's hyper-parameters (YAML mapping); each is also a flag and field of its own name, "
                      "as in the starter kit (--moe_num_mixtures 4). The model's defaults where not given.")


@dataclass(frozen=True)
class ModelConfig(ComponentSection):
    """Which model a run trains: its registered name, its hyper-parameters (the model's dataclass, at its defaults
    where not given), and the fully connected layers a multi-task run's heads share."""

    name: str = setting("LogisticModel", "Model: a registered name (LogisticModel, MoeModel, DbofModel, ...) or the "
                                         "import path of one's own (package.module:Name).", flag="model",
                        check=known_model)
    hparams: Any = setting(None, MODEL_HPARAMS_HELP, flag="model_hparams")
    trunk_hidden_sizes: list[int] = setting([], "Multi-task: fully connected ReLU layers shared by every task's head, "
                                                "on the model's shared features (video-level models: the input).")

    def __post_init__(self) -> None:
        # Recorded by the name that finds the model in any process (a model of a module's own: module:Name).
        object.__setattr__(self, "name", recorded_model_name(self.name))
        # Python callers may give the hyper-parameters as a mapping, or leave them to the model's defaults.
        cls = self.hparams_class(self.name)
        if cls is not None and not isinstance(self.hparams, cls):
            given = self.hparams
            if dataclasses.is_dataclass(given) and not isinstance(given, type):
                given = dataclasses.asdict(given)
            object.__setattr__(self, "hparams", config_from_dict(cls, dict(given or {}), f"--model {self.name}"))

    @classmethod
    def hparams_class(cls, name: str) -> Optional[type]:
        return hparams_class(name) if isinstance(name, str) and known_model(name) is None else None

    @classmethod
    def hparam_flags(cls) -> list[tuple[dataclasses.Field, Any]]:
        return hparam_fields()

    @property
    def frame_level(self) -> bool:
        return model_class(self.name).frame_level


def build_model(model: ModelConfig, features: FeatureSpec) -> BaseModel:
    """The model `model` describes on `features` (its input size, its classes, its modalities)."""
    return create_model(model.name, features.feature_size, features.num_classes, model.hparams,
                        modality_sizes=features.feature_sizes)

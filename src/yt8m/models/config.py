"""The `model` section of the train and eval configs: the model by name, its hyper-parameters (the values given;
the model's own dataclass once resolved) and the multi-task trunk's layers; and the model it describes on features."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from yt8m.config import ComponentSection
from yt8m.data.reading.spec import FeatureSpec
from yt8m.fields import setting
from yt8m.models.base import BaseModel
from yt8m.models.registry import MODELS, create_model, model_class
from yt8m.plugins.registry import Registry

# The settings that define what a checkpoint's model is: resuming, evaluating or predicting with other values would
# load weights into a different network or score a different task.
MODEL_IDENTITY_FIELDS = ("model", "feature_names", "feature_sizes", "frame_features", "num_classes", "label_loss",
                         "trunk_hidden_sizes", "input_l2_normalize")
MODEL_HPARAMS_HELP = ("The model's hyper-parameters (YAML mapping); each is also given by its dotted name "
                      "(--model.moe_num_mixtures 4) and, for the built-in models, by its starter-kit flag "
                      "(--moe_num_mixtures 4). The model's defaults where not given.")


@dataclass(frozen=True)
class ModelConfig(ComponentSection):
    """Which model a run trains: its registered name, its hyper-parameters (as given; once resolved, the model's
    dataclass at its defaults where not given), and the fully connected layers a multi-task run's heads share."""

    name: str = setting("LogisticModel", "Model: a registered name (LogisticModel, MoeModel, DbofModel, ...) or the "
                                         "import path of one's own (package.module:Name).", flag="model")
    hparams: Any = setting(None, MODEL_HPARAMS_HELP, flag="model_hparams")
    trunk_hidden_sizes: list[int] = setting([], "Multi-task: fully connected ReLU layers shared by every task's head, "
                                                "on the model's shared features (video-level models: the input).")
    input_l2_normalize: bool = setting(True, "Video-level features: L2-normalize each video's features before the "
                                             "model reads them (the starter kit's video-level models do); false: "
                                             "the model reads them as stored. Frame-level models always normalize "
                                             "each frame.")

    SCOPE: ClassVar[str] = "model"

    @classmethod
    def registry(cls) -> Registry[Any]:
        return MODELS

    @property
    def frame_level(self) -> bool:
        """Whether the model reads frames (finding it: for a resolved section, or a built-in's)."""
        return model_class(self.name).frame_level


def build_model(model: ModelConfig, features: FeatureSpec) -> BaseModel:
    """The model `model` describes on `features` (its input size, its classes, its modalities), its section resolved
    first where it is not yet."""
    model = model.resolved()
    built = create_model(model.name, features.feature_size, features.num_classes, model.hparams,
                         modality_sizes=features.feature_sizes)
    built.input_l2_normalize = model.input_l2_normalize
    return built

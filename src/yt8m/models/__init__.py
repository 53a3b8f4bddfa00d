"""The starter kit's models by name: `create_model("MoeModel", feature_size, num_classes, **hparams)`.

Importing the package registers LogisticModel, MoeModel, FrameLevelLogisticModel, DbofModel, LstmModel.
"""

from yt8m.models import frame, video  # noqa: F401  (registers the models)
from yt8m.models.base import BaseModel
from yt8m.models.registry import (create_model, hparam_names, is_frame_level, list_models, model_class,
                                  model_hparams, register_model)

__all__ = ["BaseModel", "create_model", "hparam_names", "is_frame_level", "list_models", "model_class",
           "model_hparams", "register_model"]

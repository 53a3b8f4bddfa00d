"""yt8m's Python API, for notebooks and scripts: train, evaluate, predict, tune, export, ensemble, score and
tune_report as the `yt8m` commands do (the same checks, the same run directories), one's own models, losses and
metrics (by name or as objects), and one's own videos as data.

Every name here is also `yt8m.NAME`; everything else in the package is internal.
"""

from yt8m.api.runs import TrainResult, evaluate, predict, train, tune
from yt8m.api.videos import read_videos
from yt8m.api.workflow import ensemble, export, score, tune_report
from yt8m.data.making.videos import dequantize_frames as dequantize
from yt8m.data.making.videos import quantize, write_videos
from yt8m.eval.config import EvalConfig
from yt8m.inference.config import EnsembleConfig, PredictConfig
from yt8m.models.base import BaseModel
from yt8m.models.registry import create_model, register_model
from yt8m.tasks.losses import register_loss
from yt8m.tasks.metrics import Metric, register_metric
from yt8m.training.config import TrainConfig

__all__ = ["BaseModel", "EnsembleConfig", "EvalConfig", "Metric", "PredictConfig", "TrainConfig", "TrainResult",
           "create_model", "dequantize", "ensemble", "evaluate", "export", "predict", "quantize", "read_videos",
           "register_loss", "register_metric", "register_model", "score", "train", "tune", "tune_report",
           "write_videos"]

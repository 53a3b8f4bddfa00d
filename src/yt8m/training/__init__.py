"""Training: `train(config)` runs a whole run (trainer.py), `fit` is its loop (loop.py); around them the in-training
evaluation and exports (evaluation.py, exports.py), speed (meter.py) and summaries (summaries.py)."""

from yt8m.training.loop import NonFiniteLossError, TrainEvent, TrainHook, fit
from yt8m.training.trainer import train

__all__ = ["NonFiniteLossError", "TrainEvent", "TrainHook", "fit", "train"]

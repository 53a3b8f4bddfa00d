"""Training: `train(config)` runs a whole run (trainer.py), built once by `build_run` (run.py) and stepped by `fit`
(loop.py); around them the config's checks (checks.py), the data (data.py), in-training validation and the copies of
the best models (validation.py, best_models.py), speed (meter.py) and summaries (summaries.py)."""

from yt8m.training.loop import NonFiniteLossError, TrainEvent, TrainHook, fit
from yt8m.training.trainer import train

__all__ = ["NonFiniteLossError", "TrainEvent", "TrainHook", "fit", "train"]

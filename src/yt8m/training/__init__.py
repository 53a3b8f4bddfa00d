"""Training: `train(config)` runs a whole run (trainer.py) of a TrainConfig (config.py, its sections beside what they
configure), built once by `build_run` (run.py) and looped by `fit` (loop.py: steps by stepper.py, checkpoints by
checkpointing.py, logs by summaries.py); around them the config's checks (checks.py), the data (data.py), in-training
validation and the copies of the best models (validation.py, best_models.py) and speed (meter.py)."""

from yt8m.training.checkpointing import NonFiniteLossError
from yt8m.training.config import TrainConfig
from yt8m.training.loop import TrainEvent, TrainHook, fit
from yt8m.training.trainer import train

__all__ = ["NonFiniteLossError", "TrainConfig", "TrainEvent", "TrainHook", "fit", "train"]

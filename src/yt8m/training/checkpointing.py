"""A run's checkpoints as the loop writes and reads them: the model, optimizer, progress, random streams and
evaluator at a step, as one Checkpoint (yt8m.io.checkpoints); a model with non-finite weights is never written."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch

from yt8m.io.checkpoints import Checkpoint, latest_checkpoint, load_checkpoint, save_checkpoint
from yt8m.tasks.taskset import TaskSet
from yt8m.training.config import CheckpointConfig
from yt8m.training.randomness import capture_rng_state
from yt8m.training.stepper import Stepper
from yt8m.training.validation import best_export_checkpoint

log = logging.getLogger("yt8m.train")
# In a checkpoint's progress: saved where no evaluation was due (a stop, a dead reader): a resume does not evaluate it.
UNSCHEDULED = "unscheduled"


class NonFiniteLossError(ValueError):
    """The training loss became NaN or infinite: training stops with the last good checkpoint kept."""


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint so that a resumed run continues exactly."""

    step: int = 0
    examples: int = 0  # global: summed over all processes of a distributed run
    epoch: int = 0  # epochs completed
    batches_in_epoch: int = 0  # batches of the current epoch each process has drawn (steps x aggregated)
    lr_factor: float = 1.0  # multiplies the staircase schedule; --lr_halving_patience halves it
    world_size: int = 1  # processes that trained; the epoch position holds only for the same number

    def steps_in_epoch(self, batches_per_step: int) -> int:
        return self.batches_in_epoch // batches_per_step


class Checkpointer:
    """Writes the run's checkpoints (its config document in each, the newest --keep_checkpoints kept) and reads one
    back into the stepper: to resume, or to revert to the best export's weights."""

    def __init__(self, config: CheckpointConfig, document: dict[str, Any], stepper: Stepper, tasks: TaskSet):
        self.config, self.document, self.stepper, self.tasks = config, document, stepper, tasks

    def last(self) -> Optional[str]:
        return latest_checkpoint(self.config.train_dir)

    def save(self, progress: Progress, validation: Optional[dict[str, Any]], final: bool = False,
             unscheduled: bool = False, reading: Optional[list[dict[str, Any]]] = None) -> str:
        self._refuse_non_finite_weights(progress.step)
        saved = {**dataclasses.asdict(progress), **({UNSCHEDULED: True} if unscheduled else {})}
        checkpoint = Checkpoint(config=self.document, progress=saved, rng=capture_rng_state(), validation=validation,
                                tasks=self.tasks.checkpoint_state(), reading=reading, **self.stepper.state())
        return save_checkpoint(self.config.train_dir, checkpoint, self.config.keep_checkpoints, final=final)

    def restore(self, checkpoint: Checkpoint, world_size: int) -> Progress:
        """Load a checkpoint to resume from; the progress it continues (an epoch under another number of processes
        starts over: the records split differently)."""
        self.stepper.load(checkpoint, "the checkpoint resumed from")
        self.stepper.scaler.load_state_dict(checkpoint.scaler)
        saved = Progress(**{name: value for name, value in checkpoint.progress.items() if name != UNSCHEDULED})
        if saved.world_size != world_size and saved.batches_in_epoch:
            log.warning("the checkpoint was written by %d process(es) in the middle of epoch %d; under %d the "
                        "records split differently, so that epoch starts over", saved.world_size,
                        saved.epoch + 1, world_size)
            saved.batches_in_epoch = 0
        return dataclasses.replace(saved, world_size=world_size)

    def revert_to_best(self, step: int, device: torch.device) -> str:
        """Load the weights and optimizer state of the best export of `step`; its checkpoint's path."""
        path = best_export_checkpoint(self.config.train_dir, step)
        self.stepper.load(load_checkpoint(path, map_location=device), path)
        return path

    def _refuse_non_finite_weights(self, step: int) -> None:
        """A finite loss can still give an update that overflows the weights: such a model is never saved."""
        broken = self.stepper.non_finite_weights()
        if broken:
            raise NonFiniteLossError(
                f"step {step}: the model's weights hold NaN or infinite values ({', '.join(broken[:3])}"
                f"{', ...' if len(broken) > 3 else ''}), so no checkpoint was written; the last one, "
                f"{self.last() or 'none yet'}, is kept. Lower --base_learning_rate, keep --clip_gradient_norm on, or "
                f"check the data.")

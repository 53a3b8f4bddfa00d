"""One optimizer step of a run: a group of batches (augmented where the run says so) and their gradients accumulated
(averaged across processes by DistributedDataParallel), then the L2 penalties, clipping, the optimizer and the
moving average of the weights (or, at an epoch's end, stochastic weight averaging's snapshot)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, ContextManager, Optional, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from yt8m.data.reading.batch import Batch
from yt8m.distributed.ranks import all_reduce_sum, rank_and_world_size
from yt8m.io.checkpoints import Checkpoint
from yt8m.models.checkpoints import load_checked
from yt8m.runtime import amp_dtype, autocast
from yt8m.tasks.taskset import TaskSet
from yt8m.training.augment import Augmenter
from yt8m.training.optim import (
    OptimizerConfig,
    Penalized,
    apply_update,
    l2_terms,
    load_optimizer_state,
    optimizer_state,
)
from yt8m.training.weight_average import EpochAverage, WeightAverage


@dataclass
class StepResult:
    """What a step gives the loop: the group's mean label loss (NaN where this process had no batch), the model's
    output on its last batch (None without one), the named tasks' mean losses, and how many processes met a loss
    that is not finite (the update was then not applied)."""

    loss: float = math.nan
    output: Optional[dict[str, Any]] = None
    task_losses: dict[str, float] = field(default_factory=dict)
    non_finite_processes: int = 0


class Stepper:
    """The model and its optimizer, stepped on groups of batches; `evaluated` is what is checkpointed and
    evaluated (the weight average where --ema_decay keeps one)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, tasks: TaskSet, config: OptimizerConfig,
                 mixed_precision: bool, compile_model: bool, device: torch.device, augment: Optional[Augmenter] = None):
        self.model, self.optimizer, self.tasks, self.config, self.device = model, optimizer, tasks, config, device
        self.mixed_precision, self.augment = mixed_precision, augment
        self.rank, self.world_size = rank_and_world_size()
        self.forward_loss = torch.compile(model_loss) if compile_model else model_loss
        self.penalties = l2_terms(cast(Penalized, model), config.regularization_penalty)  # a model's contract
        self.scaler = grad_scaler(mixed_precision, device)
        self.average = WeightAverage(model, config.ema_decay) if config.ema_decay else None
        self.epoch_average = EpochAverage(config.swa_start_epoch) if config.swa_start_epoch else None
        self.network: nn.Module = model
        self.last_batch: Optional[Batch] = None
        self.steps = 0  # optimizer steps of this process, for the augmentation's random draws

    @property
    def evaluated(self) -> nn.Module:
        """The model that is evaluated, checkpointed as "model" and shown to hooks: the weight average, if kept (SWA's
        once it has its first snapshot)."""
        if self.average is not None:
            return self.average.model
        if self.epoch_average is not None and self.epoch_average.model is not None:
            return self.epoch_average.model
        return self.model

    def end_epoch(self, epoch: int) -> None:
        """Epoch `epoch` (counted from 1) is complete: SWA takes its snapshot."""
        if self.epoch_average is not None:
            self.epoch_average.end_epoch(self.model, epoch)

    def begin(self) -> None:
        """Wrap the model for several processes, once its weights are final (DDP copies rank 0's at the start)."""
        self.network = distributed_model(self.model, self.device, self.tasks)
        self.model.train()

    def step(self, group: list[Batch], examples: int, lr: float) -> StepResult:
        """One optimizer step at learning rate `lr` on `examples` examples, summed over processes and the group's
        batches; not applied where a process's loss is not finite."""
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        result = self._accumulate_gradients(group, examples)
        result.non_finite_processes = all_reduce_sum(int(bool(group) and not math.isfinite(result.loss)),
                                                     self.device)
        if result.non_finite_processes:
            return result
        apply_update(self.model, self.optimizer, self.scaler, self.config.clip_gradient_norm,
                     self.config.clip_gradient_value, self.penalties)
        if self.average is not None:
            self.average.update(self.model)
        return result

    def _accumulate_gradients(self, group: list[Batch], examples: int) -> StepResult:
        """Backpropagate each batch's loss scaled by its share of the step's examples (times the processes,
        whose gradients DDP averages), so the update is that of one batch of all `examples`.

        A process whose share of the epoch has run out still joins the step's gradient averaging, on its last batch
        weighted 0."""
        self.optimizer.zero_grad(set_to_none=True)
        weighted = [(batch, len(batch) * self.world_size / examples) for batch in group]
        if not weighted:
            assert self.last_batch is not None, "the loop refuses a process that never had a batch"
            weighted = [(self.last_batch, 0.0)]
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        task_sums: dict[str, torch.Tensor] = {}
        output = None
        self.steps += 1
        for index, (batch, weight) in enumerate(weighted):
            if self.augment is not None and weight:
                batch = self.augment(batch, self.steps, index)
            with self._gradient_sync(index == len(weighted) - 1):
                with autocast(self.device, self.mixed_precision):
                    output, label_loss, loss, parts = self.forward_loss(self.network, self.tasks, batch, weight)
                self.scaler.scale(loss).backward()
            loss_sum += label_loss.detach().double() * len(batch)
            for name, part in parts.items():
                task_sums[name] = task_sums.get(name, 0) + part.double() * len(batch)
        if not group:
            return StepResult()
        self.last_batch = group[-1]
        count = sum(len(batch) for batch in group)
        return StepResult(loss_sum.item() / count, output, {name: (total / count).item()
                                                            for name, total in task_sums.items()})

    def _gradient_sync(self, sync: bool) -> ContextManager:
        """DDP averages gradients on the group's last backward only; the others accumulate locally."""
        if sync or self.network is self.model:
            return contextlib.nullcontext()
        # network is the DistributedDataParallel wrapper here (not the model): it has no_sync, which Network lacks.
        return self.network.no_sync()  # type: ignore[operator]

    def state(self) -> dict[str, Any]:
        """The Checkpoint fields of the model, the optimizer, the loss scaler and the weight average."""
        state = {"model": self.evaluated.state_dict(), "optimizer": optimizer_state(self.optimizer, self.model),
                 "scaler": self.scaler.state_dict()}
        if self.evaluated is not self.model:
            state["trained_weights"] = self.model.state_dict()
        return state

    def load(self, checkpoint: Checkpoint, source: str) -> None:
        """A checkpoint's trained weights, optimizer state (by parameter name) and, with --ema_decay, weight average
        (its "model"); a checkpoint of a differently shaped model or optimizer is refused, naming the tensors."""
        weights = checkpoint.trained_weights if checkpoint.trained_weights is not None else checkpoint.model
        load_checked(self.model, weights, source)
        load_optimizer_state(self.optimizer, self.model, checkpoint.optimizer, source)
        if self.average is not None:
            load_checked(self.average.model, checkpoint.model, source)
            self.average.updates = checkpoint.step
        if self.epoch_average is not None:
            self.epoch_average.restore(self.model, checkpoint.model, int(checkpoint.progress.get("epoch", 0)),
                                       lambda model, weights: load_checked(model, weights, source))
        self.steps = checkpoint.step

    def non_finite_weights(self) -> list[str]:
        """The names of the model's floating-point tensors that hold NaN or infinite values."""
        return [name for name, tensor in self.model.state_dict().items()
                if tensor.is_floating_point() and not bool(tensor.isfinite().all())]


def distributed_model(model: nn.Module, device: torch.device, tasks: TaskSet) -> nn.Module:
    """The model itself in one process; wrapped in DistributedDataParallel across several."""
    if rank_and_world_size()[1] == 1:
        return model
    # A multi-head step reaches only the heads of its batches' tasks, which may differ between processes.
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=tasks.named)


def model_loss(model: nn.Module, tasks: TaskSet, batch: Batch, example_weight: float = 1.0):
    """(model output, the tasks' label loss, example_weight x label loss, each named task's loss) of one batch;
    `model` may be DDP-wrapped.

    The L2 penalties are not in it: the optimizer step adds their gradient (optim.apply_update)."""
    output = tasks.forward(model, batch)
    label_loss, parts = tasks.loss(output, batch)
    return output, label_loss, label_loss * example_weight, parts


def grad_scaler(mixed_precision: bool, device: torch.device) -> torch.amp.GradScaler:
    """Loss scaling where the step needs it: mixed precision in float16 on CUDA (bfloat16 needs none)."""
    return torch.amp.GradScaler("cuda", enabled=mixed_precision and device.type == "cuda"
                                and autocast_uses_float16())


def autocast_uses_float16() -> bool:
    """float16 autocast needs loss scaling; bfloat16 does not."""
    return torch.cuda.is_available() and amp_dtype() == torch.float16

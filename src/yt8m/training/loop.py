"""The training loop: `fit` steps a model on batches, in one process or many (DistributedDataParallel), with
checkpoints, in-training evaluation and hooks; what it keeps in checkpoints resumes it exactly."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Iterator, Optional, Sequence

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from yt8m.config import TrainConfig, config_values
from yt8m.data.batch import Batch
from yt8m.data.device_prefetch import to_device_ahead
from yt8m.distributed.ranks import all_reduce_sum, barrier, broadcast_from_rank0, rank_and_world_size
from yt8m.io.checkpoints import checkpoint_path, latest_checkpoint, load_checkpoint, save_checkpoint
from yt8m.io.summaries import summary_writer, write_scalars
from yt8m.models.checkpoints import load_checked
from yt8m.runtime import amp_dtype, autocast
from yt8m.tasks.taskset import TaskSet, one_task_set
from yt8m.training.meter import RunEstimate, ThroughputMeter
from yt8m.training.optim import apply_update, l2_terms, load_optimizer_state, optimizer_state
from yt8m.training.randomness import capture_rng_state, process_seed, restore_rng_state, seed_everything
from yt8m.training.summaries import log_step
from yt8m.training.trained_ids import record_trained_ids
from yt8m.training.validation import TrainEvaluator, Verdict, best_export_checkpoint
from yt8m.training.weight_average import WeightAverage

log = logging.getLogger("yt8m.train")


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


@dataclass
class TrainEvent:
    """What a hook sees after each checkpoint save ("checkpoint") and each epoch end ("epoch_end")."""

    kind: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    config: TrainConfig
    step: int
    epoch: int  # epochs completed
    examples: int
    loss: float  # the last step's label loss
    checkpoint_path: Optional[str] = None
    final: bool = False
    metrics: Optional[dict[str, Any]] = None  # this checkpoint's validation metrics, when it was evaluated

    @property
    def train_dir(self) -> str:
        return self.config.train_dir


# A hook is any callable taking a TrainEvent; returning True asks training to stop (it then saves a
# final checkpoint). Hooks run in rank 0 only; their stop request reaches every process. In-process
# evaluation, early stopping and tuning pruners plug in here.
TrainHook = Callable[[TrainEvent], Optional[bool]]


def learning_rate(config: TrainConfig, examples: int) -> float:
    """Staircase decay over global examples seen, as the starter kit's exponential_decay(staircase=True)."""
    decays = examples // max(config.learning_rate_decay_examples, 1)
    return config.base_learning_rate * config.learning_rate_decay ** decays


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Optional[nn.Module],
        epoch_batches: Callable[[int], Iterable[Batch]], config: TrainConfig, *,
        hooks: Sequence[TrainHook] = (), resume: Optional[dict] = None,
        device: torch.device = torch.device("cpu"), evaluator: Optional[TrainEvaluator] = None,
        task: Optional[TaskSet] = None, epoch_fraction: Callable[[], Optional[float]] = lambda: None
        ) -> dict[str, Any]:
    """The training loop over `epoch_batches(epoch)` (any iterable of Batch), with checkpoints.

    The task set (default: the config's one task, with `loss_fn` as its loss; yt8m.tasks.taskset) says which
    labels the batches carry and how the loss and the logged batch metrics use them. `resume` is a checkpoint
    payload: the loop restores it, skips the batches of the current epoch it already saw, and then restores the RNG
    state, so that the rest matches an uninterrupted run.
    `evaluator` (rank 0's; None elsewhere) evaluates and exports checkpoints and may halve the learning
    rate, revert to the best weights or stop. `epoch_fraction()` says what share of the epoch's data this process
    has read (None: unknown), for the log's total steps and ETA within the first epoch.
    """
    return TrainingLoop(model, optimizer, task or one_task_set(config, loss_fn), epoch_batches, config, hooks,
                        resume, device, evaluator, epoch_fraction).run()


class TrainingLoop:
    """One `fit` call: the model (in DistributedDataParallel across processes), its optimizer and progress,
    stepped on groups of --numbatches_to_aggregate batches, checkpointed, evaluated and shown to hooks."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, task: TaskSet,
                 epoch_batches: Callable[[int], Iterable[Batch]], config: TrainConfig, hooks: Sequence[TrainHook],
                 resume: Optional[dict], device: torch.device, evaluator: Optional[TrainEvaluator],
                 epoch_fraction: Callable[[], Optional[float]] = lambda: None):
        self.rank, self.world_size = rank_and_world_size()
        self.chief = self.rank == 0
        self.model, self.optimizer, self.config, self.task = model, optimizer, config, task
        self.epoch_batches, self.hooks, self.device, self.evaluator = epoch_batches, hooks, device, evaluator
        self.forward_loss = torch.compile(model_loss) if config.compile else model_loss
        self.penalties = l2_terms(model, config.regularization_penalty)
        self.scaler = grad_scaler(config, device)
        self.progress = Progress(world_size=self.world_size)
        self.average = WeightAverage(model, config.ema_decay) if config.ema_decay else None
        if self.average is not None and self.chief:
            log.info("evaluating and checkpointing a moving average of the weights (--ema_decay %g)", config.ema_decay)
        self.resume = resume
        if resume is not None:
            self._restore(resume)
        elif not self.chief:
            seed_everything(process_seed(config.seed, self.rank, 0))
        self.network = distributed_model(model, device, task)
        self.meter = ThroughputMeter()
        self.estimate, self.epoch_fraction = RunEstimate(config.num_epochs, config.max_steps), epoch_fraction
        self.loss_value = math.nan
        self.stop = False
        self.hooked_step = self.progress.step
        self.pending_revert: Optional[int] = None
        self.last_batch: Optional[dict] = None
        self.writer = None
        self.bar = None

    def run(self) -> dict[str, Any]:
        """Set up, train epoch after epoch (steps, checkpoints, evaluations), clean up; the summary."""
        started = time.perf_counter()
        self._setup()
        with logging_redirect_tqdm():
            while not self._done():
                self._train_epoch()
        self._cleanup()
        return self._summary(started)

    def _setup(self) -> None:
        """Summaries and the progress bar (rank 0), and the verdict a resumed run's last evaluation left unapplied."""
        self.writer = summary_writer(self.config.train_dir, self.progress.step) if self.chief else None
        self.bar = tqdm(total=self.config.max_steps, initial=self.progress.step, unit="step", dynamic_ncols=True,
                        disable=not (self.chief and sys.stderr.isatty()))
        self._settle(self._replayed_verdict())
        self.model.train()

    def _done(self) -> bool:
        config, progress = self.config, self.progress
        return self.stop or progress.epoch >= config.num_epochs or reached_max_steps(config, progress)

    @property
    def evaluated(self) -> nn.Module:
        """The model that is evaluated, checkpointed as "model" and shown to hooks: the weight average, if kept."""
        return self.average.model if self.average is not None else self.model

    def _load_weights(self, payload: dict, source: str) -> None:
        """A checkpoint's trained weights, optimizer state (by parameter name) and, with --ema_decay, weight average
        (its "model"); a checkpoint of a differently shaped model or optimizer is refused, naming the tensors."""
        load_checked(self.model, payload.get("trained_weights", payload["model"]), source)
        load_optimizer_state(self.optimizer, self.model, payload["optimizer"], source)
        if self.average is not None:
            load_checked(self.average.model, payload["model"], source)
            self.average.updates = payload["progress"]["step"]

    def _restore(self, resume: dict) -> None:
        self._load_weights(resume, "the checkpoint resumed from")
        self.scaler.load_state_dict(resume["scaler"])
        saved = Progress(**resume["progress"])
        if saved.world_size != self.world_size and saved.batches_in_epoch:
            log.warning("the checkpoint was written by %d process(es) in the middle of epoch %d; under %d the "
                        "records split differently, so that epoch starts over", saved.world_size,
                        saved.epoch + 1, self.world_size)
            saved.batches_in_epoch = 0
        self.progress = dataclasses.replace(saved, world_size=self.world_size)
        if self.evaluator is not None and "validation" in resume:
            self.evaluator.load_state_dict(resume["validation"])

    def _replayed_verdict(self) -> Verdict:
        """A resumed run re-evaluates its checkpoint when the interrupted run's verdict on it was lost."""
        if self.evaluator is None or self.resume is None:
            return Verdict()
        step = self.progress.step
        return self.evaluator.replay(self.evaluated, checkpoint_path(self.config.train_dir, step), step)

    def _train_epoch(self) -> None:
        config, progress = self.config, self.progress
        batches = iter(to_device_ahead(self.epoch_batches(progress.epoch), self.device))
        self._fast_forward(batches)
        while True:
            self.meter.start_wait()
            group = list(itertools.islice(batches, config.numbatches_to_aggregate))
            examples = all_reduce_sum(sum(len(batch) for batch in group), self.device)
            if examples == 0:  # every process has finished its share of the epoch
                self._end_epoch()
                return
            progress.batches_in_epoch += config.numbatches_to_aggregate
            self._step(group, examples)
            if progress.step % config.export_model_steps == 0:
                self._checkpoint()
            if self._done():
                return

    def _end_epoch(self) -> None:
        """Count the epoch, show it to the hooks and, with --checkpoint_every_epoch, checkpoint (and evaluate)."""
        progress = self.progress
        if progress.batches_in_epoch == 0:
            raise ValueError(self._no_examples_message())
        self.estimate.epoch_ended(self._steps_in_epoch())
        progress.epoch += 1
        progress.batches_in_epoch = 0
        self._settle(Verdict(stop=self._notify("epoch_end")) if self.chief else Verdict())
        if self.config.checkpoint_every_epoch and self.hooked_step != progress.step:
            self._checkpoint()

    def _steps_in_epoch(self) -> int:
        return self.progress.batches_in_epoch // self.config.numbatches_to_aggregate

    def _no_examples_message(self) -> str:
        skipped = " (--skip_corrupt skipped every record)" if self.config.skip_corrupt else ""
        return (f"epoch {self.progress.epoch + 1} has no training examples: {self.config.train_data_pattern} holds "
                f"no records{skipped}; nothing was trained")

    def _fast_forward(self, batches: Iterator[dict]) -> None:
        """After a resume: skip the batches the checkpoint had taken, then continue its random streams."""
        if self.resume is None:
            return
        skipped = collections.deque(itertools.islice(batches, self.progress.batches_in_epoch), maxlen=1)
        if skipped:  # a process whose share ran out before the checkpoint needs a stand-in batch at once
            self.last_batch = skipped[0].to(self.device)
        if self.chief:
            restore_rng_state(self.resume["rng"])
        else:
            seed_everything(process_seed(self.config.seed, self.rank, self.progress.step))
        self.resume = None

    def _step(self, group: list[dict], examples: int) -> None:
        """One optimizer step on `examples` examples, summed over processes and the group's batches."""
        config, progress = self.config, self.progress
        if self.pending_revert is not None:
            self._revert_to_best(self.pending_revert)
        lr = learning_rate(config, progress.examples) * progress.lr_factor
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        group = [batch.to(self.device) for batch in group]
        self.meter.data_ready()
        last_output = self._accumulate_gradients(group, examples)
        self._refuse_non_finite_loss(group)
        apply_update(self.model, self.optimizer, self.scaler, config.clip_gradient_norm, config.clip_gradient_value,
                     self.penalties)
        if self.average is not None:
            self.average.update(self.model)
        record_trained_ids(self.rank, progress.epoch, group)

        progress.step += 1
        progress.examples += examples
        examples_per_sec = self.meter.step_done(examples)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{self.loss_value:.4f}", ex_s=f"{examples_per_sec:.0f}", refresh=False)
        scalars = {"loss": self.loss_value, "learning_rate": lr, "examples_per_sec": examples_per_sec}
        metrics_now = progress.step % config.metrics_every_steps == 0
        batch_scores = {}
        if metrics_now and last_output is not None:
            batch_scores = self.task.batch_metrics(last_output, group[-1])
            scalars.update(batch_scores)
        task_losses = self.task.pop_losses()
        scalars.update(task_losses)
        if metrics_now or progress.step % config.log_every_steps == 0:
            total = self.estimate.total_steps(progress.step, progress.epoch, self._steps_in_epoch(),
                                              self.epoch_fraction())
            self.bar.total = total
            log_step(progress.step, progress.epoch, scalars, self.meter, list(task_losses) + list(batch_scores),
                     total, config.num_epochs, RunEstimate.time_left(progress.step, total,
                                                                    self.meter.seconds_per_step()))
            write_scalars(self.writer, scalars, progress.step)

    def _accumulate_gradients(self, group: list[dict], examples: int) -> Optional[dict]:
        """Backpropagate each batch's loss scaled by its share of the step's examples (times the processes,
        whose gradients DDP averages), so the update is that of one batch of all `examples`.

        A process whose share of the epoch has run out still joins the step's gradient averaging, on its
        last batch weighted 0. Returns the output of the group's last batch (None without one)."""
        self.optimizer.zero_grad(set_to_none=True)
        weighted = [(batch, len(batch) * self.world_size / examples) for batch in group]
        if not weighted:
            weighted = [(self._stand_in_batch(), 0.0)]
        label_loss_sum, output = torch.zeros((), dtype=torch.float64, device=self.device), None
        for index, (batch, weight) in enumerate(weighted):
            last = index == len(weighted) - 1
            with self._gradient_sync(last):
                with autocast(self.device, self.config.mixed_precision):
                    output, label_loss, loss = self.forward_loss(self.network, self.task, batch, weight)
                self.scaler.scale(loss).backward()
            label_loss_sum += label_loss.detach().double() * len(batch)
        if group:
            self.last_batch = group[-1]
            self.loss_value = label_loss_sum.item() / sum(len(batch) for batch in group)
            return output
        return None

    def _refuse_non_finite_loss(self, group: list[dict]) -> None:
        """A NaN or infinite loss on any process stops training before its update reaches the weights and before a
        checkpoint is written: the last checkpoint stays the last good one."""
        bad_processes = all_reduce_sum(int(bool(group) and not math.isfinite(self.loss_value)), self.device)
        if not bad_processes:
            return
        videos = [video_id for batch in group for video_id in batch.video_ids][:3]
        last = latest_checkpoint(self.config.train_dir)
        where = f" (this process's batch starts with videos {', '.join(videos)})" if group and videos else ""
        raise NonFiniteLossError(
            f"step {self.progress.step + 1}: the training loss is {self.loss_value} on {bad_processes} process(es)"
            f"{where}; stopped before updating the weights. The last checkpoint, {last or 'none yet'}, is kept. "
            f"Lower --base_learning_rate, keep --clip_gradient_norm on, or check the data.")

    def _refuse_non_finite_weights(self) -> None:
        """A finite loss can still give an update that overflows the weights: such a model is never saved."""
        broken = [name for name, tensor in self.model.state_dict().items()
                  if tensor.is_floating_point() and not bool(tensor.isfinite().all())]
        if broken:
            last = latest_checkpoint(self.config.train_dir)
            raise NonFiniteLossError(
                f"step {self.progress.step}: the model's weights hold NaN or infinite values ({', '.join(broken[:3])}"
                f"{', ...' if len(broken) > 3 else ''}), so no checkpoint was written; the last one, "
                f"{last or 'none yet'}, is kept. Lower --base_learning_rate, keep --clip_gradient_norm on, or check "
                f"the data.")

    def _gradient_sync(self, sync: bool) -> ContextManager:
        """DDP averages gradients on the group's last backward only; the others accumulate locally."""
        if sync or self.network is self.model:
            return contextlib.nullcontext()
        return self.network.no_sync()

    def _stand_in_batch(self) -> Batch:
        if self.last_batch is None:
            raise ValueError(f"process {self.rank} of {self.world_size} got no training records in epoch "
                             f"{self.progress.epoch + 1}: {self.config.train_data_pattern} has fewer records "
                             f"(or files) than processes x --num_readers can share")
        return self.last_batch

    def _checkpoint(self) -> None:
        """Rank 0 saves, evaluates and calls the hooks; every process then applies the verdict."""
        verdict = Verdict()
        if self.chief:
            path = self._save()
            self.hooked_step = self.progress.step
            metrics = None
            if self.evaluator is not None:
                verdict, metrics = self.evaluator.after_checkpoint(self.evaluated, path, self.progress.step)
            verdict.stop = self._notify("checkpoint", path, metrics=metrics) or verdict.stop
        self._settle(verdict)

    def _settle(self, verdict: Verdict) -> None:
        """Rank 0's verdict, applied on every process: halve the LR factor, revert before the next step, stop."""
        stop, halve, revert = broadcast_from_rank0(
            [verdict.stop, verdict.halve_learning_rate,
             -1 if verdict.revert_to_step is None else verdict.revert_to_step], self.device)
        if halve:
            self.progress.lr_factor *= 0.5
            log.info("step %d: learning-rate factor halved to %g", self.progress.step, self.progress.lr_factor)
        if revert >= 0:
            # Applied at the next step: when training ends here, the final checkpoint stays the evaluated one.
            self.pending_revert = int(revert)
        self.stop = self.stop or bool(stop)

    def _revert_to_best(self, step: int) -> None:
        path = best_export_checkpoint(self.config.train_dir, step)
        self._load_weights(load_checkpoint(path, map_location=self.device), path)
        self.pending_revert = None
        log.info("step %d: reverted to the weights and optimizer state of the best model, step %d (%s)",
                 self.progress.step, step, path)

    def _save(self, final: bool = False) -> str:
        self._refuse_non_finite_weights()
        payload = {"model": self.evaluated.state_dict(), "optimizer": optimizer_state(self.optimizer, self.model),
                   "scaler": self.scaler.state_dict(), "config": config_values(self.config),
                   "progress": dataclasses.asdict(self.progress), "rng": capture_rng_state()}
        if self.average is not None:
            payload["trained_weights"] = self.model.state_dict()
        if self.evaluator is not None:
            payload["validation"] = self.evaluator.state_dict()
        payload.update(self.task.checkpoint_state())
        return save_checkpoint(self.config.train_dir, payload, self.progress.step, self.config.keep_checkpoints,
                               final=final)

    def _notify(self, kind: str, checkpoint_path: Optional[str] = None, final: bool = False,
                metrics: Optional[dict] = None) -> bool:
        progress = self.progress
        event = TrainEvent(kind, self.evaluated, self.optimizer, self.config, progress.step, progress.epoch,
                           progress.examples, self.loss_value, checkpoint_path, final, metrics)
        # A list, not a generator: every hook sees the event even when an earlier one asks to stop.
        return any([bool(hook(event)) for hook in self.hooks])

    def _cleanup(self) -> None:
        """The final checkpoint and its evaluation (rank 0), then every process leaves together."""
        self.bar.close()
        if self.chief:
            final_path = self._save(final=True)
            metrics = None
            if self.evaluator is not None:
                metrics = self.evaluator.after_final(self.evaluated, final_path, self.progress.step)
            if self.progress.step != self.hooked_step:
                self._notify("checkpoint", final_path, final=True, metrics=metrics)
        if self.writer is not None:
            self.writer.close()
        barrier()  # the others wait for rank 0's final evaluation before the process group goes away

    def _summary(self, started: float) -> dict[str, Any]:
        meter = self.meter
        summary = {"global_step": self.progress.step, "examples": self.progress.examples,
                   "seconds": round(time.perf_counter() - started, 3),
                   "examples_per_sec": round(meter.steady_examples_per_sec(), 1),
                   "loss": None if math.isnan(self.loss_value) else self.loss_value,
                   "input_wait_fraction": round(meter.input_wait_fraction(), 4), "processes": self.world_size}
        if self.evaluator is not None:
            summary.update(self.evaluator.summary(), lr_factor=self.progress.lr_factor)
        log.info("done: %s", summary)
        return summary


def distributed_model(model: nn.Module, device: torch.device, tasks: TaskSet) -> nn.Module:
    """The model itself in one process; wrapped in DistributedDataParallel across several."""
    if rank_and_world_size()[1] == 1:
        return model
    # A multi-head step reaches only the heads of its batches' tasks, which may differ between processes.
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=tasks.named)


def model_loss(model: nn.Module, tasks: TaskSet, batch: Batch, example_weight: float = 1.0):
    """(model output, the tasks' label loss, example_weight x label loss) of one batch; `model` may be DDP-wrapped.

    The L2 penalties are not in it: the optimizer step adds their gradient (optim.apply_update)."""
    output = tasks.forward(model, batch)
    label_loss = tasks.loss(output, batch)
    return output, label_loss, label_loss * example_weight


def reached_max_steps(config: TrainConfig, progress: Progress) -> bool:
    return config.max_steps is not None and progress.step >= config.max_steps


def grad_scaler(config: TrainConfig, device: torch.device) -> torch.amp.GradScaler:
    """Loss scaling where the step needs it: mixed precision in float16 on CUDA (bfloat16 needs none)."""
    return torch.amp.GradScaler("cuda", enabled=config.mixed_precision and device.type == "cuda"
                                and autocast_uses_float16())


def autocast_uses_float16() -> bool:
    """float16 autocast needs loss scaling; bfloat16 does not."""
    return torch.cuda.is_available() and amp_dtype() == torch.float16

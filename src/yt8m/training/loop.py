"""The training loop: `fit` steps a model on batches, in one process or many (DistributedDataParallel), with
checkpoints, in-training evaluation and hooks; what it keeps in checkpoints resumes it exactly."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, Sequence

import torch
from torch import nn
from tqdm.contrib.logging import logging_redirect_tqdm

from yt8m.config import config_document
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.delivery import reader_worker_death, worker_deaths_deferred
from yt8m.data.reading.device_prefetch import to_device_ahead
from yt8m.distributed.ranks import all_gathered, all_reduce_sums, barrier, broadcast_from_rank0, rank_and_world_size
from yt8m.io.checkpoints import Checkpoint, checkpoint_path
from yt8m.tasks.taskset import TaskSet
from yt8m.training.augment import Augmenter
from yt8m.training.checkpointing import UNSCHEDULED, Checkpointer, NonFiniteLossError, Progress
from yt8m.training.config import CheckpointConfig, TrainConfig
from yt8m.training.memory_checks import MemoryLimitReached, check_memory_limit
from yt8m.training.meter import RunEstimate
from yt8m.training.randomness import process_seed, restore_rng_state, seed_everything
from yt8m.training.schedules import build_schedule
from yt8m.training.stepper import Stepper, StepResult
from yt8m.training.stopping import STOPS, StopReason
from yt8m.training.summaries import StepLog
from yt8m.training.trained_ids import record_trained_ids
from yt8m.training.validation import TrainEvaluator, Verdict, out_of_memory_error

log = logging.getLogger("yt8m.train")
EpochBatches = Callable[[int], Iterable[Batch]]


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
        return self.config.checkpoints.train_dir


# A hook is any callable taking a TrainEvent; returning True asks training to stop (it then saves a
# final checkpoint). Hooks run in rank 0 only; their stop request reaches every process. In-process
# evaluation, early stopping and tuning pruners plug in here.
TrainHook = Callable[[TrainEvent], Optional[bool]]


class ResumableReading(Protocol):
    """A run's data that can say where it stands and go on from there (yt8m.training.data.TrainingData): a resume
    then reads none of the epoch again."""

    def epoch_batches(self, epoch: int, resume: Optional[dict[str, Any]] = None) -> Iterable[Batch]: ...

    def trained(self, batch: Batch) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def resumes(self, state: Optional[dict[str, Any]]) -> bool: ...


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, tasks: TaskSet, epoch_batches: EpochBatches,
        config: TrainConfig, *, hooks: Sequence[TrainHook] = (), resume: Optional[Checkpoint] = None,
        device: torch.device = torch.device("cpu"), evaluator: Optional[TrainEvaluator] = None,
        epoch_fraction: Callable[[], Optional[float]] = lambda: None,
        reading: Optional[ResumableReading] = None) -> dict[str, Any]:
    """The training loop over `epoch_batches(epoch)` (any iterable of Batch), with checkpoints.

    The task set (yt8m.tasks.taskset; `one_task_set` for a model and a loss of one's own) says which labels the
    batches carry and how the loss and the logged batch metrics use them. `resume` is a checkpoint: the loop restores
    it, skips the batches of the current epoch it already saw, and then restores the RNG state, so that the rest
    matches an uninterrupted run. `evaluator` (rank 0's; None elsewhere) evaluates and exports checkpoints and may
    halve the learning rate, revert to the best weights or stop. `epoch_fraction()` says what share of the epoch's
    data this process has read (None: unknown), for the log's total steps and ETA within the first epoch. `reading`
    (whose epoch_batches are then the batches): data that keeps its readers' positions in each checkpoint, so that a
    resume goes on from there instead of reading the epoch up to the checkpoint again.
    """
    runtime, schedule = config.runtime, config.schedule
    augment = Augmenter(config.augment, schedule.seed, rank_and_world_size()[0]) if config.augment.active else None
    stepper = Stepper(model, optimizer, tasks, config.optimizer, runtime.mixed_precision, runtime.compile, device,
                      augment)
    checkpointer = Checkpointer(config.checkpoints, config_document(config), stepper, tasks)
    chief = rank_and_world_size()[0] == 0
    steps_log = StepLog(runtime.log_every_steps, runtime.metrics_every_steps,
                        RunEstimate(schedule.num_epochs, schedule.max_steps),
                        config.checkpoints.train_dir if chief else None, epoch_fraction)
    loop = TrainingLoop(config, stepper, checkpointer, steps_log, epoch_batches, hooks, evaluator, resume)
    loop.positions = ReadingPositions(reading)
    return loop.run()


class TrainingLoop:
    """One `fit` call: epochs of steps on groups of --numbatches_to_aggregate batches (the stepper's), checkpoints
    every --export_model_steps (the checkpointer's), evaluated and shown to hooks; rank 0 decides what follows an
    evaluation, every process applies it."""

    def __init__(self, config: TrainConfig, stepper: Stepper, checkpointer: Checkpointer, steps_log: StepLog,
                 epoch_batches: EpochBatches, hooks: Sequence[TrainHook], evaluator: Optional[TrainEvaluator],
                 resume: Optional[Checkpoint]):
        self.rank, self.world_size = rank_and_world_size()
        self.chief = self.rank == 0
        self.config, self.schedule = config, config.schedule
        self.stepper, self.checkpointer, self.log = stepper, checkpointer, steps_log
        self.epoch_batches, self.hooks, self.evaluator, self.resume = epoch_batches, hooks, evaluator, resume
        self.base_learning_rate = config.optimizer.base_learning_rate
        self.lr_schedule = build_schedule(config.lr_schedule, config.schedule.max_steps)
        self.progress = Progress(world_size=self.world_size)
        if resume is not None:
            self.progress = checkpointer.restore(resume, self.world_size)
            if evaluator is not None and resume.validation is not None:
                evaluator.load_state_dict(resume.validation)
        elif not self.chief:
            seed_everything(process_seed(self.schedule.seed, self.rank, 0))
        self.loss_value = math.nan
        self.stop = False  # asked by a hook or the evaluator: training ends as done (its final checkpoint)
        self.stopped: Optional[StopReason] = None  # a signal or a limit: training ends where it stands
        self.hooked_step = self.saved_step = self.progress.step
        self.pending_revert: Optional[int] = None
        self.positions = ReadingPositions(None)  # where the data's readers stand, for the checkpoints

    def run(self) -> dict[str, Any]:
        """Set up, train epoch after epoch (steps, checkpoints, evaluations), clean up; the summary."""
        started = time.perf_counter()
        self.stepper.begin()
        self.log.open(self.progress.step)
        self._settle(self._replayed_verdict())
        with logging_redirect_tqdm():
            try:
                while not self._done():
                    self._train_epoch()
            except (RuntimeError, OSError) as err:  # a dead reader or the memory limit: resumable, in one line
                stopped = err if isinstance(err, MemoryLimitReached) else reader_worker_death(err)
                if stopped is None:
                    raise
                # What was trained since the last checkpoint is saved (rank 0): the same command resumes it.
                saved = self._save(unscheduled=True) if self.chief and self.progress.step != self.saved_step else None
                raise resumable_error(stopped, self.progress.step, saved, self.checkpointer.last()) from err
        self._cleanup()
        return self._summary(started)

    def _done(self) -> bool:
        schedule, progress = self.schedule, self.progress
        return self.stop or self.stopped is not None or progress.epoch >= schedule.num_epochs or \
            reached_max_steps(schedule.max_steps, progress)

    def _replayed_verdict(self) -> Verdict:
        """A resumed run re-evaluates its checkpoint when the interrupted run's verdict on it was lost."""
        if self.evaluator is None or self.resume is None or self.resume.progress.get(UNSCHEDULED):
            return Verdict()  # a checkpoint saved where no evaluation was due (a stop) was not evaluated either
        step = self.progress.step
        path = checkpoint_path(self.config.checkpoints.train_dir, step)
        return self.evaluator.replay(self.stepper.evaluated, path, step)

    def _train_epoch(self) -> None:
        progress, per_step = self.progress, self.schedule.numbatches_to_aggregate
        resumed = self.positions.resumed_batches(self.resume, progress, self.rank, self.world_size, self.stepper)
        batches = iter(to_device_ahead(resumed if resumed is not None else self.epoch_batches(progress.epoch),
                                       self.stepper.device))
        self._fast_forward(batches if resumed is None else None)
        while True:
            self.log.meter.start_wait()
            # A stop asked for (a signal, a limit) is taken here, between steps and after the validations a step's
            # checkpoint ran; every process takes it together, with the step's count.
            reason = STOPS.reason()
            group = [] if reason is not None else list(itertools.islice(batches, per_step))
            examples, stops = all_reduce_sums([sum(len(batch) for batch in group), int(reason is not None)],
                                              self.stepper.device)
            if stops:
                self.stopped = reason or StopReason("stopped by another process", interrupted=True)
                return
            if examples == 0:  # every process has finished its share of the epoch
                self._end_epoch()
                return
            self._step(group, examples)
            if checkpoint_due(self.config.checkpoints, progress, examples):
                self._checkpoint()
            if self._done():
                return

    def _end_epoch(self) -> None:
        """Count the epoch, show it to the hooks and, with --checkpoint_every_epoch, checkpoint (and evaluate)."""
        progress = self.progress
        if progress.batches_in_epoch == 0:
            data = self.config.data
            skipped = " (--skip_corrupt skipped every record)" if data.skip_corrupt else ""
            raise ValueError(f"epoch {progress.epoch + 1} has no training examples: {data.train_data_pattern} holds "
                             f"no records{skipped}; nothing was trained")
        self.log.estimate.epoch_ended(self.progress.steps_in_epoch(self.schedule.numbatches_to_aggregate))
        progress.epoch += 1
        progress.batches_in_epoch = 0
        self.stepper.end_epoch(progress.epoch)
        self._settle(Verdict(stop=self._notify("epoch_end")) if self.chief else Verdict())
        if self.config.checkpoints.checkpoint_every_epoch and self.hooked_step != progress.step:
            self._checkpoint()

    def _fast_forward(self, batches: Optional[Iterator[Batch]]) -> None:
        """After a resume: skip the batches the checkpoint had taken (`batches`, where the data did not go on from
        its readers' positions), then continue its random streams."""
        if self.resume is None:
            return
        skipped = collections.deque(itertools.islice(batches or iter(()), self.progress.batches_in_epoch), maxlen=1)
        if skipped:  # a process whose share ran out before the checkpoint needs a stand-in batch at once
            self.stepper.last_batch = skipped[0].to(self.stepper.device)
        if self.chief:
            restore_rng_state(self.resume.rng)
        else:
            seed_everything(process_seed(self.schedule.seed, self.rank, self.progress.step))
        self.resume = None

    def _step(self, group: list[Batch], examples: int) -> None:
        """One optimizer step on `examples` examples, summed over processes and the group's batches."""
        progress = self.progress
        if self.pending_revert is not None:
            path = self.checkpointer.revert_to_best(self.pending_revert, self.stepper.device)
            log.info("step %d: reverted to the weights and optimizer state of the best model, step %d (%s)",
                     progress.step, self.pending_revert, path)
            self.pending_revert = None
        if not group and self.stepper.last_batch is None:
            raise ValueError(f"process {self.rank} of {self.world_size} got no training records in epoch "
                             f"{progress.epoch + 1}: {self.config.data.train_data_pattern} has fewer records (or "
                             f"files) than processes x --num_readers can share")
        lr = self.base_learning_rate * self.lr_schedule.factor(progress.step, progress.examples) * progress.lr_factor
        # A step is applied whole or not at all (what a dead reader's save keeps), and its log line is written whole:
        # a death raised inside a logging call would be taken by the logging module, printed as a traceback.
        with worker_deaths_deferred():
            try:
                group = [batch.to(self.stepper.device) for batch in group]
                self.log.meter.data_ready()
                result = self.stepper.step(group, examples, lr)
            except torch.OutOfMemoryError as err:  # in the batch's copy to the GPU or in the step
                raise out_of_memory_error("a training step", self.schedule.batch_size) from err
            if group:
                self.loss_value = result.loss
            if result.non_finite_processes:
                raise non_finite_loss_error(progress.step + 1, self.loss_value, result.non_finite_processes, group,
                                            self.checkpointer.last())
            record_trained_ids(self.rank, progress.epoch, group)
            self.positions.trained(group)
            progress.batches_in_epoch += self.schedule.numbatches_to_aggregate
            progress.step += 1
            progress.examples += examples
            self._record(group, result, lr, self.log.meter.step_done(examples))
        check_memory_limit()

    def _record(self, group: list[Batch], result: StepResult, lr: float, examples_per_sec: float) -> None:
        """The step's log line, progress bar and scalars: its loss, rate, tasks' losses and, every
        --metrics_every_steps, its last batch's metrics."""
        step = self.progress.step
        scalars = {"loss": self.loss_value, "learning_rate": lr, "examples_per_sec": examples_per_sec}
        batch_scores = {}
        if self.log.wants_metrics(step) and result.output is not None:
            batch_scores = self.stepper.tasks.batch_metrics(result.output, group[-1])
        scalars.update(batch_scores, **result.task_losses)
        steps_in_epoch = self.progress.steps_in_epoch(self.schedule.numbatches_to_aggregate)
        self.log.record(step, self.progress.epoch, steps_in_epoch, scalars, [*result.task_losses, *batch_scores])

    def _checkpoint(self) -> None:
        """Rank 0 saves, evaluates and calls the hooks; every process then applies the verdict."""
        verdict = Verdict()
        reading = self.positions.gathered(self.stepper)  # every process's, at rank 0
        if self.chief:
            path = self._save(reading=reading)
            self.hooked_step = self.progress.step
            metrics = None
            if self.evaluator is not None:
                verdict, metrics = self.evaluator.after_checkpoint(self.stepper.evaluated, path, self.progress.step)
            verdict.stop = self._notify("checkpoint", path, metrics=metrics) or verdict.stop
        self._settle(verdict)

    def _save(self, final: bool = False, unscheduled: bool = False,
              reading: Optional[list[dict[str, Any]]] = None) -> str:
        validation = self.evaluator.state_dict() if self.evaluator is not None else None
        with worker_deaths_deferred():
            path = self.checkpointer.save(self.progress, validation, final, unscheduled, reading)
        self.saved_step = self.progress.step
        return path

    def _settle(self, verdict: Verdict) -> None:
        """Rank 0's verdict, applied on every process: halve the LR factor, revert before the next step, stop."""
        stop, halve, revert = broadcast_from_rank0(
            [verdict.stop, verdict.halve_learning_rate,
             -1 if verdict.revert_to_step is None else verdict.revert_to_step], self.stepper.device)
        if halve:
            self.progress.lr_factor *= 0.5
            log.info("step %d: learning-rate factor halved to %g", self.progress.step, self.progress.lr_factor)
        if revert >= 0:
            # Applied at the next step: when training ends here, the final checkpoint stays the evaluated one.
            self.pending_revert = int(revert)
        self.stop = self.stop or bool(stop)

    def _notify(self, kind: str, checkpoint_path: Optional[str] = None, final: bool = False,
                metrics: Optional[dict] = None) -> bool:
        progress = self.progress
        event = TrainEvent(kind, self.stepper.evaluated, self.stepper.optimizer, self.config, progress.step,
                           progress.epoch, progress.examples, self.loss_value, checkpoint_path, final, metrics)
        # A list, not a generator: every hook sees the event even when an earlier one asks to stop.
        return any([bool(hook(event)) for hook in self.hooks])

    def _cleanup(self) -> None:
        """The final checkpoint and its evaluation (rank 0), or for a stop (a signal, a limit) what was trained since
        the last checkpoint saved as one, not evaluated nor final (the same command resumes it exactly); then every
        process leaves together."""
        reading = self.positions.gathered(self.stepper)
        if self.chief and self.stopped is not None:
            saved = self._save(unscheduled=True, reading=reading) if self.progress.step != self.saved_step else None
            log.info("step %d: %s; training stopped there (%s)", self.progress.step, self.stopped.message,
                     saved or self.checkpointer.last() or "no checkpoint yet")
        elif self.chief:
            final_path = self._save(final=True, reading=reading)
            metrics = None
            if self.evaluator is not None:
                metrics = self.evaluator.after_final(self.stepper.evaluated, final_path, self.progress.step)
            if self.progress.step != self.hooked_step:
                self._notify("checkpoint", final_path, final=True, metrics=metrics)
        self.log.close()
        barrier()  # the others wait for rank 0's final evaluation before the process group goes away

    def _summary(self, started: float) -> dict[str, Any]:
        meter = self.log.meter
        summary: dict[str, Any] = {"global_step": self.progress.step, "examples": self.progress.examples,
                                   "seconds": round(time.perf_counter() - started, 3),
                                   "examples_per_sec": round(meter.steady_examples_per_sec(), 1),
                                   "loss": None if math.isnan(self.loss_value) else self.loss_value,
                                   "input_wait_fraction": round(meter.input_wait_fraction(), 4),
                                   "processes": self.world_size}
        if self.evaluator is not None:
            summary.update(self.evaluator.summary(), lr_factor=self.progress.lr_factor)
        if self.stopped is not None:
            summary.update(stopped=self.stopped.message, interrupted=self.stopped.interrupted,
                           limit=self.stopped.limit, checkpoint=self.checkpointer.last() if self.chief else None)
        log.info("done: %s", summary)
        return summary


class ReadingPositions:
    """The loop's side of data that keeps its readers' positions (a ResumableReading; None: data that keeps none):
    the batches trained on noted, every process's state gathered for each checkpoint, and a resume's batches."""

    def __init__(self, reading: Optional[ResumableReading]):
        self.reading = reading
        self.exhausted = False  # this process's last step had no batch of its own (its share of the epoch ran out)

    def trained(self, group: list[Batch]) -> None:
        if self.reading is not None:
            for batch in group:
                self.reading.trained(batch)
        self.exhausted = not group

    def gathered(self, stepper: Stepper) -> Optional[list[dict[str, Any]]]:
        """Every process's state (collected at rank 0: each process calls it at the same step), with the stand-in
        batch of a process whose share of the epoch ran out."""
        if self.reading is None:
            return None
        state = self.reading.state()
        stand_in = stepper.last_batch if self.exhausted else None
        state["stand_in"] = None if stand_in is None else batch_record(stand_in)
        return all_gathered(state)

    def resumed_batches(self, resume: Optional[Checkpoint], progress: Progress, rank: int, world_size: int,
                        stepper: Stepper) -> Optional[Iterable[Batch]]:
        """After a mid-epoch resume from a checkpoint that kept this process's positions: the batches from there on
        (a process whose share had run out gets its stand-in batch back); None where the epoch is read up to the
        checkpoint again."""
        if resume is None or self.reading is None or not progress.batches_in_epoch:
            return None
        states = resume.reading or []
        state = states[rank] if len(states) == world_size else None
        if state is None or state.get("epoch") != progress.epoch or not self.reading.resumes(state):
            return None
        if state.get("stand_in") is not None:
            stepper.last_batch = Batch(**state["stand_in"]).to(stepper.device)
        log.info("resuming epoch %d where its readers stood after batch %d: the records their shuffle buffers held are "
                 "read again from their shards, and the epoch goes on", progress.epoch + 1, progress.batches_in_epoch)
        return self.reading.epoch_batches(progress.epoch, state)


def checkpoint_due(checkpoints: CheckpointConfig, progress: Progress, step_examples: int) -> bool:
    """After a step of `step_examples`: every --export_model_steps steps, and at the step that reached one of
    --checkpoint_at_examples (state-free, so a resume past it does not write it again)."""
    every = checkpoints.export_model_steps
    if every and progress.step % every == 0:
        return True
    before = progress.examples - step_examples
    return any(before < count <= progress.examples for count in checkpoints.checkpoint_at_examples)


def batch_record(batch: Batch) -> dict[str, Any]:
    """A batch as a checkpoint keeps it (plain values and CPU tensors: torch.load(weights_only=True) reads them)."""
    on_cpu = batch.to(torch.device("cpu"))
    return {field.name: getattr(on_cpu, field.name) for field in dataclasses.fields(on_cpu) if field.name != "position"}


def non_finite_loss_error(step: int, loss: float, processes: int, group: list[Batch],
                          last_checkpoint: Optional[str]) -> NonFiniteLossError:
    """A NaN or infinite loss on any process stops training before its update reaches the weights and before a
    checkpoint is written: the last checkpoint stays the last good one."""
    videos = [video_id for batch in group for video_id in batch.video_ids][:3]
    where = f" (this process's batch starts with videos {', '.join(videos)})" if group and videos else ""
    return NonFiniteLossError(
        f"step {step}: the training loss is {loss} on {processes} process(es){where}; stopped before updating the "
        f"weights. The last checkpoint, {last_checkpoint or 'none yet'}, is kept. Lower --base_learning_rate, keep "
        f"--clip_gradient_norm on, or check the data.")


def resumable_error(err: OSError, step: int, saved: Optional[str], last: Optional[str]) -> OSError:
    """A stop (a dead reader, the memory limit) as one line saying where the same command resumes: the checkpoint
    just `saved`, or the `last` one (nothing trained since), or the start."""
    if saved is not None:
        return type(err)(f"{err}; saved {saved} (step {step}): run the same command to resume")
    if last is not None:
        return type(err)(f"{err}; nothing was trained since {last}: run the same command to resume from it")
    return type(err)(f"{err}; nothing was trained yet: run the same command to start again")


def reached_max_steps(max_steps: Optional[int], progress: Progress) -> bool:
    return max_steps is not None and progress.step >= max_steps

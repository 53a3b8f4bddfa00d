"""`yt8m train`: the starter kit's train.py as one PyTorch loop, on one process or many under torchrun.

Resumes from the train dir's latest checkpoint (model, optimizer, step, epoch position, RNG state, LR factor),
checkpoints atomically, evaluates and exports when given --eval_data_pattern, logs to stderr and TensorBoard,
and prints one JSON summary line on stdout. Distributed: `torchrun --nproc_per_node N -m yt8m train ...`
(DistributedDataParallel; each process reads its share of the records; rank 0 writes every file).
Debugging the data split: with YT8M_TRAINED_IDS_DIR=DIR each process appends "<epoch> <video id>" for
every example it trains on to DIR/rank-<rank>.txt.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch import nn
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from yt8m.checkpoint import (
    capture_rng_state,
    checkpoint_config,
    checkpoint_dir,
    checkpoint_path,
    clear_final_marker,
    create_model_for,
    differing_fields,
    init_from_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    load_latest_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from yt8m.config import (
    MODEL_IDENTITY_FIELDS,
    TrainConfig,
    add_config_arguments,
    add_config_file_argument,
    config_problems,
    parse_config,
    save_config,
    shown,
)
from yt8m.distributed import (
    all_reduce_sum,
    barrier,
    broadcast_from_rank0,
    env_rank,
    exit_without_teardown,
    launched_by_torchrun,
    process_group,
    rank_and_world_size,
    relaunch_for_gpus,
    training_device,
)
from yt8m.optim import L2Terms, apply_update, build_optimizer, l2_terms
from yt8m.runtime import amp_dtype, autocast, reader_workers, setup_logging, to_device
from yt8m.train_eval import (
    EvaluateFn,
    TrainEvaluator,
    Verdict,
    best_export_checkpoint,
    evaluation_problems,
    validation_evaluator,
)

log = logging.getLogger("yt8m.train")

# Steps left out of the steady-state examples/s: worker start-up, allocator warm-up, first-touch page faults.
WARMUP_STEPS = 5

TRAINED_IDS_ENV = "YT8M_TRAINED_IDS_DIR"


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


def validate_config(config: TrainConfig, evaluating: bool = False) -> None:
    """One ValueError listing every problem; `evaluating`: train-and-evaluate has an evaluation to run."""
    problems = config_problems(config) + evaluation_problems(config, evaluating)
    if problems:
        raise ValueError("invalid training config:\n  " + "\n  ".join(problems))


def refuse_model_change(saved: TrainConfig, requested: TrainConfig, checkpoint: str) -> None:
    """The starter kit's model-flags guard: never load weights into a differently defined model."""
    from yt8m.models import model_hparams

    fields = list(MODEL_IDENTITY_FIELDS)
    for config in (saved, requested):
        fields += [name for name in model_hparams(config.model, config) if name not in fields]
    differing = differing_fields(saved, requested, fields)
    if differing:
        lines = "\n".join(f"  --{name}: checkpoint has {shown(old)}, this run asks for {shown(new)}"
                          for name, old, new in differing)
        raise ValueError(
            f"{checkpoint} was trained with different model settings:\n{lines}\n"
            f"Resume with the checkpoint's settings, pass --start_new_model to delete its checkpoints "
            f"and start over, or choose a new --train_dir.")


def remove_previous_run(train_dir: str) -> None:
    """--start_new_model: drop the checkpoints, evaluations, exports and summaries a previous run left."""
    from yt8m.exporters import EXPORT_DIR

    for path in (checkpoint_dir(train_dir), os.path.join(train_dir, "eval"), os.path.join(train_dir, EXPORT_DIR)):
        shutil.rmtree(path, ignore_errors=True)
    if os.path.isdir(train_dir):
        for name in os.listdir(train_dir):
            if name.startswith("events.out.tfevents."):
                os.remove(os.path.join(train_dir, name))
    log.info("--start_new_model: removed the previous checkpoints and summaries in %s", train_dir)


def train(config: TrainConfig, hooks: Sequence[TrainHook] = (), evaluate: Optional[EvaluateFn] = None) -> dict[str, Any]:
    """Train as `config` says, resuming from the train dir's latest checkpoint; returns the summary.

    Everything is checked (config, model, optimizer, loss, data) before the train dir is touched, so a failed start
    leaves it as it was. Under torchrun every process calls it and it joins the process group itself. With
    --eval_data_pattern, or an `evaluate(model, step) -> metrics` function (which replaces that evaluation), it
    trains and evaluates.
    """
    from yt8m.data.dataset import FeatureSpec, YT8MDataset, make_loader
    from yt8m.losses import create_loss

    validate_config(config, evaluating=bool(config.eval_data_pattern) or evaluate is not None)
    device = training_device(config.device)
    with process_group(device):
        rank, world_size = rank_and_world_size()
        seed_everything(config.seed)
        model = create_model_for(config).to(device)
        optimizer = build_optimizer(config.optimizer, model.parameters(), config.base_learning_rate)
        loss_fn = create_loss(config.label_loss)
        dataset = YT8MDataset(config.train_data_pattern, FeatureSpec.from_config(config), config.batch_size,
                              shuffle=True, seed=config.seed, shuffle_buffer=config.shuffle_buffer,
                              skip_corrupt=config.skip_corrupt, cache_in_memory=config.cache_in_memory)
        dataset.check_first_record()
        evaluator = None
        if rank == 0 and (config.eval_data_pattern or evaluate is not None):
            evaluator = TrainEvaluator(config, evaluate or validation_evaluator(config, device))
        newest = latest_checkpoint(config.train_dir)
        resume = checkpoint_to_resume(config, model)
        with train_dir_lock(config.train_dir, rank):
            prepare_train_dir(config, rank, newest)
            loader = make_loader(dataset, reader_workers(config.num_readers, dataset.spec.frame_features),
                                 pin_memory=device.type == "cuda")

            def epoch_batches(epoch: int) -> Iterable[dict]:
                dataset.set_epoch(epoch)
                return loader

            log.info("training %s (%d parameters) on %s, %d process(es), %d examples per optimizer step",
                     config.model, sum(p.numel() for p in model.parameters()), device, world_size,
                     config.batch_size * world_size * config.numbatches_to_aggregate)
            summary = fit(model, optimizer, loss_fn, epoch_batches, config,
                          hooks=hooks, resume=resume, device=device, evaluator=evaluator)
            if config.skip_corrupt:
                summary.update(skipped_files=all_reduce_sum(dataset.skipped_files, device),
                               skipped_records=all_reduce_sum(dataset.skipped_records, device))
            return summary


def checkpoint_to_resume(config: TrainConfig, model: nn.Module) -> Optional[dict]:
    """The payload of the train dir's newest readable checkpoint, checked to match the config (read only: a
    mismatch leaves the train dir as it was); without one (or with --start_new_model), `model` starts from
    --init_from when given."""
    found = None if config.start_new_model else load_latest_checkpoint(config.train_dir, map_location="cpu")
    resume_path, resume = found or (None, None)
    if resume is not None:
        refuse_model_change(checkpoint_config(resume, resume_path), config, resume_path)
        log.info("resuming from %s", resume_path)
        if config.init_from:
            log.info("--init_from %s is ignored: the run resumes from its own checkpoint", config.init_from)
    elif config.init_from:
        init_from_checkpoint(model, config.init_from).log(log)
    return resume


def prepare_train_dir(config: TrainConfig, rank: int, newest: Optional[str]) -> None:
    """Rank 0, holding the lock: start over (--start_new_model) and write the resolved config, once every process
    has read the checkpoint it resumes from; `newest`, the newest checkpoint when it was chosen, must still be."""
    barrier()
    if rank != 0:
        return
    if latest_checkpoint(config.train_dir) != newest:
        raise ValueError(f"another run wrote {latest_checkpoint(config.train_dir)} while this one started in "
                         f"{config.train_dir}: start this run again")
    if config.start_new_model:
        remove_previous_run(config.train_dir)
    save_config(config, os.path.join(config.train_dir, "config.yaml"))
    clear_final_marker(config.train_dir)


def train_dir_lock(train_dir: str, rank: int) -> ContextManager:
    """Rank 0 holds the train dir's lock for the whole run: a second trainer on it fails at once, naming this one."""
    from yt8m.lock import TrainDirLock

    return TrainDirLock(train_dir) if rank == 0 else contextlib.nullcontext()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def process_seed(seed: int, rank: int, step: int) -> int:
    """A seed of its own for each process (dropout, frame sampling), derived from the run's seed."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module,
        epoch_batches: Callable[[int], Iterable[dict]], config: TrainConfig, *,
        hooks: Sequence[TrainHook] = (), resume: Optional[dict] = None,
        device: torch.device = torch.device("cpu"), evaluator: Optional[TrainEvaluator] = None) -> dict[str, Any]:
    """The training loop over `epoch_batches(epoch)` (any iterable of batch dicts), with checkpoints.

    `resume` is a checkpoint payload: the loop restores it, skips the batches of the current epoch it
    already saw, and then restores the RNG state, so that the rest matches an uninterrupted run.
    `evaluator` (rank 0's; None elsewhere) evaluates and exports checkpoints and may halve the learning
    rate, revert to the best weights or stop.
    """
    return TrainingLoop(model, optimizer, loss_fn, epoch_batches, config, hooks, resume, device, evaluator).run()


class TrainingLoop:
    """One `fit` call: the model (in DistributedDataParallel across processes), its optimizer and progress,
    stepped on groups of --numbatches_to_aggregate batches, checkpointed, evaluated and shown to hooks."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module,
                 epoch_batches: Callable[[int], Iterable[dict]], config: TrainConfig, hooks: Sequence[TrainHook],
                 resume: Optional[dict], device: torch.device, evaluator: Optional[TrainEvaluator]):
        self.rank, self.world_size = rank_and_world_size()
        self.chief = self.rank == 0
        self.model, self.optimizer, self.loss_fn, self.config = model, optimizer, loss_fn, config
        self.epoch_batches, self.hooks, self.device, self.evaluator = epoch_batches, hooks, device, evaluator
        self.forward_loss = torch.compile(model_loss) if config.compile else model_loss
        self.penalties = l2_terms(model, config.regularization_penalty)
        self.scaler = torch.amp.GradScaler("cuda", enabled=config.mixed_precision and device.type == "cuda"
                                           and autocast_uses_float16())
        self.progress = Progress(world_size=self.world_size)
        self.resume = resume
        if resume is not None:
            self._restore(resume)
        elif not self.chief:
            seed_everything(process_seed(config.seed, self.rank, 0))
        self.network = distributed_model(model, device)
        self.meter = ThroughputMeter()
        self.loss_value = math.nan
        self.stop = False
        self.hooked_step = self.progress.step
        self.pending_revert: Optional[int] = None
        self.last_batch: Optional[dict] = None
        self.writer = None
        self.bar = None

    def run(self) -> dict[str, Any]:
        config, progress = self.config, self.progress
        started = time.perf_counter()
        self.writer = summary_writer(config.train_dir, progress.step) if self.chief else None
        self.bar = tqdm(total=config.max_steps, initial=progress.step, unit="step", dynamic_ncols=True,
                        disable=not (self.chief and sys.stderr.isatty()))
        self._settle(self._replayed_verdict())
        self.model.train()
        with logging_redirect_tqdm():
            while not self.stop and progress.epoch < config.num_epochs and not reached_max_steps(config, progress):
                self._train_epoch()
        self.bar.close()
        self._finish()
        return self._summary(started)

    def _restore(self, resume: dict) -> None:
        self.model.load_state_dict(resume["model"])
        self.optimizer.load_state_dict(resume["optimizer"])
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
        return self.evaluator.replay(self.model, checkpoint_path(self.config.train_dir, step), step)

    def _train_epoch(self) -> None:
        config, progress = self.config, self.progress
        batches = iter(self.epoch_batches(progress.epoch))
        self._fast_forward(batches)
        while True:
            self.meter.start_wait()
            group = list(itertools.islice(batches, config.numbatches_to_aggregate))
            examples = all_reduce_sum(sum(batch["labels"].shape[0] for batch in group), self.device)
            if examples == 0:  # every process has finished its share of the epoch
                if progress.batches_in_epoch == 0:
                    raise ValueError(self._no_examples_message())
                progress.epoch += 1
                progress.batches_in_epoch = 0
                self._settle(Verdict(stop=self._notify("epoch_end")) if self.chief else Verdict())
                return
            progress.batches_in_epoch += config.numbatches_to_aggregate
            self._step(group, examples)
            if progress.step % config.export_model_steps == 0:
                self._checkpoint()
            if self.stop or reached_max_steps(config, progress):
                return

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
            self.last_batch = to_device(skipped[0], self.device)
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
        group = [to_device(batch, self.device) for batch in group]
        self.meter.data_ready()
        last_output = self._accumulate_gradients(group, examples)
        self._refuse_non_finite_loss(group)
        apply_update(self.model, self.optimizer, self.scaler, config.clip_gradient_norm, config.clip_gradient_value,
                     self.penalties)
        record_trained_ids(self.rank, progress.epoch, group)

        progress.step += 1
        progress.examples += examples
        examples_per_sec = self.meter.step_done(examples)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{self.loss_value:.4f}", ex_s=f"{examples_per_sec:.0f}", refresh=False)
        scalars = {"loss": self.loss_value, "learning_rate": lr, "examples_per_sec": examples_per_sec}
        metrics_now = progress.step % config.metrics_every_steps == 0
        if metrics_now and last_output is not None:
            scalars.update(batch_metrics(last_output["predictions"], group[-1]["labels"]))
        if metrics_now or progress.step % config.log_every_steps == 0:
            log_step(progress, scalars, self.meter)
            write_scalars(self.writer, scalars, progress.step)

    def _accumulate_gradients(self, group: list[dict], examples: int) -> Optional[dict]:
        """Backpropagate each batch's loss scaled by its share of the step's examples (times the processes,
        whose gradients DDP averages), so the update is that of one batch of all `examples`.

        A process whose share of the epoch has run out still joins the step's gradient averaging, on its
        last batch weighted 0. Returns the output of the group's last batch (None without one)."""
        self.optimizer.zero_grad(set_to_none=True)
        weighted = [(batch, batch["labels"].shape[0] * self.world_size / examples) for batch in group]
        if not weighted:
            weighted = [(self._stand_in_batch(), 0.0)]
        label_loss_sum, output = torch.zeros((), dtype=torch.float64, device=self.device), None
        for index, (batch, weight) in enumerate(weighted):
            last = index == len(weighted) - 1
            with self._gradient_sync(last):
                with autocast(self.device, self.config.mixed_precision):
                    output, label_loss, loss = self.forward_loss(self.network, self.loss_fn, batch, weight)
                self.scaler.scale(loss).backward()
            label_loss_sum += label_loss.detach().double() * batch["labels"].shape[0]
        if group:
            self.last_batch = group[-1]
            self.loss_value = label_loss_sum.item() / sum(batch["labels"].shape[0] for batch in group)
            return output
        return None

    def _refuse_non_finite_loss(self, group: list[dict]) -> None:
        """A NaN or infinite loss on any process stops training before its update reaches the weights and before a
        checkpoint is written: the last checkpoint stays the last good one."""
        bad_processes = all_reduce_sum(int(bool(group) and not math.isfinite(self.loss_value)), self.device)
        if not bad_processes:
            return
        videos = [video_id for batch in group for video_id in batch["video_ids"]][:3]
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

    def _stand_in_batch(self) -> dict:
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
                verdict, metrics = self.evaluator.after_checkpoint(self.model, path, self.progress.step)
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
        payload = load_checkpoint(path, map_location=self.device)
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.pending_revert = None
        log.info("step %d: reverted to the weights and optimizer state of the best model, step %d (%s)",
                 self.progress.step, step, path)

    def _save(self, final: bool = False) -> str:
        self._refuse_non_finite_weights()
        payload = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                   "scaler": self.scaler.state_dict(), "config": dataclasses.asdict(self.config),
                   "progress": dataclasses.asdict(self.progress), "rng": capture_rng_state()}
        if self.evaluator is not None:
            payload["validation"] = self.evaluator.state_dict()
        return save_checkpoint(self.config.train_dir, payload, self.progress.step, self.config.keep_checkpoints,
                               final=final)

    def _notify(self, kind: str, checkpoint_path: Optional[str] = None, final: bool = False,
                metrics: Optional[dict] = None) -> bool:
        progress = self.progress
        event = TrainEvent(kind, self.model, self.optimizer, self.config, progress.step, progress.epoch,
                           progress.examples, self.loss_value, checkpoint_path, final, metrics)
        # A list, not a generator: every hook sees the event even when an earlier one asks to stop.
        return any([bool(hook(event)) for hook in self.hooks])

    def _finish(self) -> None:
        if self.chief:
            final_path = self._save(final=True)
            metrics = None
            if self.evaluator is not None:
                metrics = self.evaluator.after_final(self.model, final_path, self.progress.step)
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


def distributed_model(model: nn.Module, device: torch.device) -> nn.Module:
    """The model itself in one process; wrapped in DistributedDataParallel across several."""
    if rank_and_world_size()[1] == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


def backward_and_update(loss: torch.Tensor, model: nn.Module, optimizer: torch.optim.Optimizer,
                        scaler: torch.amp.GradScaler, clip_gradient_norm: float, clip_gradient_value: float = 0.0,
                        penalties: L2Terms = ()) -> None:
    """One optimizer step on the gradient of one batch's label `loss` plus the L2 `penalties` (a bare loop's step,
    as bench_train's)."""
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    apply_update(model, optimizer, scaler, clip_gradient_norm, clip_gradient_value, penalties)


def model_loss(model: nn.Module, loss_fn: nn.Module, batch: dict, example_weight: float = 1.0):
    """(model output, label loss, example_weight x label loss) of one batch; `model` may be DDP-wrapped.

    The L2 penalties are not in it: the optimizer step adds their gradient (optim.apply_update)."""
    output = model(batch["features"], batch.get("num_frames"))
    label_loss = loss_fn(output, batch["labels"])
    return output, label_loss, label_loss * example_weight


def record_trained_ids(rank: int, epoch: int, group: list[dict]) -> None:
    """YT8M_TRAINED_IDS_DIR: append "<epoch> <video id>" per trained example to DIR/rank-<rank>.txt."""
    directory = os.environ.get(TRAINED_IDS_ENV)
    if not directory:
        return
    with open(os.path.join(directory, f"rank-{rank}.txt"), "a") as fh:
        fh.writelines(f"{epoch} {video_id}\n" for batch in group for video_id in batch["video_ids"])


def reached_max_steps(config: TrainConfig, progress: Progress) -> bool:
    return config.max_steps is not None and progress.step >= config.max_steps


def autocast_uses_float16() -> bool:
    """float16 autocast needs loss scaling; bfloat16 does not."""
    return torch.cuda.is_available() and amp_dtype() == torch.float16


class ThroughputMeter:
    """Per-step examples/s and the share of time spent waiting for input, plus the steady-state rate."""

    def __init__(self) -> None:
        self.steps = 0
        self.wait_started = self.data_ready_at = time.perf_counter()
        self.steady_examples = 0
        self.steady_seconds = 0.0
        self.steady_wait = 0.0
        self.all_examples = 0
        self.all_seconds = 0.0

    def start_wait(self) -> None:
        self.wait_started = time.perf_counter()

    def data_ready(self) -> None:
        self.data_ready_at = time.perf_counter()

    def step_done(self, examples: int) -> float:
        now = time.perf_counter()
        seconds = now - self.wait_started
        self.steps += 1
        self.all_examples += examples
        self.all_seconds += seconds
        if self.steps > WARMUP_STEPS:
            self.steady_examples += examples
            self.steady_seconds += seconds
            self.steady_wait += self.data_ready_at - self.wait_started
        return examples / max(seconds, 1e-9)

    def steady_examples_per_sec(self) -> float:
        if self.steady_seconds > 0:
            return self.steady_examples / self.steady_seconds
        return self.all_examples / self.all_seconds if self.all_seconds > 0 else 0.0

    def input_wait_fraction(self) -> float:
        return self.steady_wait / self.steady_seconds if self.steady_seconds > 0 else 0.0


def batch_metrics(predictions: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Hit@1, PERR and GAP@20 of one batch, from one ranking of its predictions (not one per metric)."""
    from yt8m.metrics import EvaluationMetrics

    metrics = EvaluationMetrics(predictions.shape[1])
    metrics.accumulate(predictions.detach().float().cpu().numpy(), labels.detach().cpu().numpy())
    scores = metrics.get()
    return {"hit_at_one": scores["hit_at_one"], "perr": scores["perr"], "gap": scores["gap"]}


def log_step(progress: Progress, scalars: dict[str, float], meter: ThroughputMeter) -> None:
    text = (f"step {progress.step} | epoch {progress.epoch + 1} | loss {scalars['loss']:.5f} | "
            f"{scalars['examples_per_sec']:.0f} examples/s | input wait {meter.input_wait_fraction():.0%}")
    if "gap" in scalars:
        text += f" | hit@1 {scalars['hit_at_one']:.3f} perr {scalars['perr']:.3f} gap {scalars['gap']:.3f}"
    log.info(text)


def summary_writer(train_dir: str, step: int):
    from torch.utils.tensorboard import SummaryWriter

    # purge_step drops events a crashed run wrote after its last checkpoint, so curves do not fold back.
    return SummaryWriter(train_dir, purge_step=step + 1 if step else None)


def write_scalars(writer, scalars: dict[str, float], step: int) -> None:
    if writer is not None:
        for name, value in scalars.items():
            writer.add_scalar(name, value, step)


def parse_args(argv: Sequence[str]) -> TrainConfig:
    """`yt8m train` flags, over `--config FILE.yaml` when given, as one typed config."""
    parser = argparse.ArgumentParser(prog="yt8m train", description=__doc__)
    add_config_file_argument(parser)
    add_config_arguments(parser, TrainConfig)
    return parse_config(TrainConfig, parser.parse_args(argv))[0]


def main(argv: Sequence[str]) -> int:
    config = parse_args(argv)
    setup_logging(logging.INFO if env_rank() == 0 else logging.WARNING)
    if config.num_gpu > 1 and not launched_by_torchrun():
        relaunch_for_gpus(argv, config.num_gpu)
    summary = train(config)
    if env_rank() == 0:
        print(json.dumps(summary), flush=True)
    if launched_by_torchrun():
        exit_without_teardown(0)
    return 0

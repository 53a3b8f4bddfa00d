"""`yt8m train`: the starter kit's train.py as one PyTorch loop, readable top to bottom.

Resumes from the train dir's latest checkpoint (model, optimizer, step, epoch position, RNG state),
checkpoints atomically, logs to stderr and TensorBoard, and prints one JSON summary line on stdout.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import inspect
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
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import torch
from torch import nn
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from yt8m.checkpoint import (
    capture_rng_state,
    checkpoint_config,
    checkpoint_dir,
    clear_final_marker,
    create_model_for,
    differing_fields,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from yt8m.config import (
    MODEL_IDENTITY_FIELDS,
    TrainConfig,
    add_config_arguments,
    add_config_file_argument,
    feature_layout,
    parse_config,
    save_config,
)
from yt8m.runtime import amp_dtype, autocast, reader_workers, resolve_device, setup_logging, to_device

log = logging.getLogger("yt8m.train")

# Steps left out of the steady-state examples/s: worker start-up, allocator warm-up, first-touch page faults.
WARMUP_STEPS = 5

# TensorFlow optimizer class names from starter-kit command lines, with the TF defaults torch lacks.
TF_OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "AdamOptimizer": ("Adam", {}),
    "GradientDescentOptimizer": ("SGD", {}),
    "MomentumOptimizer": ("SGD", {"momentum": 0.9}),
    "AdagradOptimizer": ("Adagrad", {"initial_accumulator_value": 0.1}),
    "RMSPropOptimizer": ("RMSprop", {"alpha": 0.9, "eps": 1e-10}),
    "AdadeltaOptimizer": ("Adadelta", {"rho": 0.95, "eps": 1e-8}),
}


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint so that a resumed run continues exactly."""

    step: int = 0
    examples: int = 0  # global: summed over all processes of a distributed run
    epoch: int = 0  # epochs completed
    batches_in_epoch: int = 0  # batches of the current epoch already trained on


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

    @property
    def train_dir(self) -> str:
        return self.config.train_dir


# A hook is any callable taking a TrainEvent; returning True asks training to stop (it then saves a
# final checkpoint). In-process evaluation, early stopping and tuning pruners plug in here.
TrainHook = Callable[[TrainEvent], Optional[bool]]


def learning_rate(config: TrainConfig, examples: int) -> float:
    """Staircase decay over global examples seen, as the starter kit's exponential_decay(staircase=True)."""
    decays = examples // max(config.learning_rate_decay_examples, 1)
    return config.base_learning_rate * config.learning_rate_decay ** decays


def build_optimizer(name: str, parameters: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Any torch.optim class by name (case-insensitive), or a TensorFlow optimizer name."""
    class_name, defaults = TF_OPTIMIZERS.get(name, (name, {}))
    classes = {
        cls.__name__.lower(): cls for cls in vars(torch.optim).values()
        # LBFGS needs a loss closure per step, which a streaming loop cannot give it.
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
        and cls not in (torch.optim.Optimizer, torch.optim.LBFGS)
    }
    if class_name.lower() not in classes:
        known = sorted(cls.__name__ for cls in classes.values()) + sorted(TF_OPTIMIZERS)
        raise ValueError(f"--optimizer {name!r} is not a torch.optim class; known: {', '.join(known)}")
    cls = classes[class_name.lower()]
    parameters = list(parameters)
    if "fused" in inspect.signature(cls).parameters:
        # One fused kernel per step instead of a dozen passes over the weights: several times faster.
        try:
            return cls(parameters, lr=lr, fused=True, **defaults)
        except RuntimeError:  # the device or dtype has no fused kernel
            pass
    return cls(parameters, lr=lr, **defaults)


def distributed_rank() -> tuple[int, int]:
    """(rank, world_size), (0, 1) outside torch.distributed."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def validate_config(config: TrainConfig) -> None:
    from yt8m.models import is_frame_level

    problems = []
    if not config.train_data_pattern:
        problems.append("--train_data_pattern is required")
    if is_frame_level(config.model) != config.frame_features:
        kind = "frame-level" if is_frame_level(config.model) else "video-level"
        problems.append(f"--model {config.model} is a {kind} model but --frame_features is {config.frame_features}")
    for name in ("batch_size", "export_model_steps", "log_every_steps", "metrics_every_steps", "num_epochs"):
        if getattr(config, name) < 1:
            problems.append(f"--{name} must be at least 1, got {getattr(config, name)}")
    if config.max_steps is not None and config.max_steps < 0:
        problems.append(f"--max_steps must not be negative, got {config.max_steps}")
    feature_layout(config)
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
        lines = "\n".join(f"  --{name}: checkpoint has {old!r}, this run asks for {new!r}"
                          for name, old, new in differing)
        raise ValueError(
            f"{checkpoint} was trained with different model settings:\n{lines}\n"
            f"Resume with the checkpoint's settings, pass --start_new_model to delete its checkpoints "
            f"and start over, or choose a new --train_dir.")


def remove_previous_run(train_dir: str) -> None:
    """--start_new_model: drop the checkpoints, evaluations and summaries a previous run left."""
    for path in (checkpoint_dir(train_dir), os.path.join(train_dir, "eval")):
        shutil.rmtree(path, ignore_errors=True)
    if os.path.isdir(train_dir):
        for name in os.listdir(train_dir):
            if name.startswith("events.out.tfevents."):
                os.remove(os.path.join(train_dir, name))
    log.info("--start_new_model: removed the previous checkpoints and summaries in %s", train_dir)


def train(config: TrainConfig, hooks: Sequence[TrainHook] = ()) -> dict[str, Any]:
    """Train as `config` says, resuming from the train dir's latest checkpoint; returns the summary."""
    from yt8m.data.dataset import FeatureSpec, YT8MDataset, make_loader
    from yt8m.losses import create_loss

    validate_config(config)
    device = resolve_device(config.device)
    rank, _ = distributed_rank()
    if config.start_new_model and rank == 0:
        remove_previous_run(config.train_dir)
    resume_path = latest_checkpoint(config.train_dir)
    resume = load_checkpoint(resume_path, map_location=device) if resume_path else None
    if resume is not None:
        refuse_model_change(checkpoint_config(resume, resume_path), config, resume_path)
        log.info("resuming from %s", resume_path)
    if rank == 0:
        save_config(config, os.path.join(config.train_dir, "config.yaml"))
        clear_final_marker(config.train_dir)

    seed_everything(config.seed)
    model = create_model_for(config).to(device)
    optimizer = build_optimizer(config.optimizer, model.parameters(), config.base_learning_rate)
    dataset = YT8MDataset(config.train_data_pattern, FeatureSpec.from_config(config), config.batch_size,
                          shuffle=True, seed=config.seed, shuffle_buffer=config.shuffle_buffer,
                          skip_corrupt=config.skip_corrupt, cache_in_memory=config.cache_in_memory)
    loader = make_loader(dataset, reader_workers(config.num_readers), pin_memory=device.type == "cuda")

    def epoch_batches(epoch: int) -> Iterable[dict]:
        dataset.set_epoch(epoch)
        return loader

    log.info("training %s (%d parameters) on %s", config.model,
             sum(p.numel() for p in model.parameters()), device)
    return fit(model, optimizer, create_loss(config.label_loss), epoch_batches, config,
               hooks=hooks, resume=resume, device=device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module,
        epoch_batches: Callable[[int], Iterable[dict]], config: TrainConfig, *,
        hooks: Sequence[TrainHook] = (), resume: Optional[dict] = None,
        device: torch.device = torch.device("cpu")) -> dict[str, Any]:
    """The training loop over `epoch_batches(epoch)` (any iterable of batch dicts), with checkpoints.

    `resume` is a checkpoint payload: the loop restores it, skips the batches of the current epoch it
    already saw, and then restores the RNG state, so that the rest matches an uninterrupted run.
    """
    rank, world_size = distributed_rank()
    chief = rank == 0
    forward_loss = torch.compile(model_loss) if config.compile else model_loss
    scaler = torch.amp.GradScaler("cuda", enabled=config.mixed_precision and device.type == "cuda"
                                  and autocast_uses_float16())
    progress = Progress()
    if resume is not None:
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        scaler.load_state_dict(resume["scaler"])
        progress = Progress(**resume["progress"])
    writer = summary_writer(config.train_dir, progress.step) if chief else None
    meter = ThroughputMeter()
    hooked_step, loss_value, stop = progress.step, math.nan, False
    started = time.perf_counter()
    bar = tqdm(total=config.max_steps, initial=progress.step, unit="step", dynamic_ncols=True,
               disable=not (chief and sys.stderr.isatty()))

    def save(final: bool = False) -> str:
        payload = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                   "scaler": scaler.state_dict(), "config": dataclasses.asdict(config),
                   "progress": dataclasses.asdict(progress), "rng": capture_rng_state()}
        return save_checkpoint(config.train_dir, payload, progress.step, config.keep_checkpoints, final=final)

    def notify(kind: str, checkpoint_path: Optional[str] = None, final: bool = False) -> bool:
        event = TrainEvent(kind, model, optimizer, config, progress.step, progress.epoch,
                           progress.examples, loss_value, checkpoint_path, final)
        # A list, not a generator: every hook sees the event even when an earlier one asks to stop.
        return any([bool(hook(event)) for hook in hooks])

    model.train()
    with logging_redirect_tqdm():
        while not stop and progress.epoch < config.num_epochs and not reached_max_steps(config, progress):
            batches = iter(epoch_batches(progress.epoch))
            if resume is not None:
                # Fast-forward to where the checkpoint was taken, then continue its random streams.
                collections.deque(itertools.islice(batches, progress.batches_in_epoch), maxlen=0)
                restore_rng_state(resume["rng"])
                resume = None
            meter.start_wait()
            for batch in batches:
                lr = learning_rate(config, progress.examples)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                batch = to_device(batch, device)
                meter.data_ready()

                with autocast(device, config.mixed_precision):
                    output, label_loss, loss = forward_loss(model, loss_fn, batch, config.regularization_penalty)
                backward_and_update(loss, model, optimizer, scaler, config.clip_gradient_norm)
                loss_value = label_loss.item()

                batch_examples = batch["labels"].shape[0] * world_size
                progress.step += 1
                progress.batches_in_epoch += 1
                progress.examples += batch_examples
                examples_per_sec = meter.step_done(batch_examples)
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4f}", ex_s=f"{examples_per_sec:.0f}", refresh=False)
                scalars = {"loss": loss_value, "learning_rate": lr, "examples_per_sec": examples_per_sec}
                metrics_now = progress.step % config.metrics_every_steps == 0
                if metrics_now:
                    scalars.update(batch_metrics(output["predictions"], batch["labels"]))
                if metrics_now or progress.step % config.log_every_steps == 0:
                    log_step(progress, scalars, meter)
                    write_scalars(writer, scalars, progress.step)

                if chief and progress.step % config.export_model_steps == 0:
                    path = save()
                    hooked_step = progress.step
                    stop = notify("checkpoint", path)
                if stop or reached_max_steps(config, progress):
                    break
                meter.start_wait()
            else:
                progress.epoch += 1
                progress.batches_in_epoch = 0
                stop = notify("epoch_end")

    bar.close()
    if chief:
        final_path = save(final=True)
        if progress.step != hooked_step:
            notify("checkpoint", final_path, final=True)
    if writer is not None:
        writer.close()
    summary = {"global_step": progress.step, "examples": progress.examples,
               "seconds": round(time.perf_counter() - started, 3),
               "examples_per_sec": round(meter.steady_examples_per_sec(), 1),
               "loss": None if math.isnan(loss_value) else loss_value,
               "input_wait_fraction": round(meter.input_wait_fraction(), 4)}
    log.info("done: %s", summary)
    return summary


def backward_and_update(loss: torch.Tensor, model: nn.Module, optimizer: torch.optim.Optimizer,
                        scaler: torch.amp.GradScaler, clip_gradient_norm: float) -> None:
    """One optimizer step on the gradient of `loss`, its global norm clipped (the starter kit's order)."""
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if clip_gradient_norm > 0:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), clip_gradient_norm)
    scaler.step(optimizer)
    scaler.update()


def model_loss(model: nn.Module, loss_fn: nn.Module, batch: dict, regularization_penalty: float):
    """(model output, label loss, label loss + weighted L2 penalty) of one batch."""
    output = model(batch["features"], batch.get("num_frames"))
    label_loss = loss_fn(output, batch["labels"])
    return output, label_loss, label_loss + regularization_penalty * model.regularization_loss()


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
    from yt8m.metrics import calculate_gap, calculate_hit_at_one, calculate_perr

    preds = predictions.detach().float().cpu().numpy()
    truth = labels.detach().float().cpu().numpy()
    return {"hit_at_one": calculate_hit_at_one(preds, truth), "perr": calculate_perr(preds, truth),
            "gap": calculate_gap(preds, truth)}


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
    setup_logging()
    summary = train(config)
    print(json.dumps(summary), flush=True)
    return 0

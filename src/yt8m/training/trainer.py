"""`train(config)`: one training run checked, built (training/run.py), and run, on one process or many under torchrun:
every check made before the train dir is touched, the train dir locked and prepared, then the loop (`loop.fit`).

Resumes from the train dir's newest readable checkpoint (model, optimizer, step, epoch position, RNG state, LR
factor); with --eval_data_pattern it evaluates and exports (training/validation.py). Rank 0 writes every file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any, ContextManager, Iterator, Optional, Sequence

from yt8m.config import STARTER_TRAIN_DIR, resolve_components, save_config
from yt8m.distributed.ranks import all_reduce_sum, barrier, process_group, rank_and_world_size, training_device
from yt8m.io import storage
from yt8m.io.checkpoints import (
    CONFIG_FILE,
    EXPORT_DIR,
    MODEL_SIZE_FILE,
    RUN_FILES,
    checkpoint_dir,
    clear_final_marker,
    latest_checkpoint,
)
from yt8m.io.files import write_file_atomically
from yt8m.io.lock import TrainDirLock
from yt8m.models.model_size import ModelSize
from yt8m.training.checks import checked_train_config
from yt8m.training.config import TrainConfig
from yt8m.training.loop import TrainHook, fit
from yt8m.training.memory_checks import check_run_memory, checkpoint_bytes, memory_watch, warn_if_disk_short
from yt8m.training.randomness import seed_everything
from yt8m.training.run import build_run
from yt8m.training.stopping import noting_signals
from yt8m.training.validation import EvaluateFn

log = logging.getLogger("yt8m.train")


def train(config: TrainConfig, hooks: Sequence[TrainHook] = (), evaluate: Optional[EvaluateFn] = None, *,
          checked: bool = False) -> dict[str, Any]:
    """Train as `config` says, resuming from the train dir's latest checkpoint; returns the summary.

    Everything is checked (config, model, optimizer, loss, data) before the train dir is touched, so a failed start
    leaves it as it was; `checked`: the config's checks already ran (`yt8m train` runs them as it parses the flags,
    to list every problem at once): its components are only found then. Under torchrun every process calls it and
    it joins the process group itself.
    With --eval_data_pattern, or an `evaluate(model, step) -> metrics` function (which replaces that evaluation),
    it trains and evaluates. Ctrl+C, SIGTERM or a deadline (yt8m.training.stopping) stop it between steps: the
    summary then says why (`stopped`, `interrupted`), its progress saved as a checkpoint.
    """
    if checked:
        config = resolve_components(config)
    else:
        config = checked_train_config(config, evaluating=bool(config.validation.eval_data_pattern) or
                                      evaluate is not None)
    train_dir = config.checkpoints.train_dir
    if train_dir.rstrip("/") == STARTER_TRAIN_DIR.rstrip("/"):
        log.warning("--train_dir is %s, the starter kit's default: a reboot or the next run there may wipe it; "
                    "give each run a --train_dir of its own", train_dir)
    device = training_device(config.runtime.device)
    # Ctrl+C and SIGTERM only ask the loop to stop between steps (a tune job notes them for its whole life).
    with noting_signals(), process_group(device), contextlib.ExitStack() as resources:
        rank, world_size = rank_and_world_size()
        seed_everything(config.schedule.seed)
        run = build_run(config, device, resources, rank == 0, evaluate)
        config = run.config
        existed = storage.exists(train_dir)
        with train_dir_lock(train_dir, rank), removed_unless_checkpointed(train_dir, rank, run.newest, existed):
            prepare_train_dir(config, rank, run.newest, run.size)
            if rank == 0:
                warn_if_disk_short(train_dir, checkpoint_bytes(run.size), config.checkpoints.keep_checkpoints)
            memory = run.data.open(device, run.memory, run.size)
            if rank == 0:
                # Refused on one process only where there is one: torchrun's others would wait for it.
                check_run_memory(memory, run.data.streaming,
                                 config.runtime.memory_check if world_size == 1 else "warn")
            log.info("training %s (%s) on %s, %d process(es), %d examples per optimizer step",
                     config.model.name, run.size.describe(), device, world_size,
                     config.schedule.global_batch(world_size))
            log_train_dir(config, rank)
            with memory_watch(stops=world_size == 1):
                summary = fit(run.model, run.optimizer, run.tasks, run.data.epoch_batches, config, hooks=hooks,
                              resume=run.resume, device=device, evaluator=run.evaluator,
                              epoch_fraction=run.data.epoch_fraction, reading=run.data)
            if config.data.skip_corrupt:
                summary.update(skipped_files=all_reduce_sum(run.data.skipped_files, device),
                               skipped_records=all_reduce_sum(run.data.skipped_records, device))
            return summary


def log_train_dir(config: TrainConfig, rank: int) -> None:
    """Say where the run writes what."""
    if rank != 0:
        return
    checkpoints = config.checkpoints
    train_dir = checkpoints.train_dir
    at_examples = ",".join(map(str, checkpoints.checkpoint_at_examples))
    when = ([f"every {checkpoints.export_model_steps} steps"] if checkpoints.export_model_steps else []) + (
        [f"at {at_examples} examples"] if at_examples else []) + (
        ["at each epoch's end"] if checkpoints.checkpoint_every_epoch else []) + ["at the end"]
    evaluations = (f"; evaluations in {os.path.join(train_dir, 'eval')}, exports in "
                   f"{os.path.join(train_dir, EXPORT_DIR)}/(best|latest|final)"
                   if config.validation.eval_data_pattern else "")
    log.info("train dir %s: checkpoints %s/ckpt-<step>.pt (%s; the newest %d kept), config.yaml, "
             "model_size.json, TensorBoard events%s", train_dir, checkpoint_dir(train_dir), ", ".join(when),
             checkpoints.keep_checkpoints, evaluations)


@contextlib.contextmanager
def removed_unless_checkpointed(train_dir: str, rank: int, newest: Optional[str], existed: bool) -> Iterator[None]:
    """A run started without a checkpoint to resume that fails before writing its first removes what it wrote (a
    train dir it made, `existed` False: wholly), as a start that fails its checks never writes: no train dir is
    left that looks like a run but holds none. A resumed run's train dir is left as it is. Entered holding the
    train dir's lock, so that only this run's files go."""
    try:
        yield
    except BaseException:
        if rank == 0 and newest is None and storage.is_local(train_dir) and latest_checkpoint(train_dir) is None:
            _remove_what_a_run_wrote(train_dir, existed)
        raise


def _remove_what_a_run_wrote(train_dir: str, existed: bool) -> None:
    if not existed:
        storage.remove_tree(train_dir)
        return
    remove_previous_run(train_dir)
    for name in RUN_FILES:
        storage.remove(os.path.join(train_dir, name))


def remove_previous_run(train_dir: str) -> None:
    """--start_new_model: drop the checkpoints, evaluations, exports and summaries a previous run left."""
    for path in (checkpoint_dir(train_dir), os.path.join(train_dir, "eval"), os.path.join(train_dir, EXPORT_DIR)):
        storage.remove_tree(path)
    for name in storage.listdir(train_dir):
        if name.startswith("events.out.tfevents."):
            storage.remove(os.path.join(train_dir, name))
    log.info("--start_new_model: removed the previous checkpoints and summaries in %s", train_dir)


def prepare_train_dir(config: TrainConfig, rank: int, newest: Optional[str], size: ModelSize) -> None:
    """Rank 0, holding the lock: start over (--start_new_model) and write the resolved config and the model's size,
    once every process has read the checkpoint it resumes from; `newest`, the newest checkpoint when it was chosen,
    must still be."""
    barrier()
    if rank != 0:
        return
    train_dir = config.checkpoints.train_dir
    if latest_checkpoint(train_dir) != newest:
        raise ValueError(f"another run wrote {latest_checkpoint(train_dir)} while this one started in "
                         f"{train_dir}: start this run again")
    if config.checkpoints.start_new_model:
        remove_previous_run(train_dir)
    save_config(config, os.path.join(train_dir, CONFIG_FILE))
    write_file_atomically(os.path.join(train_dir, MODEL_SIZE_FILE),
                          lambda out: json.dump({"model": config.model.name, **size.as_dict()}, out, indent=1))
    clear_final_marker(train_dir)


def train_dir_lock(train_dir: str, rank: int) -> ContextManager:
    """Rank 0 holds the train dir's lock for the whole run: a second trainer on it fails at once, naming this one.

    Object storage has no lock that its holder's death releases (a lock object a killed run left would block every
    resume), so a train dir there is not locked: one trainer at a time is the user's to ensure (said in the log).
    """
    if rank != 0:
        return contextlib.nullcontext()
    if not storage.is_local(train_dir):
        log.warning("--train_dir %s is on object storage, which has no lock: nothing stops a second `yt8m train` "
                    "from writing there at the same time; run one at a time", train_dir)
        return contextlib.nullcontext()
    return TrainDirLock(train_dir)

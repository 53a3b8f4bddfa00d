"""`train(config)`: one training run set up, run and closed, on one process or many under torchrun: every check
made before the train dir is touched, the train dir locked and prepared, then the loop (`loop.fit`).

Resumes from the train dir's newest readable checkpoint (model, optimizer, step, epoch position, RNG state, LR
factor); with --eval_data_pattern it evaluates and exports (training/evaluation.py). Rank 0 writes every file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any, ContextManager, Iterable, Optional, Sequence

import torch
from torch import nn

from yt8m.io import storage

from yt8m.io.checkpoints import (checkpoint_config, checkpoint_dir, clear_final_marker, differing_fields,
                             init_from_checkpoint, latest_checkpoint, load_latest_checkpoint)
from yt8m.config import MODEL_IDENTITY_FIELDS, TrainConfig, config_problems, save_config, shown
from yt8m.io.files import write_file_atomically
from yt8m.models import create_model_from_config
from yt8m.models.model_size import ModelSize, check_model_size
from yt8m.distributed.ranks import all_reduce_sum, barrier, process_group, rank_and_world_size, training_device
from yt8m.training.optim import build_optimizer
from yt8m.runtime import reader_workers
from yt8m.models.multihead import build_multitask_model
from yt8m.tasks.spec import TaskSpec, is_multitask
from yt8m.tasks.multitask import (MultiTask, MultiTaskData, MultiTaskPlan, multitask_evaluator, plan_tasks,
                                     task_set_problem, task_teachers)
from yt8m.training.validation import EvaluateFn, TrainEvaluator, evaluation_problems, validation_evaluator
from yt8m.training.best_models import EXPORT_DIR, MODEL_SIZE_FILE
from yt8m.training.loop import TrainHook, fit, seed_everything

log = logging.getLogger("yt8m.train")


def validate_config(config: TrainConfig, evaluating: bool = False) -> None:
    """One ValueError listing every problem; `evaluating`: train-and-evaluate has an evaluation to run."""
    problems = config_problems(config) + evaluation_problems(config, evaluating)
    if problems:
        raise ValueError("invalid training config:\n  " + "\n  ".join(problems))


def refuse_model_change(saved: TrainConfig, requested: TrainConfig, checkpoint: str) -> None:
    """The starter kit's model-flags guard: never load weights into a differently defined model (nor go on
    distilling from another teacher, or with other distillation settings)."""
    from yt8m.tasks.teacher import DISTILLATION_FIELDS
    from yt8m.models import model_hparams

    fields = list(MODEL_IDENTITY_FIELDS)
    for config in (saved, requested):
        fields += [name for name in model_hparams(config.model, config) if name not in fields]
    for fields, what in ((fields, "model"), (DISTILLATION_FIELDS, "distillation")):
        differing = differing_fields(saved, requested, fields)
        if differing:
            lines = "\n".join(f"  --{name}: checkpoint has {shown(old)}, this run asks for {shown(new)}"
                              for name, old, new in differing)
            raise ValueError(
                f"{checkpoint} was trained with different {what} settings:\n{lines}\n"
                f"Resume with the checkpoint's settings, pass --start_new_model to delete its checkpoints "
                f"and start over, or choose a new --train_dir.")


def refuse_task_change(payload: dict, plan: Optional[MultiTaskPlan], checkpoint: str) -> None:
    """Resuming trains the checkpoint's heads on the checkpoint's tasks: another task set is refused, named."""
    saved = [TaskSpec(**spec) for spec in payload.get("tasks", [])]
    differs = task_set_problem(saved, plan.specs if plan is not None else [])
    if differs:
        raise ValueError(f"{checkpoint} was trained on other tasks: {differs}. Resume with the checkpoint's tasks, "
                         f"pass --start_new_model to delete its checkpoints and start over, or choose a new "
                         f"--train_dir.")


def remove_previous_run(train_dir: str) -> None:
    """--start_new_model: drop the checkpoints, evaluations, exports and summaries a previous run left."""
    for path in (checkpoint_dir(train_dir), os.path.join(train_dir, "eval"), os.path.join(train_dir, EXPORT_DIR)):
        storage.remove_tree(path)
    for name in storage.listdir(train_dir):
        if name.startswith("events.out.tfevents."):
            storage.remove(os.path.join(train_dir, name))
    log.info("--start_new_model: removed the previous checkpoints and summaries in %s", train_dir)


def train(config: TrainConfig, hooks: Sequence[TrainHook] = (), evaluate: Optional[EvaluateFn] = None) -> dict[str, Any]:
    """Train as `config` says, resuming from the train dir's latest checkpoint; returns the summary.

    Everything is checked (config, model, optimizer, loss, data) before the train dir is touched, so a failed start
    leaves it as it was. Under torchrun every process calls it and it joins the process group itself. With
    --eval_data_pattern, or an `evaluate(model, step) -> metrics` function (which replaces that evaluation), it
    trains and evaluates.
    """
    from yt8m.tasks.teacher import training_task
    from yt8m.tasks.losses import create_loss
    from yt8m.inference.predict import find_video

    validate_config(config, evaluating=bool(config.eval_data_pattern) or evaluate is not None)
    size = check_model_size(config)
    device = training_device(config.device)
    with process_group(device), contextlib.ExitStack() as resources:
        rank, world_size = rank_and_world_size()
        seed_everything(config.seed)
        plan = plan_tasks(config) if is_multitask(config) else None
        if plan is None:
            model = create_model_from_config(config)
        else:
            model = build_multitask_model(config, plan.specs)
            size = check_model_size(config, model)  # the heads' sizes are known now
        model = model.to(device)
        optimizer = build_optimizer(config.optimizer, model.parameters(), config.base_learning_rate)
        loss_fn = create_loss(config.label_loss)
        data = TrainingData(config, plan)
        data.check_first_records()
        if plan is not None:
            resources.enter_context(task_teachers(plan, device))
        task = MultiTask(plan) if plan is not None else resources.enter_context(training_task(
            config, loss_fn, device, lambda video_id: find_video(data.datasets[0].paths, video_id)))
        evaluator = None
        if rank == 0 and (config.eval_data_pattern or evaluate is not None):
            evaluator = TrainEvaluator(config, evaluate or data.validation_evaluator(device),
                                       plan.specs if plan is not None else None)
        newest = latest_checkpoint(config.train_dir)
        resume = checkpoint_to_resume(config, model, plan)
        with train_dir_lock(config.train_dir, rank):
            prepare_train_dir(config, rank, newest, size)
            data.open(device)
            log.info("training %s (%s) on %s, %d process(es), %d examples per optimizer step",
                     config.model, size.describe(), device, world_size,
                     config.batch_size * world_size * config.numbatches_to_aggregate)
            summary = fit(model, optimizer, loss_fn, data.epoch_batches, config, hooks=hooks, resume=resume,
                          device=device, evaluator=evaluator, task=task)
            if config.skip_corrupt:
                summary.update(skipped_files=all_reduce_sum(data.skipped_files, device),
                               skipped_records=all_reduce_sum(data.skipped_records, device))
            return summary


class TrainingData:
    """The training data of a run: one dataset (a single task), or the sources of a multi-task `plan`
    (yt8m.tasks.multitask), with their validation."""

    def __init__(self, config: TrainConfig, plan: Optional[MultiTaskPlan]):
        from yt8m.data.dataset import FeatureSpec, YT8MDataset

        self.config, self.plan = config, plan
        if plan is not None:
            self.sources = MultiTaskData(config, plan)
            self.datasets = self.sources.datasets
        else:
            self.datasets = [YT8MDataset(config.train_data_pattern, FeatureSpec.from_config(config),
                                         config.batch_size, shuffle=True, seed=config.seed,
                                         shuffle_buffer=config.shuffle_buffer, skip_corrupt=config.skip_corrupt,
                                         cache_in_memory=config.cache_in_memory)]
        self.loader = None

    def check_first_records(self) -> None:
        if self.plan is not None:
            self.sources.check_first_records()
        else:
            self.datasets[0].check_first_record()

    def validation_evaluator(self, device: torch.device) -> EvaluateFn:
        if self.plan is not None:
            return multitask_evaluator(self.config, self.plan, device)
        return validation_evaluator(self.config, device)

    def open(self, device: torch.device) -> None:
        """Start reading (make the loaders); with the train dir locked, as a RAM cache is filled here."""
        from yt8m.data.dataset import make_loader

        if self.plan is not None:
            self.sources.open(device)
        else:
            dataset = self.datasets[0]
            self.loader = make_loader(dataset, reader_workers(self.config.num_readers, dataset.spec.frame_features),
                                      pin_memory=device.type == "cuda")

    def epoch_batches(self, epoch: int) -> Iterable[dict]:
        if self.plan is not None:
            return self.sources.epoch_batches(epoch)
        self.datasets[0].set_epoch(epoch)
        return self.loader

    @property
    def skipped_files(self) -> int:
        return sum(dataset.skipped_files for dataset in self.datasets)

    @property
    def skipped_records(self) -> int:
        return sum(dataset.skipped_records for dataset in self.datasets)


def checkpoint_to_resume(config: TrainConfig, model: nn.Module, plan: Optional[MultiTaskPlan] = None
                         ) -> Optional[dict]:
    """The payload of the train dir's newest readable checkpoint, checked to match the config (read only: a
    mismatch leaves the train dir as it was); without one (or with --start_new_model), `model` starts from
    --init_from when given."""
    found = None if config.start_new_model else load_latest_checkpoint(config.train_dir, map_location="cpu")
    resume_path, resume = found or (None, None)
    if resume is not None:
        refuse_model_change(checkpoint_config(resume, resume_path), config, resume_path)
        refuse_task_change(resume, plan, resume_path)
        log.info("resuming from %s", resume_path)
        if config.init_from:
            log.info("--init_from %s is ignored: the run resumes from its own checkpoint", config.init_from)
    elif config.init_from:
        init_from_checkpoint(model, config.init_from).log(log)
    return resume


def prepare_train_dir(config: TrainConfig, rank: int, newest: Optional[str], size: ModelSize) -> None:
    """Rank 0, holding the lock: start over (--start_new_model) and write the resolved config and the model's size,
    once every process has read the checkpoint it resumes from; `newest`, the newest checkpoint when it was chosen,
    must still be."""
    barrier()
    if rank != 0:
        return
    if latest_checkpoint(config.train_dir) != newest:
        raise ValueError(f"another run wrote {latest_checkpoint(config.train_dir)} while this one started in "
                         f"{config.train_dir}: start this run again")
    if config.start_new_model:
        remove_previous_run(config.train_dir)
    save_config(config, os.path.join(config.train_dir, "config.yaml"))
    write_file_atomically(os.path.join(config.train_dir, MODEL_SIZE_FILE),
                          lambda out: json.dump({"model": config.model, **size.as_dict()}, out, indent=1))
    clear_final_marker(config.train_dir)


def train_dir_lock(train_dir: str, rank: int) -> ContextManager:
    """Rank 0 holds the train dir's lock for the whole run: a second trainer on it fails at once, naming this one.

    Object storage has no lock that its holder's death releases (a lock object a killed run left would block every
    resume), so a train dir there is not locked: one trainer at a time is the user's to ensure (said in the log).
    """
    from yt8m.io.lock import TrainDirLock

    if rank != 0:
        return contextlib.nullcontext()
    if not storage.is_local(train_dir):
        log.warning("--train_dir %s is on object storage, which has no lock: nothing stops a second `yt8m train` "
                    "from writing there at the same time; run one at a time", train_dir)
        return contextlib.nullcontext()
    return TrainDirLock(train_dir)

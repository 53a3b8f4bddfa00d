"""`build_run(config)`: everything a training run is made of (model, optimizer, tasks, data, evaluator, the
checkpoint it resumes), decided once, before the train dir is touched, so that a failed start leaves it as it was."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from yt8m.config import config_from_dict, config_settings, config_values, differing, hparams_mapping, shown
from yt8m.data.reading.inspection import find_video
from yt8m.inference.teachers import open_teacher
from yt8m.io.checkpoints import Checkpoint, latest_checkpoint, load_latest_checkpoint
from yt8m.models.checkpoints import init_from_checkpoint, tensor_mismatches
from yt8m.models.config import MODEL_IDENTITY_FIELDS, build_model
from yt8m.models.model_size import ModelSize, check_model_size
from yt8m.models.multihead import build_multitask_model
from yt8m.tasks.spec import TaskSpec
from yt8m.tasks.taskset import TaskSet, plan_tasks, task_set_problem
from yt8m.tasks.teacher import DISTILLATION_FIELDS, Teacher
from yt8m.training.checks import teacher_fit
from yt8m.training.config import CheckpointConfig, TrainConfig
from yt8m.training.data import TrainingData
from yt8m.training.memory_checks import RunMemory
from yt8m.training.optim import build_optimizer, resumable_optimizer_state
from yt8m.training.schedules import build_schedule
from yt8m.training.validation import EvaluateFn, TrainEvaluator, validation_evaluator

log = logging.getLogger("yt8m.train")


@dataclass
class Run:
    """A training run as `train` executes it; `newest` is the train dir's newest checkpoint when the run was
    built (it must still be when the run starts writing), `resume` the payload it continues from."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    tasks: TaskSet
    data: TrainingData
    evaluator: Optional[TrainEvaluator]
    size: ModelSize
    memory: RunMemory
    newest: Optional[str]
    resume: Optional[Checkpoint]
    config: TrainConfig  # as given, with the changes a resume was allowed recorded (--resume_with_changes)


def build_run(config: TrainConfig, device: torch.device, resources: contextlib.ExitStack, chief: bool,
              evaluate: Optional[EvaluateFn] = None) -> Run:
    """The run `config` describes on `device` (its teachers opened in `resources`); the chief process (rank 0)
    evaluates, with `evaluate(model, step)` when given, else on --eval_data_pattern. Reads the train dir only."""
    limit = config.runtime.max_model_size_mb
    # On the meta device: a model too large to build is refused before it is built.
    check_model_size(config.model, config.features, limit)
    # A teacher task's classes are known once its data is read: its fit is checked then (--teacher's with the config).
    def check(spec: TaskSpec) -> list[str]:
        return teacher_fit(spec, config.features) if spec.name and spec.distillation.teacher else []

    tasks = plan_tasks(config.tasks, config.main_task(), config.validation.top_n, check=check)
    model = model_of(config, tasks)
    size = check_model_size(config.model, config.features, limit, model)
    model = model.to(device)
    optimizer = build_optimizer(config.optimizer, model.parameters())
    build_schedule(config.lr_schedule, config.schedule.max_steps)  # its problems (no horizon) before any writing
    data = TrainingData(config.data, config.features, config.schedule.batch_size, config.schedule.seed,
                        config.tasks.task_sampling, tasks)
    data.check_first_records()
    tasks = resources.enter_context(tasks.teachers(lambda spec, paths: _teacher(spec, paths, device)))
    memory = data.memory(size)
    evaluator = None
    if chief and (config.validation.eval_data_pattern or evaluate is not None):
        evaluate = evaluate or validation_evaluator(config.validation, config.data, config.features,
                                                    config.schedule.batch_size, tasks, device,
                                                    memory.reserve(streaming=False))
        evaluator = TrainEvaluator(config.validation, config.checkpoints.train_dir, evaluate, tasks)
    newest = latest_checkpoint(config.checkpoints.train_dir)
    resume = checkpoint_to_resume(config, model, optimizer, tasks)
    return Run(model, optimizer, tasks, data, evaluator, size, memory, newest, resume, resumed_config(config, resume))


def model_of(config: TrainConfig, tasks: TaskSet) -> nn.Module:
    """The config's model: with named tasks a shared trunk and a head per task, else the model itself."""
    if tasks.named:
        return build_multitask_model(config.model, config.features, tasks.specs)
    return build_model(config.model, config.features)


def _teacher(spec: TaskSpec, paths: list[str], device: torch.device) -> Teacher:
    assert spec.num_classes is not None  # plan_tasks knows every task's classes
    return open_teacher(spec.distillation.teacher, spec.num_classes, device,
                        lambda video_id: find_video(paths, video_id))


def checkpoint_to_resume(config: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                         tasks: TaskSet) -> Optional[Checkpoint]:
    """The train dir's newest readable checkpoint, checked to match the config, the model's tensors and
    the optimizer's parameters by name and shape (read only: a mismatch leaves the train dir as it was); without one
    (or with --start_new_model), `model` starts from --init_from when given."""
    checkpoints = config.checkpoints
    found = None if checkpoints.start_new_model else load_latest_checkpoint(checkpoints.train_dir, map_location="cpu")
    if found is not None:
        resume_path, resume = found
        saved = stored_train_config(resume, resume_path)
        refuse_model_change(saved, config, resume_path)
        refuse_changes_unless_allowed(resume_changes(saved, config), config.checkpoints, resume_path)
        refuse_task_change(resume, tasks, resume_path)
        refuse_other_tensors(resume, model, optimizer, resume_path)
        log.info("resuming from %s", resume_path)
        if checkpoints.init_from:
            log.info("--init_from %s is ignored: the run resumes from its own checkpoint", checkpoints.init_from)
        return resume
    if checkpoints.init_from:
        init_from_checkpoint(model, checkpoints.init_from).log(log)
    return None


def stored_train_config(checkpoint: Checkpoint, path: str) -> TrainConfig:
    """The training config a checkpoint stores (flat, as written before configs had sections, or by section)."""
    return config_from_dict(TrainConfig, checkpoint.config, source=f"{path} (config)", check_values=False)


def refuse_model_change(saved: TrainConfig, requested: TrainConfig, checkpoint: str) -> None:
    """The starter kit's model-flags guard: never load weights into a differently defined model (another model,
    loss, features or classes), nor go on distilling from another teacher or with other distillation settings."""
    old, new = config_values(saved), config_values(requested)
    for found, what in ((differing(old, new, MODEL_IDENTITY_FIELDS), "model"),
                        (differing(old, new, DISTILLATION_FIELDS), "distillation")):
        if found:
            raise ValueError(
                f"{checkpoint} was trained with different {what} settings ({described_changes(found)}): resume "
                f"with the checkpoint's settings, pass --start_new_model to delete its checkpoints and start over, "
                f"or choose a new --train_dir")


# The sections every setting of which is a hyper-parameter of what the run learns (the model's, the loss's, the
# optimizer's, the learning-rate schedule's, the augmentation's), compared on resume beside the best model's metric.
RESUME_COMPARED_SECTIONS = ("model", "loss", "optimizer", "lr_schedule", "augment")
RESUME_COMPARED_FLAGS = ("best_metric",)


def resume_changes(saved: TrainConfig, requested: TrainConfig) -> list[tuple[str, object, object]]:
    """(flag, checkpoint's value, this run's) of each hyper-parameter that differs, the model's identity aside
    (refuse_model_change's). A component's hyper-parameters are compared where both runs name the same one (a value
    a checkpoint saved before a default changed keeps the value it was trained with)."""
    old, new = config_values(saved), config_values(requested)
    flags = [setting.flag for setting in config_settings(TrainConfig).values()
             if setting.section in RESUME_COMPARED_SECTIONS or setting.flag in RESUME_COMPARED_FLAGS]
    for section in ("model", "loss", "lr_schedule"):
        saved_section, requested_section = getattr(saved, section), getattr(requested, section)
        if saved_section.component_name == requested_section.component_name:
            flags += [name for name in hparams_mapping(saved_section.hparams) if name not in flags]
    return differing(old, new, [flag for flag in flags if flag not in MODEL_IDENTITY_FIELDS and flag in old])


def refuse_changes_unless_allowed(changes: list[tuple[str, object, object]], checkpoints: CheckpointConfig,
                                  checkpoint: str) -> None:
    """A resume with other hyper-parameters is refused in one line naming each, unless --resume_with_changes."""
    if not changes:
        return
    if not checkpoints.resume_with_changes:
        raise ValueError(f"{checkpoint} was trained with other hyper-parameters ({described_changes(changes)}): "
                         "resume with the checkpoint's values, pass --resume_with_changes to go on with these (the "
                         "change is recorded in config.yaml), --start_new_model to start over, or choose a new "
                         "--train_dir")
    log.warning("resuming %s with changed hyper-parameters (--resume_with_changes): %s", checkpoint,
                described_changes(changes))


def described_changes(changes: list[tuple[str, object, object]]) -> str:
    return "; ".join(f"--{name}: checkpoint has {shown(old)}, this run asks for {shown(new)}"
                     for name, old, new in changes)


def resumed_config(config: TrainConfig, resume: Optional[Checkpoint]) -> TrainConfig:
    """The config the run writes to config.yaml: a new run's has no record of changes; a resumed run's has the
    checkpoint's record, and the changes this resume was allowed after it (`step N: --flag old -> new`). The
    permission itself is this command's only: stored, `--config run/config.yaml` would pass it to every later
    resume, which would then take changes unasked."""
    history: list[str] = []
    if resume is not None:
        saved = stored_train_config(resume, "checkpoint")
        history = list(saved.checkpoints.resume_changes) + [
            f"step {resume.step}: --{name} {shown(old)} -> {shown(new)}"
            for name, old, new in resume_changes(saved, config)]
    return dataclasses.replace(config, checkpoints=dataclasses.replace(config.checkpoints, resume_changes=history,
                                                                       resume_with_changes=False))


def refuse_other_tensors(checkpoint: Checkpoint, model: nn.Module, optimizer: torch.optim.Optimizer,
                         path: str) -> None:
    """A checkpoint whose tensors or optimizer state differ from this run's model in names or shapes is refused,
    naming them, before anything loads (a model's code changed since, a run edited by hand)."""
    weights = {"model": checkpoint.model, "trained_weights": checkpoint.trained_weights}
    problems = [f"{key}: {problem}" for key, saved in weights.items() if saved is not None
                for problem in tensor_mismatches(model.state_dict(), saved)]
    if problems:
        raise ValueError(f"{path} holds other tensors than this run's model ({len(problems)}): "
                         + "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
                         + ". Pass --start_new_model to delete its checkpoints and start over, or choose a new "
                           "--train_dir.")
    resumable_optimizer_state(optimizer, model, checkpoint.optimizer, path)


def refuse_task_change(resume: Checkpoint, tasks: TaskSet, checkpoint: str) -> None:
    """Resuming trains the checkpoint's heads on the checkpoint's tasks: another task set is refused, named."""
    saved = [TaskSpec.from_dict(spec) for spec in resume.tasks]
    differs = task_set_problem(saved, tasks.specs)
    if differs:
        raise ValueError(f"{checkpoint} was trained on other tasks: {differs}. Resume with the checkpoint's tasks, "
                         f"pass --start_new_model to delete its checkpoints and start over, or choose a new "
                         f"--train_dir.")

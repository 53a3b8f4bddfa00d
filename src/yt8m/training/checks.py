"""The checks of a training config beyond each field's own rules, in one place: the model and its hyper-parameters,
the tasks, the teacher, the optimizer, and what train-and-evaluate needs. `yt8m train` runs them once, with the
fields' type errors, so that one error lists every problem; so does `yt8m tune` for each trial's config."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from yt8m.config import ConfigError, TrainConfig, config_problems, field_names
from yt8m.fields import closest
from yt8m.inference.teachers import TeacherInputs, teacher_fit_problems
from yt8m.models.registry import hparam_fields, is_frame_level, known_model, resolve_hparams
from yt8m.tasks.losses import LOSSES
from yt8m.tasks.spec import TaskSpec, is_multitask, task_problems, the_one_task
from yt8m.tasks.teacher import DISTILL_LOSSES, DISTILLATION_FIELDS
from yt8m.training.optim import optimizer_class

log = logging.getLogger("yt8m.train")


def check_train_config(config: TrainConfig, evaluating: Optional[bool] = None) -> None:
    """A ConfigError listing every problem of `config` (its fields' rules and these checks); `evaluating`: an
    evaluation runs (default: --eval_data_pattern is given)."""
    problems = config_problems(config) + train_config_problems(config, evaluating=evaluating)
    if problems:
        raise ConfigError("invalid training config", problems)


def train_config_problems(config: TrainConfig, skip: set[str] = frozenset(),
                          evaluating: Optional[bool] = None) -> list[str]:
    """Every problem of a training config beyond its fields' rules; fields in `skip` did not parse and are left
    out. Resolves `config.model_hparams` to the model's hyper-parameters, typed, at the model's defaults where not
    given (`yt8m.config.parse_config`'s `checks`)."""
    evaluating = bool(config.eval_data_pattern) if evaluating is None else evaluating
    return (model_problems(config, skip) + _name_problems(config, skip) + task_problems(config)
            + teacher_problems(config) + _training_problems(config, evaluating))


def model_problems(config: Any, skip: set[str] = frozenset()) -> list[str]:
    """The model's name, its kind against --frame_features, and its hyper-parameters (resolved in place)."""
    unknown = None if "model" in skip else known_model(config.model)
    if "model" in skip or unknown:
        return [f"--model {unknown}"] * bool(unknown) + unknown_fields(config)
    hparams, problems, ignored = resolve_hparams(config.model, config.model_hparams, "model hyper-parameters",
                                                 known_fields=field_names(type(config)))
    if ignored:
        log.warning("%s: not hyper-parameters of --model %s, ignored: %s", type(config).__name__, config.model,
                    ", ".join(f"--{name}" for name in ignored))
    if not problems:
        config.model_hparams = hparams
    if "frame_features" not in skip and is_frame_level(config.model) != config.frame_features:
        kind = "frame-level" if is_frame_level(config.model) else "video-level"
        problems.append(f"--model {config.model} is a {kind} model but --frame_features is {config.frame_features}")
    return problems


def unknown_fields(config: Any) -> list[str]:
    """The names given beside a config's fields that no model has as a hyper-parameter."""
    everyone = [field.name for field, _ in hparam_fields()]
    known = sorted([*everyone, *field_names(type(config))])
    return [f"unknown field '{name}'{closest(name, known)}" for name in config.model_hparams if name not in everyone]


def _name_problems(config: TrainConfig, skip: set[str]) -> list[str]:
    """Names the fields give of what other layers hold: a loss, an optimizer, a distillation loss."""
    problems = []
    if "label_loss" not in skip and config.label_loss not in LOSSES:
        problems.append(f"--label_loss must be one of {', '.join(LOSSES)}, got {config.label_loss!r}")
    if "optimizer" not in skip:
        try:
            optimizer_class(config.optimizer)
        except ValueError as err:
            problems.append(f"--optimizer {err}")
    if "distill_loss" not in skip and config.distill_loss not in DISTILL_LOSSES:
        problems.append(f"--distill_loss must be one of {', '.join(DISTILL_LOSSES)}, got {config.distill_loss!r}")
    return problems


def teacher_problems(config: TrainConfig) -> list[str]:
    """What is wrong with --teacher: a source that is not there or not a teacher, a model teacher of other classes
    or input features than the student's, the segment task, tasks beside it; distillation settings given without a
    teacher. (A teacher task of `tasks:` is checked once its classes are known: `teacher_fit`.)"""
    if not config.teacher:
        given = [f"--{field.name}" for field in dataclasses.fields(config)
                 if field.name in DISTILLATION_FIELDS and getattr(config, field.name) != field.default]
        return [f"{' and '.join(given)} without --teacher: distillation needs a teacher"] if given else []
    problems = []
    if config.segment_labels:
        problems.append("--teacher distills video-level predictions: it does not combine with --segment_labels")
    if is_multitask(config):
        problems.append("--teacher does not combine with tasks: or --aux_vertical_weight: with tasks, the teacher "
                        "is a task of its own (label_source: teacher, teacher: PATH)")
        return problems
    return problems + teacher_fit(the_one_task(config), config)


def teacher_fit(spec: TaskSpec, config: Any) -> list[str]:
    """Whether the spec's teacher gives targets its student can learn: the same classes and, for a model teacher,
    the same input features; problems name the task's fields."""
    student = TeacherInputs(config.feature_names, config.feature_sizes, config.frame_features, spec.num_classes)
    classes = "num_classes" if spec.name else "--num_classes"  # within the task's own message, its plain field name
    return teacher_fit_problems(spec.teacher, student, spec.field("teacher"), classes)


def _training_problems(config: TrainConfig, evaluating: bool) -> list[str]:
    problems = []
    if not evaluating:
        needs_eval = [name for name in ("early_stopping_patience", "lr_halving_patience", "revert_to_best")
                      if getattr(config, name)]
        problems += [f"--{name} needs --eval_data_pattern" for name in needs_eval]
    if config.revert_to_best and not config.lr_halving_patience:
        problems.append("--revert_to_best acts when the learning rate is halved: set --lr_halving_patience")
    if config.revert_to_best and config.keep_best_exports < 1:
        problems.append("--revert_to_best reloads the best export: --keep_best_exports must be at least 1")
    return problems

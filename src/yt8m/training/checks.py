"""The checks of a training config across its sections, in one place: its components found (the model, the loss,
the metrics it names), the model against the features, the tasks, the teacher, and what train-and-evaluate needs.
`yt8m train` runs them once, with the sections' own checks, so that one error lists every problem; so does `yt8m tune`
for its trials' configs, before the first. `checked_train_config` gives the config a run is built from."""

from __future__ import annotations

from typing import AbstractSet, Optional

from yt8m.config import ConfigError, config_problems, resolve_components
from yt8m.data.reading.spec import DataConfig, FeatureSpec
from yt8m.inference.teachers import TeacherInputs, teacher_fit_problems
from yt8m.models.config import ModelConfig
from yt8m.tasks.spec import TaskSpec, task_problems, the_one_task
from yt8m.training.augment import augment_problems
from yt8m.training.config import TrainConfig


def checked_train_config(config: TrainConfig, evaluating: Optional[bool] = None) -> TrainConfig:
    """`config` with its components resolved, the one a run is built from; a ConfigError lists every problem of it
    (its sections' rules and these checks); `evaluating`: an evaluation runs (default: --eval_data_pattern is
    given)."""
    problems = config_problems(config) + train_config_problems(config, evaluating=evaluating)
    if problems:
        raise ConfigError("invalid training config", problems)
    return resolve_components(config)


def train_config_problems(config: TrainConfig, skip: AbstractSet[str] = frozenset(),
                          evaluating: Optional[bool] = None) -> list[str]:
    """Every problem of a training config across its sections, its components found first (which imports the
    modules of one's own it names); flags in `skip` did not parse and are left out (`config_from_dict`'s
    `checks`)."""
    evaluating = bool(config.validation.eval_data_pattern) if evaluating is None else evaluating
    problems = ([] if evaluating else config.validation.without_evaluation_problems()) + augment_problems(
        config.augment, config.features.frame_features, config.tasks.multitask, bool(config.distillation.teacher)) \
        + config.optimizer.average_problems() + cache_problems(config.data)
    try:
        config = resolve_components(config)
    except ConfigError as err:
        return err.problems + problems  # the checks below need the components
    return (model_problems(config.model, config.features, skip) + task_problems(config.tasks, config.main_task())
            + teacher_problems(config) + problems)


def cache_problems(data: DataConfig) -> list[str]:
    if data.cache_in_memory_required and not data.cache_in_memory:
        return ["--cache_in_memory_required stops a run whose RAM cache would not fit: it needs --cache_in_memory"]
    return []


def model_problems(model: ModelConfig, features: FeatureSpec, skip: AbstractSet[str] = frozenset()) -> list[str]:
    """The model's kind (of a resolved section) against --frame_features, and --input_l2_normalize's."""
    if {"model", "frame_features"} & skip:
        return []
    if model.frame_level != features.frame_features:
        kind = "frame-level" if model.frame_level else "video-level"
        return [f"--model {model.name} is a {kind} model but --frame_features is {features.frame_features}"]
    if features.frame_features and not model.input_l2_normalize:
        return [f"--input_l2_normalize false is for video-level features: {model.name} reads frames, and every "
                "frame model L2-normalizes each frame"]
    return []


def teacher_problems(config: TrainConfig) -> list[str]:
    """What is wrong with --teacher: a source that is not there or not a teacher, a model teacher of other classes
    or input features than the student's, the segment task, tasks beside it. (A teacher task of `tasks:` is checked
    once its classes are known: `teacher_fit`.)"""
    if not config.distillation.teacher:
        return []
    problems = []
    if config.features.segment_labels:
        problems.append("--teacher distills video-level predictions: it does not combine with --segment_labels")
    if config.tasks.multitask:
        problems.append("--teacher does not combine with tasks: or --aux_vertical_weight: with tasks, the teacher "
                        "is a task of its own (label_source: teacher, teacher: PATH)")
        return problems
    return problems + teacher_fit(the_one_task(config.main_task()), config.features)


def teacher_fit(spec: TaskSpec, features: FeatureSpec) -> list[str]:
    """Whether the spec's teacher gives targets its student can learn: the same classes and, for a model teacher,
    the same input features; problems name the task's fields."""
    classes_known = spec.num_classes if spec.num_classes is not None else features.num_classes
    student = TeacherInputs(features.feature_names, features.feature_sizes, features.frame_features, classes_known)
    classes = "num_classes" if spec.name else "--num_classes"  # within the task's own message, its plain field name
    return teacher_fit_problems(spec.distillation.teacher, student, spec.field("teacher"), classes)

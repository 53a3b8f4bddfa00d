"""What a run's tasks are: the `tasks` section of a train config (its entries, TaskConfig each, and shorthands:
--aux_vertical_weight; --teacher, a teacher on the run's one task), checked whole and resolved against the main
flags (MainTask) into TaskSpecs: what each task reads, learns, and is judged on. A run without tasks is a run of one
task, unnamed, whose metrics keep their plain names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import AbstractSet, Any, Optional

from yt8m.config import ConfigError, config_from_dict, config_problems
from yt8m.data.reading.spec import FeatureSpec
from yt8m.fields import setting
from yt8m.tasks.losses import LossConfig, known_loss
from yt8m.tasks.metrics import canonical_metric, is_own_metric, metric_problem, metrics_problem
from yt8m.tasks.teacher import DISTILL_LOSSES, DistillationConfig
from yt8m.tasks.video import metric_task_problems
from yt8m.tasks.video import task_problems as label_task_problems

LABEL_SOURCES = ("labels", "vocabulary", "segments", "teacher")
HEAD_KINDS = ("own", "shared")
MAIN_TASK = "main"  # the implicit first task of --aux_vertical_weight without a `tasks:` section
VERTICAL_TASK = "vertical"
DEFAULT_VOCABULARY_COLUMN = "Vertical1"


def _task_loss_problem(name: str) -> Optional[str]:
    return None if name == "" else known_loss(name)


def _distill_losses() -> list[str]:
    return list(DISTILL_LOSSES)


def _task_metric_problem(name: str) -> Optional[str]:
    return None if name == "" else metric_problem(name)




@dataclass(frozen=True)
class TasksConfig:
    """The `tasks` section: a run's tasks beside its main one (docs/how-to/multi-task.md), and how batches of
    their data sets take turns."""

    entries: list[dict] = setting([], "Multi-task training: a list of tasks (YAML; docs/how-to/multi-task.md), "
                                      "each with its own labels, data, head, loss and weight.", flag="tasks")
    aux_vertical_weight: float = setting(0.0, "Add the auxiliary task 'vertical' with this loss weight: the entity "
                                              "labels mapped to the Vertical1 column of --vocabulary_file (0: none).",
                                         at_least=0)
    vocabulary_file: str = setting("", "The label vocabulary CSV (Index plus columns such as Vertical1) that "
                                       "vocabulary tasks map labels through.")
    task_sampling: str = setting("proportional", "Multi-task: which task's data the next batch comes from: "
                                                 "'proportional' (to each data set's size), 'weights' (to its tasks' "
                                                 "weights) or 'round_robin'; seeded.",
                                 choices=lambda: ("proportional", "weights", "round_robin"))

    @property
    def multitask(self) -> bool:
        """Whether the run asks for tasks (a `tasks:` list or a shorthand); else it is a run of one task."""
        return bool(self.entries) or self.aux_vertical_weight > 0


@dataclass(frozen=True)
class MainTask:
    """What a run's tasks default to: the main flags' data, features, loss, best metric and teacher (a run without
    tasks is this one task)."""

    train_data_pattern: str
    eval_data_pattern: str
    features: FeatureSpec
    loss: LossConfig
    best_metric: str
    distillation: DistillationConfig = DistillationConfig()
    metrics: tuple[str, ...] = ()  # --metrics: those of one's own every task reports


@dataclass(frozen=True)
class TaskData:
    """What a task reads: its shards, where its labels come from, and its classes (in a TaskSpec: resolved)."""

    train_data_pattern: str = setting("", "Training shards of this task (default: --train_data_pattern).")
    eval_data_pattern: str = setting("", "Validation shards (default: --eval_data_pattern where the task trains on "
                                         "--train_data_pattern).")
    label_source: str = setting("labels", "'labels' (the record's), 'vocabulary' (the record's labels mapped through "
                                          "a vocabulary column), 'segments' (2019 segment ratings) or 'teacher' (a "
                                          "teacher's soft targets for the records; validated on their labels).",
                                choices=lambda: LABEL_SOURCES)
    vocabulary_file: str = setting("", "label_source vocabulary: the vocabulary CSV (default: --vocabulary_file).")
    vocabulary_column: str = setting(DEFAULT_VOCABULARY_COLUMN, "label_source vocabulary: the column whose values "
                                                                "are this task's classes (sorted by name).")
    num_classes: Optional[int] = setting(None, "Classes of this task (default: --num_classes on the main data; on "
                                               "data of its own 4716 for 2017 shards (id key video_id), else 3862; "
                                               "the column's values for a vocabulary mapping).", at_least=1)


@dataclass(frozen=True)
class TaskHead:
    """Which head a task reads and what it is (in a TaskSpec, `head` is the name of the task whose head it reads:
    its own name for an own head)."""

    head: str = setting("own", "'own': a head of its own on the shared trunk; 'shared': the first task's head "
                               "(only the loss differs).", choices=lambda: HEAD_KINDS)
    head_model: str = setting("", "The own head's video-level model (default: the model's classifier).")
    head_hparams: dict = setting({}, "The own head's hyper-parameters (default: the main flags').")


@dataclass(frozen=True)
class TaskObjective:
    """What a task learns and is judged on: its loss and weight, its best-tracking metric, whether it validates."""

    loss: str = setting("", "The task's loss (default: --label_loss).", check=_task_loss_problem, resolves=True)
    loss_hparams: dict = setting({}, "The loss's hyper-parameters (default: the main flags' where the loss is "
                                     "--label_loss, else the loss's defaults).")
    weight: float = setting(1.0, "The task's loss weight in the total loss.", at_least=0)
    metric: str = setting("", "The task's own best-tracking metric (default: gap; segment_map for segments).",
                          check=_task_metric_problem, resolves=True)
    metrics: list[str] = setting([], "Metrics of one's own the task reports beside its own (default: --metrics).",
                                 check=metrics_problem, resolves=True)
    validate: bool = setting(True, "Evaluate this task with the others (false: trained, never validated).")


@dataclass(frozen=True)
class TaskTeacher:
    """label_source teacher: whose predictions are the task's targets, and how they are learnt."""

    teacher: str = setting("", "label_source teacher: a run, checkpoint, ONNX export or predictions file (JSONL, CSV) "
                               "whose predictions on this task's videos are its targets.")
    distill_temperature: float = setting(1.0, "label_source teacher: the distillation temperature T (losses scaled "
                                              "by T^2).", at_least=1e-6)
    distill_loss: str = setting("binary", "label_source teacher: 'binary' (per-class sigmoid cross-entropy) or "
                                          "'softmax' (KL divergence of the softmaxes).", choices=_distill_losses)


@dataclass(frozen=True)
class TaskConfig:
    """One entry of the `tasks:` list (flat, or by section); empty fields take the main flags' values."""

    name: str = setting("", "The task's name: its metrics are TASK/METRIC, its head heads.TASK.", required=True)
    data: TaskData = dataclasses.field(default_factory=TaskData)
    head: TaskHead = dataclasses.field(default_factory=TaskHead)
    objective: TaskObjective = dataclasses.field(default_factory=TaskObjective)
    distillation: TaskTeacher = dataclasses.field(default_factory=TaskTeacher)

    def problems(self) -> list[str]:
        problems = []
        head, teacher, label_source = self.head, self.distillation.teacher, self.data.label_source
        if not isinstance(head.head_hparams, dict):
            problems.append(f"head_hparams must be a mapping of hyper-parameter: value, got {head.head_hparams!r}")
        if (label_source == "teacher") != bool(teacher):
            problems.append("label_source teacher needs teacher: PATH" if teacher == "" else
                            f"teacher {teacher} is given, but label_source is {label_source!r} (use "
                            "label_source: teacher)")
        if "/" in self.name:
            problems.append(f"name {self.name!r} must not contain '/' (metrics are named TASK/METRIC)")
        if head.head == "shared" and (head.head_model or head.head_hparams):
            problems.append("head 'shared' reads the first task's head: head_model and head_hparams belong to "
                            "'own' heads")
        return problems


@dataclass(frozen=True)
class TaskDistillation:
    """A task's teacher as it is learnt: the teacher, T, the loss, and the weight of the teacher's loss beside the
    labels' (1 for label_source teacher: its alone); no teacher: none."""

    teacher: str = ""
    distill_temperature: float = 1.0
    distill_loss: str = "binary"
    distill_weight: float = 1.0


@dataclass(frozen=True)
class TaskSpec:
    """A task resolved against the main flags: every default filled in (num_classes once the data is read). The one
    task of a config without tasks has the name "": its metrics keep their plain names (gap, not main/gap)."""

    name: str
    data: TaskData
    head: TaskHead
    objective: TaskObjective
    distillation: TaskDistillation = TaskDistillation()
    id_key: str = ""  # of its training records: "id" (2018 and later) or "video_id" (2017); set with the data read

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TaskSpec":
        """A spec as a checkpoint records it: by part (dataclasses.asdict), or flat as written before parts."""
        return config_from_dict(cls, values, source="a checkpoint's tasks", check_values=False)

    @property
    def segments(self) -> bool:
        return self.data.label_source == "segments"

    @property
    def num_classes(self) -> Optional[int]:
        return self.data.num_classes

    @property
    def metric_key(self) -> str:
        return key_of(self.name, self.objective.metric)

    def field(self, name: str) -> str:
        """How a problem names one of the task's fields: as the flag of a config without tasks, else in its entry."""
        flags = {"loss": "--label_loss", "metric": "--best_metric", "teacher": "--teacher"}
        return flags[name] if not self.name else f"task {self.name}: {name}"


def key_of(task: str, metric: str) -> str:
    """A metric's key in a run's results: TASK/METRIC, or METRIC for the one task of a run without tasks."""
    return f"{task}/{metric}" if task else metric


def task_entries(tasks: TasksConfig) -> list[dict[str, Any]]:
    """The `tasks:` entries with the shorthands' tasks added (an implicit first task where the section is empty)."""
    entries = [dict(entry) if isinstance(entry, dict) else entry for entry in tasks.entries]
    if tasks.aux_vertical_weight > 0:
        if not entries:
            entries.append({"name": MAIN_TASK})
        entries.append({"name": VERTICAL_TASK, "label_source": "vocabulary", "weight": tasks.aux_vertical_weight,
                        "vocabulary_file": tasks.vocabulary_file})
    return entries


def parse_task_configs(tasks: TasksConfig) -> tuple[list[TaskConfig], list[str]]:
    """Each entry as a TaskConfig, and every problem of every entry (named by its position and name), the losses and
    metrics it names found (the entries are read when a run is built)."""
    parsed, problems = [], []
    for index, entry in enumerate(task_entries(tasks)):
        if not isinstance(entry, dict):
            problems.append(f"tasks[{index}]: expected a mapping of field: value, got {entry!r}")
            continue
        source = f"tasks[{index}] ({entry.get('name') or 'unnamed'})"
        try:
            parsed.append(config_from_dict(TaskConfig, entry, source=source, checks=_component_problems))
        except ConfigError as err:
            problems += [problem if problem.startswith(source) else f"{source}: {problem.removeprefix('--')}"
                         for problem in err.problems]
    return parsed, problems


def _component_problems(config: TaskConfig, skip: AbstractSet[str]) -> list[str]:
    return config_problems(config, skip, components=True)


def resolve_tasks(tasks: TasksConfig, main: MainTask) -> list[TaskSpec]:
    """The run's tasks with the main flags filled in (a run without tasks: its one task); a ValueError lists every
    problem of the entries (see task_problems for the rest)."""
    if not tasks.multitask:
        return [the_one_task(main)]
    parsed, problems = parse_task_configs(tasks)
    if problems:
        raise ValueError("invalid tasks:\n  " + "\n  ".join(problems))
    return [_resolve(task, tasks, main, parsed[0].name) for task in parsed]


def the_one_task(main: MainTask) -> TaskSpec:
    """The task of a run without tasks: the main data's labels (or segment ratings), the main flags' loss and
    classes, --best_metric its metric, and --teacher's distillation when given."""
    distillation = main.distillation
    data = TaskData(train_data_pattern=main.train_data_pattern, eval_data_pattern=main.eval_data_pattern,
                    label_source="segments" if main.features.segment_labels else "labels", vocabulary_file="",
                    vocabulary_column="", num_classes=main.features.num_classes)
    return TaskSpec("", data, TaskHead(head="", head_model="", head_hparams={}),
                    TaskObjective(loss=main.loss.name, loss_hparams=_hparams_mapping(main.loss), weight=1.0,
                                  metric=canonical_metric(main.best_metric), validate=True,
                                  metrics=_reported([*main.metrics, main.best_metric])),
                    TaskDistillation(distillation.teacher, distillation.distill_temperature,
                                     distillation.distill_loss, distillation.distill_weight))


def reads_segments(label_source: str, train_data_pattern: str, main_pattern: str, segment_labels: bool) -> bool:
    """Whether a task learns 2019 segment ratings: its label source says so, or it reads the main data's labels
    (`main_pattern`'s) and --segment_labels makes those the ratings."""
    on_main_data = train_data_pattern in ("", main_pattern)
    return label_source == "segments" or (label_source == "labels" and on_main_data and segment_labels)


def _resolve(task: TaskConfig, tasks: TasksConfig, main: MainTask, first: str) -> TaskSpec:
    data, objective = task.data, task.objective
    on_main_data = data.train_data_pattern in ("", main.train_data_pattern)
    segments = reads_segments(data.label_source, data.train_data_pattern, main.train_data_pattern,
                              main.features.segment_labels)
    label_source = "segments" if segments else data.label_source
    num_classes = data.num_classes
    if num_classes is None and on_main_data and label_source != "vocabulary":
        num_classes = main.features.num_classes
    resolved = dataclasses.replace(
        data, train_data_pattern=data.train_data_pattern or main.train_data_pattern,
        eval_data_pattern=data.eval_data_pattern or (main.eval_data_pattern if on_main_data else ""),
        label_source=label_source, vocabulary_file=data.vocabulary_file or tasks.vocabulary_file,
        num_classes=num_classes)
    head = dataclasses.replace(task.head, head=first if task.head.head == "shared" else task.name,
                               head_hparams=dict(task.head.head_hparams))
    loss = objective.loss or main.loss.name
    main_hparams = _hparams_mapping(main.loss) if loss == main.loss.name else {}
    metric = canonical_metric(objective.metric or ("segment_map" if segments else "gap"))
    best_task, _, best = main.best_metric.rpartition("/")
    best_here = [best] if (best_task or first) == task.name else []
    objective = dataclasses.replace(objective, loss=loss, loss_hparams={**main_hparams, **objective.loss_hparams},
                                    metric=metric,
                                    metrics=_reported([*(objective.metrics or main.metrics), metric, *best_here]))
    teacher = task.distillation
    return TaskSpec(task.name, resolved, head, objective,
                    TaskDistillation(teacher.teacher, teacher.distill_temperature, teacher.distill_loss))


def task_problems(tasks: TasksConfig, main: MainTask) -> list[str]:
    """Every problem of a run's tasks that needs no data read: the entries' fields, names used twice, a shared head
    of another size, a loss or metric a task lacks, --best_metric naming no task (the teacher's fit is
    yt8m.inference.teachers')."""
    if not tasks.multitask:
        spec = the_one_task(main)
        return label_task_problems(spec.segments, _known(spec.objective.loss), spec.objective.metric,
                                   spec.field("loss"), spec.field("metric")) + _reported_problems(spec)
    parsed, problems = parse_task_configs(tasks)
    if not parsed:
        return problems or ["tasks: the list is empty"]
    specs = [_resolve(task, tasks, main, parsed[0].name) for task in parsed]
    names = [str(entry["name"]) for entry in task_entries(tasks) if isinstance(entry, dict) and entry.get("name")]
    problems += [f"tasks: two tasks are named {name!r}" for name in sorted({n for n in names if names.count(n) > 1})]
    for spec in specs:
        problems += _spec_problems(spec, specs[0], main)
    if not any(spec.objective.weight for spec in specs):
        problems.append("tasks: every task's weight is 0: the loss would be 0 and nothing would be learned")
    return problems + best_metric_problems(main.best_metric, specs)


def _reported_problems(spec: TaskSpec) -> list[str]:
    """Why the task cannot report the metrics of one's own it is given (--metrics, its `metrics`)."""
    field = "--metrics" if not spec.name else f"task {spec.name}: metrics"
    return [problem for name in spec.objective.metrics if name != spec.objective.metric
            for problem in metric_task_problems(spec.segments, name, field)]


def _reported(names: list[str]) -> list[str]:
    """The metrics of one's own among `names` (a task reports its own anyway), by their results keys, once each."""
    return list(dict.fromkeys(canonical_metric(name) for name in names if not is_own_metric(name)))


def _known(loss: str) -> Optional[str]:
    """A loss to check against the task, None for a name that is none (--label_loss's own check says so)."""
    return loss if known_loss(loss) is None else None


def _hparams_mapping(loss: LossConfig) -> dict[str, Any]:
    return dataclasses.asdict(loss.hparams) if loss.hparams is not None else {}


def task_loss(spec: TaskSpec) -> LossConfig:
    """The loss section of a task: its loss and hyper-parameters (a ValueError names a bad one)."""
    try:
        return LossConfig(spec.objective.loss, spec.objective.loss_hparams)
    except ConfigError as err:
        raise ValueError(f"{spec.field('loss')}: " + "; ".join(err.problems)) from err


def _spec_problems(spec: TaskSpec, first: TaskSpec, main: MainTask) -> list[str]:
    where = f"task {spec.name}"
    data, objective = spec.data, spec.objective
    problems = label_task_problems(spec.segments, _known(objective.loss), objective.metric, spec.field("loss"),
                                   spec.field("metric")) + _reported_problems(spec)
    if _known(objective.loss):
        try:
            task_loss(spec)
        except ValueError as err:
            problems.append(str(err))
    if data.label_source == "vocabulary" and not data.vocabulary_file:
        problems.append(f"{where}: label_source vocabulary needs vocabulary_file (or --vocabulary_file)")
    if spec.segments and not main.features.frame_features:
        problems.append(f"{where}: segment ratings are read from frame-level data: set --frame_features")
    if objective.validate and main.eval_data_pattern and not data.eval_data_pattern:
        problems.append(f"{where}: validate needs eval_data_pattern (it trains on data of its own); or set "
                        f"validate: false")
    if spec.head.head != spec.name and spec.num_classes != first.num_classes:
        problems.append(f"{where}: head 'shared' reads task {spec.head.head}'s {first.num_classes} classes, but "
                        f"num_classes is {spec.num_classes}")
    return problems


def best_metric_problems(best_metric: str, specs: list[TaskSpec]) -> list[str]:
    task, _, metric = best_metric.rpartition("/")
    names = [spec.name for spec in specs]
    if task and task not in names:
        return [f"--best_metric {best_metric}: no task is named {task!r} (tasks: {', '.join(names)})"]
    spec = specs[names.index(task)] if task else specs[0]
    return label_task_problems(spec.segments, None, metric,
                               metric_field=f"--best_metric {best_metric}: task {spec.name}:")


def best_metric_key(best_metric: str, specs: list[TaskSpec]) -> str:
    """--best_metric as the key of the results: TASK/METRIC; a plain METRIC means the first task's."""
    task, _, metric = best_metric.rpartition("/")
    return key_of(task if task else specs[0].name, canonical_metric(metric))

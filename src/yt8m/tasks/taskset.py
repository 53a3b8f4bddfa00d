"""A run's tasks together (one, or several sharing a trunk): each task resolved against its data, the data sources
they read, and the loss, batch metrics and result names of a step, as one object the trainer, validation, tuning and
prediction ask alike. A config without tasks is a run of one unnamed task on a plain model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from yt8m.config import config_values
from yt8m.data.format.decode import CLASSES_2017, CLASSES_2018, record_id_key
from yt8m.data.format.tfrecord import expand_pattern, list_shards, read_records
from yt8m.data.reading.batch import Batch
from yt8m.models.base import forward
from yt8m.models.multihead import HeadView, MultiTaskModel
from yt8m.tasks.base import Output, Task
from yt8m.tasks.labels import LabelMappedTask, read_vocabulary_mapping
from yt8m.tasks.losses import create_loss
from yt8m.tasks.spec import MainTask, TasksConfig, TaskSpec, key_of, resolve_tasks, task_loss, the_one_task
from yt8m.tasks.spec import best_metric_key as spec_best_metric_key
from yt8m.tasks.teacher import DistillationTask, Teacher
from yt8m.tasks.video import DEFAULT_TOP_K, label_task

log = logging.getLogger("yt8m.tasks.teacher")
# Opens the teacher of a task that has one: (spec, the task's training shards) -> its Teacher (closed by the caller).
OpenTeacher = Callable[[TaskSpec, list[str]], Teacher]


@dataclass
class TaskSource:
    """One training or validation data set and the tasks whose labels its records give; `record_classes`: the
    records' label space (the labels tasks' num_classes, the entities a vocabulary task maps)."""

    pattern: str
    segments: bool
    record_classes: int
    tasks: list[str] = field(default_factory=list)


class TaskSet:
    """The tasks of a run: a batch's loss is the weighted sum of the losses of the tasks its source feeds, each read
    from its head. With named tasks (a `tasks:` section) the model has a head per task and the results are
    TASK/METRIC; the one task of a config without tasks reads the model's only output and keeps plain names."""

    def __init__(self, specs: list[TaskSpec], tasks: dict[str, Task], sources: list[TaskSource],
                 record_classes: dict[str, int]):
        self.specs, self.tasks, self.sources, self.record_classes = specs, tasks, sources, record_classes
        self.named = bool(specs[0].name)
        self.weights = {spec.name: spec.objective.weight for spec in specs}
        self.heads = {spec.name: spec.head.head for spec in specs}

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.specs]

    def best_metric_key(self, best_metric: str) -> str:
        """--best_metric as the key of the results: TASK/METRIC (a plain METRIC: the first task's), or METRIC."""
        return spec_best_metric_key(best_metric, self.specs)

    def key(self, task: str, metric: str) -> str:
        return key_of(task, metric)

    def forward(self, model: nn.Module, batch: Batch) -> Output:
        """The model's output on a batch: of a multi-head model only the heads of the batch's tasks, which alone
        get gradients from it."""
        heads = list(dict.fromkeys(self.heads[name] for name in self.sources[batch.source].tasks))
        return forward(model, batch, heads if self.named else None)

    def loss(self, output: Any, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The batch's loss, the weighted sum of its tasks' losses, and each named task's own (detached), by
        TASK/loss (none for the one task of a run without tasks, whose loss is the total)."""
        weighted, parts = [], {}
        for name in self.sources[batch.source].tasks:
            loss = self.tasks[name].loss(self.head_output(output, name), batch)
            if self.named:
                parts[f"{name}/loss"] = loss.detach()
            weighted.append(loss * self.weights[name])
        return functools.reduce(operator.add, weighted), parts

    def head_output(self, output: Any, task: str) -> Output:
        """What task `task` reads of the model's output."""
        if not self.named:
            return output
        return {key: values[self.heads[task]] for key, values in output.items()}

    def batch_metrics(self, output: Any, batch: Batch) -> dict[str, float]:
        """The step log's metrics of a batch, by each task of its source."""
        return {self.key(name, metric): value for name in self.sources[batch.source].tasks
                for metric, value in self.tasks[name].batch_metrics(
                    self.head_output(output, name)["predictions"], batch).items()}

    def view(self, model: nn.Module, task: str) -> nn.Module:
        """Task `task`'s part of the model (a MultiTaskModel with named tasks) as a single-task model, for
        evaluation, prediction and export."""
        return HeadView(model, task) if isinstance(model, MultiTaskModel) and self.named else model

    def checkpoint_state(self) -> list[dict[str, Any]]:
        """What a checkpoint records of the tasks (Checkpoint.tasks): the named tasks' specs, which a resume must
        match; none for the one task of a run without tasks."""
        return [config_values(spec) for spec in self.specs] if self.named else []

    def validation_sources(self) -> list[TaskSource]:
        """The validated tasks grouped by what they read (one pass over each set serves all its tasks)."""
        sources: dict[tuple, TaskSource] = {}
        for spec in self.specs:
            if spec.objective.validate and spec.data.eval_data_pattern:
                key = (spec.data.eval_data_pattern, spec.segments, self.record_classes[spec.name])
                sources.setdefault(key, TaskSource(*key)).tasks.append(spec.name)
        return list(sources.values())

    @contextlib.contextmanager
    def teachers(self, open_teacher: OpenTeacher) -> Iterator["TaskSet"]:
        """Within the block, a task set in which each task with a teacher learns its soft targets (a
        DistillationTask of its weight around the label task, which validation keeps judging): one door for
        --teacher and label_source teacher. This task set is left as it is."""
        with contextlib.ExitStack() as opened:
            tasks = dict(self.tasks)
            for spec in self.specs:
                distillation = spec.distillation
                if distillation.teacher:
                    teacher = open_teacher(spec, expand_pattern(spec.data.train_data_pattern))
                    opened.callback(teacher.close)
                    log.info("distilling from %s (%s: %s), weight %g, temperature %g, %s loss", teacher.source,
                             teacher.mode, "run on each batch" if teacher.mode == "streamed"
                             else "read once into a store keyed by video id", distillation.distill_weight,
                             distillation.distill_temperature, distillation.distill_loss)
                    tasks[spec.name] = DistillationTask(tasks[spec.name], teacher, distillation.distill_weight,
                                                        distillation.distill_temperature, distillation.distill_loss)
            yield TaskSet(self.specs, tasks, self.sources, self.record_classes)


def one_task_set(main: MainTask, top_n: int, loss_fn: Optional[nn.Module] = None) -> TaskSet:
    """The task set of a run without tasks, with `loss_fn` as its task's loss (default: the main loss's)."""
    spec = the_one_task(main)
    classes = main.features.num_classes
    task = label_task(spec.segments, loss_fn if loss_fn is not None else create_loss(task_loss(spec)), classes,
                      top_n=top_n, metrics=spec.objective.metrics)
    return TaskSet([spec], {"": task}, [TaskSource(spec.data.train_data_pattern, spec.segments, classes, [""])],
                   {"": classes})


def plan_tasks(tasks_config: TasksConfig, main: MainTask, top_n: int, top_k: int = DEFAULT_TOP_K,
               check: Callable[[TaskSpec], list[str]] = lambda spec: []) -> TaskSet:
    """Resolve a run's tasks against their data (num_classes from the records' id key where not given,
    vocabulary mappings read); a ValueError names the task and field of what does not fit, first what `check` finds
    of each task once its classes are known (its teacher's fit: yt8m.training.checks)."""
    specs: list[TaskSpec] = []
    tasks: dict[str, Task] = {}
    record_classes: dict[str, int] = {}
    sources: dict[tuple[str, bool], TaskSource] = {}
    for spec in resolve_tasks(tasks_config, main):
        if spec.name:
            spec = dataclasses.replace(spec, id_key=first_id_key(spec.data.train_data_pattern,
                                                                 main.features.frame_features))
        records = record_classes[spec.name] = _record_classes(spec, main)
        tasks[spec.name], num_classes = _label_task(spec, records, top_k, top_n)
        spec = dataclasses.replace(spec, data=dataclasses.replace(spec.data, num_classes=num_classes))
        specs.append(spec)
        problems = check(spec)
        if problems:
            raise ValueError("; ".join(problems))
        key = (spec.data.train_data_pattern, spec.segments)
        source = sources.setdefault(key, TaskSource(*key, records))
        if source.record_classes != records:
            raise ValueError(f"task {spec.name}: reads {spec.data.train_data_pattern} with {records} label classes, "
                             f"but task {source.tasks[0]} reads its labels with {source.record_classes} (num_classes)")
        source.tasks.append(spec.name)
    for spec in specs:
        head_classes = specs[[s.name for s in specs].index(spec.head.head)].num_classes
        if spec.num_classes != head_classes:
            raise ValueError(f"task {spec.name}: head 'shared' reads task {spec.head.head}'s {head_classes} classes, "
                             f"but the task has {spec.num_classes} (num_classes)")
    return TaskSet(specs, tasks, list(sources.values()), record_classes)


def _label_task(spec: TaskSpec, records: int, top_k: int, top_n: int) -> tuple[Task, int]:
    """The task of the spec's labels and its number of classes: the record's, or mapped through a vocabulary
    column."""
    loss, data = create_loss(task_loss(spec)), spec.data
    if data.label_source != "vocabulary":
        return label_task(spec.segments, loss, records, top_k, top_n, spec.objective.metrics), records
    where = f"task {spec.name}"
    mapping = read_vocabulary_mapping(data.vocabulary_file, data.vocabulary_column, records, where)
    classes = len(mapping.class_names)
    if spec.num_classes not in (None, classes):
        raise ValueError(f"{where}: num_classes is {spec.num_classes}, but {data.vocabulary_column} of "
                         f"{data.vocabulary_file} has {classes} values")
    return LabelMappedTask(label_task(False, loss, classes, top_k, metrics=spec.objective.metrics), mapping), classes


def _record_classes(spec: TaskSpec, main: MainTask) -> int:
    """The label space of the task's records: num_classes where it names it (the main flag on the main data),
    else 4716 for 2017 shards (id key video_id) and 3862 for later ones, from the first record."""
    if spec.num_classes is not None and spec.data.label_source != "vocabulary":
        return spec.num_classes
    if spec.data.train_data_pattern == main.train_data_pattern:
        return main.features.num_classes
    return CLASSES_2017 if spec.id_key == "video_id" else CLASSES_2018


def first_id_key(pattern: str, frame_features: bool) -> str:
    """The id key of the first record of `pattern` ("" where it has none)."""
    path, size = next(iter(list_shards(pattern).items()))
    first = next(read_records(path, size=size), None)
    return (None if first is None else record_id_key(first[1], frame_features)) or ""


@contextlib.contextmanager
def naming_tasks(source: TaskSource) -> Iterator[None]:
    """A data error of a named task's source (a label beyond num_classes, a wrong feature size) re-raised naming its
    tasks; the one task of a config without tasks is the run's, whose errors need no name."""
    try:
        yield
    except ValueError as error:
        if not any(source.tasks) or str(error).startswith("task"):
            raise
        raise ValueError(f"task {', '.join(source.tasks)} (num_classes {source.record_classes}, reading "
                         f"{source.pattern}): {error}") from error


def task_set_problem(saved: Optional[list[TaskSpec]], requested: list[TaskSpec]) -> Optional[str]:
    """What differs between a checkpoint's tasks and this run's (None: the same), as resuming would see it."""
    saved_fields = {spec.name: _identity(spec) for spec in saved or []}
    requested_fields = {spec.name: _identity(spec) for spec in requested if spec.name}
    if saved_fields == requested_fields:
        return None
    lines = [f"task {name}: only in the checkpoint" for name in saved_fields if name not in requested_fields]
    lines += [f"task {name}: not in the checkpoint" for name in requested_fields if name not in saved_fields]
    for name in saved_fields.keys() & requested_fields.keys():
        lines += [f"task {name}: {key} {saved_fields[name][key]!r} in the checkpoint, {value!r} here"
                  for key, value in requested_fields[name].items() if saved_fields[name][key] != value]
    return "; ".join(sorted(lines))


def _identity(spec: TaskSpec) -> dict[str, Any]:
    """The fields of a task that shape the model or what its head means."""
    return {"label_source": spec.data.label_source, "num_classes": spec.num_classes, "head": spec.head.head,
            "head_model": spec.head.head_model, "head_hparams": spec.head.head_hparams, "loss": spec.objective.loss,
            "vocabulary_column": spec.data.vocabulary_column, "teacher": spec.distillation.teacher}

"""Training several tasks at once: the plan (tasks resolved against their data), their data interleaved batch by
batch, the loop's combined task (losses by weight, each logged) and the per-task validation (TASK/METRIC keys).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import torch
from torch import nn

from yt8m.data.decode import CLASSES_2017, CLASSES_2018, record_id_key
from yt8m.tasks.losses import create_loss
from yt8m.tasks.labels import LabelMappedTask, read_vocabulary_mapping
from yt8m.tasks.spec import TaskSpec, resolve_tasks
from yt8m.tasks.video import SegmentTask, VideoTask



@dataclass
class TaskSource:
    """One training or validation data set and the tasks whose labels its records give; `record_classes`: the
    records' label space (the labels tasks' num_classes, the entities a vocabulary task maps)."""

    pattern: str
    segments: bool
    record_classes: int
    tasks: list[str] = field(default_factory=list)


@dataclass
class MultiTaskPlan:
    """The resolved tasks, the task object of each (yt8m.tasks.video interface) and the data sources of training."""

    specs: list[TaskSpec]
    tasks: dict[str, Any]
    sources: list[TaskSource]
    record_classes: dict[str, int]  # per task

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.specs]

    def validation_sources(self) -> list[TaskSource]:
        """The validated tasks grouped by what they read (one pass over each set serves all its tasks)."""
        sources: dict[tuple, TaskSource] = {}
        for spec in self.specs:
            if spec.validate and spec.eval_data_pattern:
                key = (spec.eval_data_pattern, spec.segments, self.record_classes[spec.name])
                sources.setdefault(key, TaskSource(*key)).tasks.append(spec.name)
        return list(sources.values())


def plan_tasks(config: Any, top_k: int = 20) -> MultiTaskPlan:
    """Resolve the config's tasks against their data (num_classes from the records' id key where not given,
    vocabulary mappings read); a ValueError names the task and field of what does not fit."""
    specs = resolve_tasks(config)
    tasks, record_classes, sources = {}, {}, {}
    for spec in specs:
        where = f"task {spec.name}"
        spec.id_key = first_id_key(spec.train_data_pattern, config.frame_features)
        records = record_classes[spec.name] = _record_classes(spec, config)
        loss = create_loss(spec.loss)
        if spec.label_source == "vocabulary":
            mapping = read_vocabulary_mapping(spec.vocabulary_file, spec.vocabulary_column, records, where)
            if spec.num_classes not in (None, len(mapping.class_names)):
                raise ValueError(f"{where}: num_classes is {spec.num_classes}, but {spec.vocabulary_column} of "
                                 f"{spec.vocabulary_file} has {len(mapping.class_names)} values")
            spec.num_classes = len(mapping.class_names)
            tasks[spec.name] = LabelMappedTask(VideoTask(loss, spec.num_classes, top_k), mapping)
        else:
            spec.num_classes = records
            tasks[spec.name] = (SegmentTask(loss, records, config.top_n) if spec.segments
                                else VideoTask(loss, records, top_k))
        if spec.teacher:
            _check_teacher(spec, config)
        key = (spec.train_data_pattern, spec.segments)
        source = sources.setdefault(key, TaskSource(*key, records))
        if source.record_classes != records:
            raise ValueError(f"{where}: reads {spec.train_data_pattern} with {records} label classes, but task "
                             f"{source.tasks[0]} reads its labels with {source.record_classes} (num_classes)")
        source.tasks.append(spec.name)
    for spec in specs:
        head_classes = specs[[s.name for s in specs].index(spec.head)].num_classes
        if spec.num_classes != head_classes:
            raise ValueError(f"task {spec.name}: head 'shared' reads task {spec.head}'s {head_classes} classes, but "
                             f"the task has {spec.num_classes} (num_classes)")
    return MultiTaskPlan(specs, tasks, list(sources.values()), record_classes)


def _check_teacher(spec: TaskSpec, config: Any) -> None:
    from yt8m.tasks.teacher import TeacherInputs, teacher_fit_problems

    student = TeacherInputs(config.feature_names, config.feature_sizes, config.frame_features, spec.num_classes)
    problems = teacher_fit_problems(spec.teacher, student, f"task {spec.name}: teacher", "num_classes")
    if problems:
        raise ValueError("; ".join(problems))


@contextlib.contextmanager
def task_teachers(plan: MultiTaskPlan, device: torch.device) -> Iterator[None]:
    """Open the teachers of the plan's teacher tasks for the block: each such task trains on its teacher's soft
    targets alone (a DistillationTask of weight 1 around its label task, which validation keeps using)."""
    from yt8m.data.tfrecord import expand_pattern
    from yt8m.tasks.teacher import DistillationTask, open_teacher
    from yt8m.inference.predict import find_video

    with contextlib.ExitStack() as teachers:
        for spec in plan.specs:
            if spec.teacher:
                paths = expand_pattern(spec.train_data_pattern)
                teacher = open_teacher(spec.teacher, spec.num_classes, device,
                                       lambda video_id, paths=paths: find_video(paths, video_id))
                teachers.callback(teacher.close)
                plan.tasks[spec.name] = DistillationTask(plan.tasks[spec.name], teacher, 1.0,
                                                         spec.distill_temperature, spec.distill_loss)
        yield


def evaluated_task(task: Any) -> Any:
    """The task validation runs: a teacher task is validated on its records' labels, never asks its teacher."""
    return getattr(task, "label_task", task)


def _record_classes(spec: TaskSpec, config: Any) -> int:
    """The label space of the task's records: num_classes where it names it (the main flag on the main data),
    else 4716 for 2017 shards (id key video_id) and 3862 for later ones, from the first record."""
    if spec.num_classes is not None and spec.label_source != "vocabulary":
        return spec.num_classes
    if spec.train_data_pattern == config.train_data_pattern:
        return config.num_classes
    return CLASSES_2017 if spec.id_key == "video_id" else CLASSES_2018


def first_id_key(pattern: str, frame_features: bool) -> str:
    """The id key of the first record of `pattern` ("" where it has none)."""
    from yt8m.data.tfrecord import expand_pattern, read_records

    first = next(read_records(expand_pattern(pattern)[0]), None)
    return (None if first is None else record_id_key(first[1], frame_features)) or ""


class MultiTask:
    """The training loop's task for several: a batch's loss is the weighted sum of the losses of the tasks its
    source feeds, each read from its head; each task's loss is kept for the step's log (`pop_losses`)."""

    def __init__(self, plan: MultiTaskPlan):
        self.plan = plan
        self.weights = {spec.name: spec.weight for spec in plan.specs}
        self.heads = {spec.name: spec.head for spec in plan.specs}
        self._losses: dict[str, list] = {}

    def heads_of(self, batch: dict) -> list[str]:
        """The heads the tasks of `batch`'s source read."""
        return list(dict.fromkeys(self.heads[name] for name in self.plan.sources[batch.source].tasks))

    def loss(self, output: dict[str, dict[str, torch.Tensor]], batch: dict) -> torch.Tensor:
        total = None
        for name in self.plan.sources[batch.source].tasks:
            loss = self.plan.tasks[name].loss(head_output(output, self.heads[name]), batch)
            sums = self._losses.setdefault(name, [torch.zeros((), dtype=torch.float64, device=loss.device), 0])
            sums[0] += loss.detach().double() * len(batch)
            sums[1] += len(batch)
            total = loss * self.weights[name] if total is None else total + loss * self.weights[name]
        return total

    def pop_losses(self) -> dict[str, float]:
        """TASK/loss: each task's mean loss over the examples of its batches since the last call."""
        losses = {f"{name}/loss": (total / count).item() for name, (total, count) in self._losses.items()}
        self._losses = {}
        return losses

    def batch_metrics(self, predictions: dict[str, torch.Tensor], batch: dict) -> dict[str, float]:
        return {f"{name}/{metric}": value for name in self.plan.sources[batch.source].tasks
                for metric, value in self.plan.tasks[name].batch_metrics(predictions[self.heads[name]], batch).items()}


def head_output(output: dict[str, dict[str, torch.Tensor]], head: str) -> dict[str, torch.Tensor]:
    return {key: values[head] for key, values in output.items()}


class MultiTaskData:
    """The training sources' datasets, read in turn: which source gives the next batch is drawn per batch
    (--task_sampling), seeded by the run's seed and the epoch; an epoch ends when every source is read through."""

    def __init__(self, config: Any, plan: MultiTaskPlan):
        from yt8m.data.dataset import YT8MDataset

        self.config, self.plan = config, plan
        self.datasets = [YT8MDataset(source.pattern, source_spec(config, source), config.batch_size, shuffle=True,
                                     seed=config.seed, shuffle_buffer=config.shuffle_buffer,
                                     skip_corrupt=config.skip_corrupt, cache_in_memory=config.cache_in_memory)
                         for source in plan.sources]
        self.loaders: list[Iterable[dict]] = []

    def check_first_records(self) -> None:
        for source, dataset in zip(self.plan.sources, self.datasets):
            with naming_tasks(source):
                dataset.check_first_record()

    def open(self, device: torch.device) -> None:
        from yt8m.data.dataset import make_loader
        from yt8m.runtime import reader_workers

        self.loaders = [make_loader(dataset, reader_workers(self.config.num_readers, dataset.spec.frame_features),
                                    pin_memory=device.type == "cuda") for dataset in self.datasets]

    def epoch_batches(self, epoch: int) -> Iterator[dict]:
        for dataset in self.datasets:
            dataset.set_epoch(epoch)
        rng = np.random.default_rng([self.config.seed, epoch, len(self.datasets)])
        streams = [tagged(loader, index, source) for index, (loader, source)
                   in enumerate(zip(self.loaders, self.plan.sources))]
        return interleave(streams, self.config.task_sampling, self.source_weights(), rng)

    def source_weights(self) -> list[float]:
        if self.config.task_sampling == "weights":
            return [sum(self.plan.specs[self.plan.names.index(name)].weight for name in source.tasks)
                    for source in self.plan.sources]
        return [float(sum(os.path.getsize(path) for path in dataset.paths)) for dataset in self.datasets]

    @property
    def skipped_files(self) -> int:
        return sum(dataset.skipped_files for dataset in self.datasets)

    @property
    def skipped_records(self) -> int:
        return sum(dataset.skipped_records for dataset in self.datasets)


def source_spec(config: Any, source: TaskSource):
    from yt8m.data.dataset import FeatureSpec

    return FeatureSpec(list(config.feature_names), list(config.feature_sizes), config.frame_features,
                       config.max_frames, source.record_classes, source.segments, config.segment_size)


@contextlib.contextmanager
def naming_tasks(source: TaskSource) -> Iterator[None]:
    """A data error of a source (a label beyond num_classes, a wrong feature size) re-raised naming its tasks."""
    try:
        yield
    except ValueError as error:
        if str(error).startswith("task"):
            raise
        raise ValueError(f"task {', '.join(source.tasks)} (num_classes {source.record_classes}, reading "
                         f"{source.pattern}): {error}") from error


def tagged(batches: Iterable[dict], index: int, source: TaskSource) -> Iterator[dict]:
    with naming_tasks(source):
        for batch in batches:
            batch.source = index
            yield batch


def interleave(streams: list[Iterator[dict]], sampling: str, weights: list[float],
               rng: np.random.Generator) -> Iterator[dict]:
    """The streams' batches in one sequence: 'round_robin' takes them in turn, otherwise each next batch comes from
    a stream drawn with probability proportional to its weight; a stream that runs out drops out."""
    active = list(range(len(streams)))
    turn = itertools.count()
    while active:
        if sampling == "round_robin":
            index = active[next(turn) % len(active)]
        else:
            chances = np.array([weights[i] for i in active], dtype=np.float64)
            chances = chances / chances.sum() if chances.sum() > 0 else np.full(len(active), 1 / len(active))
            index = active[int(rng.choice(len(active), p=chances))]
        batch = next(streams[index], None)
        if batch is None:
            active.remove(index)
            continue
        yield batch


def multitask_evaluator(config: Any, plan: MultiTaskPlan, device: torch.device):
    """evaluate(model, step) -> {TASK/METRIC: value}: every validated task's metrics on its own validation data,
    read by the task's head (all of it, or --eval_steps batches per data set)."""
    from yt8m.data.dataset import YT8MDataset, make_loader
    from yt8m.eval.evaluate import evaluate_model
    from yt8m.models.multihead import HeadView
    from yt8m.runtime import reader_workers

    sources = plan.validation_sources()
    loaders = [make_loader(YT8MDataset(source.pattern, source_spec(config, source), config.batch_size,
                                       skip_corrupt=config.skip_corrupt, rank=0, world_size=1),
                           reader_workers(config.num_readers, config.frame_features), pin_memory=device.type == "cuda")
               for source in sources]

    def evaluate(model: nn.Module, step: int) -> dict[str, Any]:
        results = {}
        for source, loader in zip(sources, loaders):
            for name in source.tasks:
                batches = loader if config.eval_steps is None else itertools.islice(loader, config.eval_steps)
                with naming_tasks(TaskSource(source.pattern, source.segments, source.record_classes, [name])):
                    metrics = evaluate_model(HeadView(model, name), batches, evaluated_task(plan.tasks[name]),
                                             device=device)
                results.update({f"{name}/{metric}": metrics[metric] for metric in plan.tasks[name].metric_names})
        return results

    return evaluate


def task_set_problem(saved: Optional[list[TaskSpec]], requested: list[TaskSpec]) -> Optional[str]:
    """What differs between a checkpoint's tasks and this run's (None: the same), as resuming would see it."""
    saved_fields = {spec.name: _identity(spec) for spec in saved or []}
    requested_fields = {spec.name: _identity(spec) for spec in requested}
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
    return {"label_source": spec.label_source, "num_classes": spec.num_classes, "head": spec.head,
            "head_model": spec.head_model, "head_hparams": spec.head_hparams, "loss": spec.loss,
            "vocabulary_column": spec.vocabulary_column, "teacher": spec.teacher}

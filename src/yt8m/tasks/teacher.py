"""Distillation (`yt8m train --teacher`): the student learns from a teacher's soft targets as well as its labels.
A teacher (a run, an ONNX export or a predictions file) gives each batch's teacher logits; `DistillationTask` is
the label task with the mixed loss, and keeps the label task's metrics.

How the teacher's predictions reach the loss:
- a model teacher (a train dir, a checkpoint or an ONNX export) reads the student's own batches: it is run on
  each batch, without gradients, on the student's device (streamed: exact, nothing stored);
- a predictions file (`yt8m predict` JSONL or Kaggle CSV) is read once, before training, into a temporary SQLite
  store keyed by video id (memory does not grow with the file), and each batch looks its videos up there.
A teacher that reads other features than the student (a video-level teacher of a frame-level student) goes
through a predictions file: `yt8m predict` with it on its own shards of the training videos.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Any, Callable, ContextManager, Iterator, Optional, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from yt8m.models.base import forward
from yt8m.tasks.video import Task, task_from_config

log = logging.getLogger("yt8m.tasks.teacher")

DISTILL_LOSSES = ("binary", "softmax")
# The settings that define what a distilled run learns: resuming it with other values is refused.
DISTILLATION_FIELDS = ("teacher", "distill_weight", "distill_temperature", "distill_loss")
# Probabilities are capped below 1 so that every teacher logit but that of a class left out (probability 0,
# logit -inf: a softmax or sigmoid at any temperature keeps it 0) is finite.
_MAX_PROBABILITY = 1.0 - 1e-7
_VIDEOS_NAMED = 3
# A video id -> where the training shards hold it ("FILE (record at byte N)", each place), for error messages.
Locator = Callable[[str], list[str]]


class MissingTeacherPrediction(ValueError):
    """A training video the teacher's predictions file does not list."""


@dataclasses.dataclass
class TeacherInputs:
    """What a model teacher reads and predicts: it runs on the student's batches, which must carry the same."""

    feature_names: list[str]
    feature_sizes: list[int]
    frame_features: bool
    num_classes: int

    def describe(self) -> str:
        kind = "frame-level" if self.frame_features else "video-level"
        return f"{kind} {','.join(self.feature_names)} ({','.join(map(str, self.feature_sizes))})"


def locate_teacher(path: str) -> tuple[str, str]:
    """(kind, file) of --teacher: "predictions" (a .jsonl or .csv file), "onnx" (FILE.onnx, or a directory with
    the export's metadata.json) or "checkpoint" (a .pt file; for a train dir, its newest best export, else its
    newest checkpoint)."""
    from yt8m.inference.onnx_export import METADATA_FILE

    if os.path.isfile(path):
        suffix = os.path.splitext(path)[1].lower()
        kinds = {".jsonl": "predictions", ".csv": "predictions", ".onnx": "onnx", ".pt": "checkpoint"}
        if suffix not in kinds:
            raise ValueError(f"--teacher {path}: a teacher file is a predictions file (.jsonl, .csv), an ONNX "
                             f"export (.onnx) or a checkpoint (.pt)")
        return kinds[suffix], path
    if os.path.isdir(path) and os.path.exists(os.path.join(path, METADATA_FILE)):
        return "onnx", path
    if os.path.isdir(path):
        return "checkpoint", run_checkpoint(path)
    raise FileNotFoundError(f"--teacher {path}: no such file or directory")


def run_checkpoint(train_dir: str) -> str:
    """The checkpoint a train dir teaches with: its newest best export (train-and-evaluate), else its newest."""
    from yt8m.io.checkpoints import checkpoint_dir, latest_checkpoint
    from yt8m.training.best_models import list_exports

    best = list_exports(train_dir, "best")
    found = latest_checkpoint(best[-1][1]) if best else latest_checkpoint(train_dir)
    if found is None:
        raise FileNotFoundError(f"--teacher {train_dir}: no checkpoint in {checkpoint_dir(train_dir)} (nor an "
                                f"ONNX export's metadata.json): train the teacher there first")
    return found


def teacher_inputs(kind: str, path: str) -> Optional[TeacherInputs]:
    """What a model teacher reads (from its run's config.yaml, its checkpoint or its export's metadata); None for
    a predictions file."""
    if kind == "predictions":
        return None
    if kind == "onnx":
        from yt8m.inference.onnx_export import artifact_paths, read_metadata

        meta = read_metadata(artifact_paths(path)[1])
        return TeacherInputs(meta["feature_names"], meta["feature_sizes"], meta["frame_features"], meta["num_classes"])
    from yt8m.io.checkpoints import checkpoint_config, load_checkpoint
    from yt8m.config import TrainConfig, load_config

    config_file = os.path.join(os.path.dirname(os.path.dirname(path)), "config.yaml")
    trained = load_config(TrainConfig, config_file) if os.path.exists(config_file) else \
        checkpoint_config(load_checkpoint(path), path)
    return TeacherInputs(trained.feature_names, trained.feature_sizes, trained.frame_features, trained.num_classes)


def teacher_problems(config: Any) -> list[str]:
    """What is wrong with a train config's --teacher: a source that is not there or not a teacher, a model teacher
    of other classes or other input features than the student's, the segment task; distillation settings given
    without a teacher."""
    if not config.teacher:
        given = [f"--{field.name}" for field in dataclasses.fields(config)
                 if field.name in DISTILLATION_FIELDS and getattr(config, field.name) != field.default]
        return [f"{' and '.join(given)} without --teacher: distillation needs a teacher"] if given else []
    problems = []
    if config.segment_labels:
        problems.append("--teacher distills video-level predictions: it does not combine with --segment_labels")
    if getattr(config, "tasks", None) or getattr(config, "aux_vertical_weight", 0):
        problems.append("--teacher does not combine with tasks: or --aux_vertical_weight: with tasks, the teacher "
                        "is a task of its own (label_source: teacher, teacher: PATH)")
    student = TeacherInputs(config.feature_names, config.feature_sizes, config.frame_features, config.num_classes)
    return problems + teacher_fit_problems(config.teacher, student, "--teacher", "--num_classes")


def teacher_fit_problems(teacher: str, student: TeacherInputs, flag: str, classes_flag: str) -> list[str]:
    """Whether `teacher` is a teacher whose targets fit a student that reads and predicts `student`; problems
    name the teacher by `flag` and the student's classes by `classes_flag`."""
    try:
        kind, path = locate_teacher(teacher)
        reads = teacher_inputs(kind, path)
    except (OSError, ValueError) as err:
        return [str(err).replace("--teacher", flag, 1)]
    if reads is None:
        return []
    problems = []
    if reads.num_classes != student.num_classes:
        problems.append(f"{flag} {teacher} predicts {reads.num_classes} classes, the student {classes_flag} "
                        f"{student.num_classes}")
    student = dataclasses.replace(student, num_classes=reads.num_classes)
    if reads != student:
        problems.append(f"{flag} {teacher} reads {reads.describe()}, the student's batches carry "
                        f"{student.describe()}: a model teacher runs on the student's batches. Predict with the "
                        f"teacher on its own shards of the training videos (`yt8m predict --output_format jsonl "
                        f"--top_k {student.num_classes}`) and pass that file as the teacher")
    return problems


class Teacher(Protocol):
    """Soft targets of a batch: `logits(batch)` [batch, classes] float32 on the batch's device."""

    source: str  # what the teacher is, for logs and errors
    mode: str  # "streamed" (run on each batch) or "stored" (computed once, looked up)

    def logits(self, batch: dict) -> torch.Tensor: ...

    def close(self) -> None: ...


class CheckpointTeacher:
    """A checkpoint's model, in eval mode without gradients, run on each of the student's batches."""

    mode = "streamed"

    def __init__(self, path: str, device: torch.device):
        from yt8m.io.checkpoints import build_model_from_checkpoint

        self.model, _, step = build_model_from_checkpoint(path, device)
        self.model.requires_grad_(False)
        self.source = f"{path} (step {step})"

    def logits(self, batch: dict) -> torch.Tensor:
        with torch.no_grad():
            return forward(self.model, batch)["logits"].float()

    def close(self) -> None:
        pass


class OnnxTeacher:
    """An ONNX export (`yt8m export`), run by onnxruntime on each of the student's batches."""

    mode = "streamed"

    def __init__(self, path: str, device: str):
        from yt8m.inference.onnx_export import load_exported

        self.exported = load_exported(path, device)
        self.source = self.exported.model_file

    @torch.compiler.disable  # onnxruntime runs outside the graph of a --compile run
    def logits(self, batch: dict) -> torch.Tensor:
        features, num_frames = batch.features, batch.num_frames
        logits = self.exported.predict(features.cpu().numpy(),
                                       None if num_frames is None else num_frames.cpu().numpy(), output="logits")
        return torch.from_numpy(logits).float().to(features.device)

    def close(self) -> None:
        pass


class StoredTeacher:
    """A predictions file read once into a temporary SQLite store keyed by video id. Classes a video's line does
    not list have probability 0: a top-k file keeps only the k largest (a full-probability file, `yt8m predict
    --top_k NUM_CLASSES`, is the better teacher, above all at temperatures above 1)."""

    mode = "stored"

    def __init__(self, path: str, num_classes: int, locate: Optional[Locator] = None):
        from yt8m.io.spill import KeyedTable, TemporaryDatabase

        self.source, self.num_classes, self.locate = path, num_classes, locate
        self.database = TemporaryDatabase()
        try:
            self.table = KeyedTable(self.database, "teacher", ("classes", "probabilities"))
            store_predictions(self.table, path, num_classes)
            self.videos, self.widest = self._extent()
        except BaseException:
            self.database.close()
            raise
        if not self.videos:
            raise ValueError(f"--teacher {path} lists no videos")
        if self.widest < num_classes:
            log.warning("--teacher %s lists at most %d of the %d classes per video: the others count as probability "
                        "0, at every temperature; a full-probability file (`yt8m predict --top_k %d`) teaches more",
                        path, self.widest, num_classes, num_classes)

    def _extent(self) -> tuple[int, int]:
        """(videos, the most classes a video lists)."""
        connection = self.database.connection
        videos, widest = connection.execute("SELECT COUNT(*), MAX(LENGTH(classes)) FROM teacher").fetchone()
        return videos, (widest or 0) // np.dtype(np.int32).itemsize

    @torch.compiler.disable  # SQLite look-ups run outside the graph of a --compile run
    def logits(self, batch: dict) -> torch.Tensor:
        video_ids = batch.video_ids
        rows = self.table.rows_of(video_ids)
        missing = [video_id for video_id in video_ids if video_id not in rows]
        if missing:
            raise MissingTeacherPrediction(self._missing_message(missing))
        probabilities = torch.zeros(len(video_ids), self.num_classes)
        lists = [(np.frombuffer(rows[video_id][0], np.int32), np.frombuffer(rows[video_id][1], np.float32))
                 for video_id in video_ids]
        video_rows = np.repeat(np.arange(len(lists)), [len(classes) for classes, _ in lists])
        classes = np.concatenate([classes for classes, _ in lists]).astype(np.int64)
        values = torch.from_numpy(np.concatenate([values for _, values in lists]))
        self._check_probabilities(values, video_ids, video_rows)
        probabilities[torch.from_numpy(video_rows), torch.from_numpy(classes)] = values
        return probability_logits(probabilities).to(batch.features.device)

    def _missing_message(self, missing: Sequence[str]) -> str:
        named = ", ".join(repr(video_id) for video_id in missing[:_VIDEOS_NAMED])
        more = f" and {len(missing) - _VIDEOS_NAMED} more in the same batch" if len(missing) > _VIDEOS_NAMED else ""
        places = self.locate(missing[0]) if self.locate is not None else []
        where = f" ({missing[0]!r} is in {' and '.join(places)})" if places else ""
        return (f"the teacher {self.source} has no prediction for video {named}{more}{where}: every training video "
                f"needs one; predict with the teacher on all the training shards")

    def _check_probabilities(self, values: torch.Tensor, video_ids: Sequence[str], video_rows: np.ndarray) -> None:
        bad = torch.nonzero((values < 0) | (values > 1)).flatten()
        if len(bad):
            video_id = video_ids[int(video_rows[int(bad[0])])]
            raise ValueError(f"--teacher {self.source}: video {video_id!r} has confidence {float(values[bad[0]])}, "
                             f"outside [0, 1]: a teacher file holds probabilities (yt8m predict's output)")

    def close(self) -> None:
        self.database.close()


def store_predictions(table: Any, path: str, num_classes: int) -> None:
    """Every line of a predictions file (JSONL or Kaggle CSV, by suffix) checked into `table`: (video id, line,
    class ids as int32 bytes, probabilities as float32 bytes); a class outside [0, num_classes) is an error."""
    if path.lower().endswith(".csv"):
        from yt8m.eval.score import load_predictions_csv

        load_predictions_csv(table, path, num_classes)
        return
    from yt8m.inference.predict import read_jsonl_predictions

    for line, (video_id, classes, confidences) in enumerate(read_jsonl_predictions(path), start=1):
        outside = [index for index in classes if index >= num_classes]
        if outside:
            raise ValueError(f"{path}: video {video_id!r} lists class {outside[0]}, outside [0, {num_classes}) "
                             f"(--num_classes)")
        if len(set(classes)) != len(classes):
            raise ValueError(f"{path}: video {video_id!r} lists a class twice")
        table.add(video_id, line, np.array(classes, np.int32).tobytes(), np.array(confidences, np.float32).tobytes())
    table.flush()


def probability_logits(probabilities: torch.Tensor) -> torch.Tensor:
    """The logits of probabilities in [0, 1]; 0 gives -inf (the class stays at 0 whatever the temperature)."""
    capped = probabilities.clamp(max=_MAX_PROBABILITY)
    return torch.log(capped) - torch.log1p(-capped)


def open_teacher(teacher: str, num_classes: int, device: torch.device, locate: Optional[Locator] = None) -> Teacher:
    """The teacher at `teacher` (a run, checkpoint, ONNX export or predictions file), ready to give targets of
    `num_classes` classes on `device`."""
    kind, path = locate_teacher(teacher)
    if kind == "predictions":
        return StoredTeacher(path, num_classes, locate)
    if kind == "onnx":
        return OnnxTeacher(path, str(device))
    return CheckpointTeacher(path, device)


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
                      kind: str = "binary") -> torch.Tensor:
    """The distillation loss of a batch, summed over classes and averaged over videos as the label losses are,
    scaled by T^2 so that its gradients keep their size whatever the temperature (Hinton, Vinyals & Dean 2015,
    "Distilling the Knowledge in a Neural Network", section 2).

    "binary": each class a yes/no question, as YouTube-8M's multi-label classes are: the cross-entropy between
    sigmoid(student / T) and sigmoid(teacher / T). "softmax": the KL divergence from the teacher's softmax over the
    classes at temperature T to the student's, the distillation loss of NeXtVLAD's mixture of three models (Lin,
    Xiao & Fan 2018, "NeXtVLAD", its section on knowledge distillation with on-the-fly naive ensemble: there the
    teacher is the gated mixture of the branches' logits and the KL term is added to the label loss)."""
    student = student_logits.float() / temperature
    teacher = teacher_logits.float() / temperature
    if kind == "binary":
        loss = F.binary_cross_entropy_with_logits(student, torch.sigmoid(teacher), reduction="sum")
    elif kind == "softmax":
        loss = F.kl_div(F.log_softmax(student, dim=1), F.softmax(teacher, dim=1), reduction="sum")
    else:
        raise ValueError(f"unknown distillation loss {kind!r}: use one of {', '.join(DISTILL_LOSSES)}")
    return loss * (temperature ** 2) / student.shape[0]


class DistillationTask:
    """A label task whose loss also learns a teacher's soft targets: (1 - W) x the label loss + W x the
    distillation loss. Metrics, in training and in evaluation, stay the label task's: a task whose label source is
    the teacher's predictions, beside the label task it wraps."""

    def __init__(self, label_task: Task, teacher: Teacher, weight: float, temperature: float, kind: str = "binary"):
        self.label_task, self.teacher = label_task, teacher
        self.weight, self.temperature, self.kind = weight, temperature, kind
        self.metric_names = label_task.metric_names
        self.num_classes = label_task.num_classes
        self.last_losses: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def loss(self, output: dict[str, torch.Tensor], batch: dict) -> torch.Tensor:
        label_loss = self.label_task.loss(output, batch)
        distill_loss = distillation_loss(output["logits"], self.teacher.logits(batch), self.temperature, self.kind)
        self.last_losses = (label_loss.detach(), distill_loss.detach())
        return (1.0 - self.weight) * label_loss + self.weight * distill_loss

    def metrics(self) -> ContextManager:
        return self.label_task.metrics()

    def accumulate(self, metrics: Any, predictions: np.ndarray, batch: dict, loss: float) -> None:
        self.label_task.accumulate(metrics, predictions, batch, loss)

    def results(self, metrics: Any, source: str) -> dict[str, Any]:
        return self.label_task.results(metrics, source)

    def batch_metrics(self, predictions: torch.Tensor, batch: dict) -> dict[str, float]:
        """The label task's batch metrics, and the last batch's label and distillation losses apart."""
        scores = self.label_task.batch_metrics(predictions, batch)
        if self.last_losses is not None:
            scores.update(label_loss=float(self.last_losses[0]), distill_loss=float(self.last_losses[1]))
        return scores


@contextlib.contextmanager
def training_task(config: Any, loss_fn: nn.Module, device: torch.device,
                  locate: Optional[Locator] = None) -> Iterator[Any]:
    """The task a train config trains on: its label task, wrapped in a DistillationTask with --teacher (the
    teacher opened, and closed on leaving)."""
    label_task = task_from_config(config, loss_fn)
    if not config.teacher:
        yield label_task
        return
    teacher = open_teacher(config.teacher, config.num_classes, device, locate)
    try:
        log.info("distilling from %s (%s: %s), --distill_weight %g, --distill_temperature %g, --distill_loss %s",
                 teacher.source, teacher.mode, "run on each batch" if teacher.mode == "streamed"
                 else "read once into a store keyed by video id", config.distill_weight, config.distill_temperature,
                 config.distill_loss)
        yield DistillationTask(label_task, teacher, config.distill_weight, config.distill_temperature,
                               config.distill_loss)
    finally:
        teacher.close()

"""Teachers (`--teacher`, `label_source: teacher`): where a teacher's soft targets come from, checked before a run
starts, and opened for it: a run or checkpoint, an ONNX export (run on each of the student's batches, streamed), or
a predictions file (`yt8m predict` JSONL or Kaggle CSV, read once into a temporary SQLite store keyed by video id).

A teacher that reads other features than the student (a video-level teacher of a frame-level student) goes
through a predictions file: `yt8m predict` with it on its own shards of the training videos.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from yt8m.config import load_yaml, read_section
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.spec import FeatureSpec
from yt8m.eval.score import load_predictions_csv
from yt8m.inference.onnx_export import METADATA_FILE, artifact_paths, load_exported, read_metadata
from yt8m.inference.predictions import read_jsonl_predictions
from yt8m.io.checkpoints import CONFIG_FILE, checkpoint_dir, latest_checkpoint, list_exports, load_checkpoint
from yt8m.io.spill import KeyedTable, TemporaryDatabase
from yt8m.models.base import forward
from yt8m.models.checkpoints import build_model_from_checkpoint
from yt8m.tasks.teacher import Teacher, probability_logits

log = logging.getLogger("yt8m.tasks.teacher")

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
        meta = read_metadata(artifact_paths(path)[1])
        return TeacherInputs(meta["feature_names"], meta["feature_sizes"], meta["frame_features"], meta["num_classes"])
    config_file = os.path.join(os.path.dirname(os.path.dirname(path)), CONFIG_FILE)
    document, source = (load_yaml(config_file), config_file) if os.path.exists(config_file) else \
        (load_checkpoint(path).config, path)
    features = read_section(document, "features", FeatureSpec, source)
    return TeacherInputs(features.feature_names, features.feature_sizes, features.frame_features,
                         features.num_classes)


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


class CheckpointTeacher:
    """A checkpoint's model, in eval mode without gradients, run on each of the student's batches."""

    mode = "streamed"

    def __init__(self, path: str, device: torch.device):
        trained = build_model_from_checkpoint(path, device)
        self.model = trained.network.requires_grad_(False)
        self.source = f"{path} (step {trained.step})"

    def logits(self, batch: Batch) -> torch.Tensor:
        with torch.no_grad():
            return forward(self.model, batch)["logits"].float()

    def close(self) -> None:
        pass


class OnnxTeacher:
    """An ONNX export (`yt8m export`), run by onnxruntime on each of the student's batches."""

    mode = "streamed"

    def __init__(self, path: str, device: str):
        self.exported = load_exported(path, device)
        self.source = self.exported.model_file

    @torch.compiler.disable  # onnxruntime runs outside the graph of a --compile run
    def logits(self, batch: Batch) -> torch.Tensor:
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
    def logits(self, batch: Batch) -> torch.Tensor:
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
        load_predictions_csv(table, path, num_classes)
        return
    for line, (video_id, classes, confidences) in enumerate(read_jsonl_predictions(path), start=1):
        outside = [index for index in classes if index >= num_classes]
        if outside:
            raise ValueError(f"{path}: video {video_id!r} lists class {outside[0]}, outside [0, {num_classes}) "
                             f"(--num_classes)")
        if len(set(classes)) != len(classes):
            raise ValueError(f"{path}: video {video_id!r} lists a class twice")
        table.add(video_id, line, np.array(classes, np.int32).tobytes(), np.array(confidences, np.float32).tobytes())
    table.flush()


def open_teacher(teacher: str, num_classes: int, device: torch.device, locate: Optional[Locator] = None) -> Teacher:
    """The teacher at `teacher` (a run, checkpoint, ONNX export or predictions file), ready to give targets of
    `num_classes` classes on `device`."""
    kind, path = locate_teacher(teacher)
    if kind == "predictions":
        return StoredTeacher(path, num_classes, locate)
    if kind == "onnx":
        return OnnxTeacher(path, str(device))
    return CheckpointTeacher(path, device)



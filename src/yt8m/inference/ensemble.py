"""Ensembles (`yt8m ensemble`): the weighted average of the probabilities of several train dirs, ONNX exports and
prediction files, written as `yt8m predict` writes them; the weights given, or fitted on labelled shards for GAP (or,
for a study's ensemble, the study's objective metric).

Inputs meet by video id. A train dir (its latest checkpoint, as `yt8m predict --train_dir` reads it; a run's
export/best/<step> folder is a train dir too) or an ONNX export predicts the shards itself; a prediction file lists
each video's top-k classes only, and a class its line does not list counts as probability 0 for that input. Every
input must hold every video written (or fitted on): a missing video is an error naming the input, the first few ids
and the count. Videos a prediction file holds beyond those are ignored, with a warning and a count in the summary, so
that one file over validation and test shards serves both the fit and the test ensemble.

Memory does not grow with the videos written: a pass holds one [batch, classes] matrix per input, and prediction
files are checked into a temporary SQLite database on disk. Fitting holds, for each video of the labelled shards,
its candidate classes (the union of each input's top --fit_top_k classes and its labels): about (inputs + 3) x
videos x candidates numbers, where candidates <= inputs x fit_top_k + the video's labels.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import torch

from yt8m.config import ConfigError, config_problems
from yt8m.data.format.decode import RecordError, decode_id_and_labels
from yt8m.data.format.tfrecord import expand_pattern, read_records
from yt8m.data.reading.dataset import YT8MDataset, make_loader
from yt8m.data.reading.inspection import find_video
from yt8m.data.reading.spec import FeatureSpec
from yt8m.eval.metrics import EvaluationMetrics
from yt8m.eval.score import check_probabilities, load_predictions_csv, unmatched
from yt8m.fields import quoted
from yt8m.inference.config import EnsembleConfig, EnsembleDataConfig, OutputConfig
from yt8m.inference.onnx_export import MODEL_FILE
from yt8m.inference.predictions import Predictor, load_model_predictor, numbered_jsonl_predictions, write_predictions
from yt8m.io.files import write_file_atomically
from yt8m.io.spill import KeyedTable, TemporaryDatabase
from yt8m.runtime import reader_workers
from yt8m.tasks.metrics import is_own_metric, parse_metric

log = logging.getLogger("yt8m.inference.ensemble")

RUN, EXPORT, PREDICTIONS = "run", "export", "predictions"
GAP_TOP_K = 20  # the competition's GAP@20, `yt8m eval`'s default
# A prediction file listing fewer classes per video than this gives the ensemble little of its ranking.
ADVISED_FILE_TOP_K = 100
REPORTED_METRICS = ("gap", "map", "hit_at_one", "perr")
_IDS_SHOWN = 5
_FIRST_STEP = 0.5
_SMALLEST_STEP = 1 / 64
_ROUNDS_PER_STEP = 20
_METRICS_CHUNK = 1024


def input_kind(source: str) -> str:
    """RUN (a folder with checkpoints/), EXPORT (FILE.onnx, or a folder with model.onnx) or PREDICTIONS (a .csv or
    .jsonl file of `yt8m predict`)."""
    if not os.path.exists(source):
        raise FileNotFoundError(f"ensemble input not found: {source}")
    if os.path.isdir(os.path.join(source, "checkpoints")):
        return RUN
    if source.endswith(".onnx") or os.path.isfile(os.path.join(source, MODEL_FILE)):
        return EXPORT
    if os.path.isfile(source) and source.endswith((".csv", ".jsonl")):
        return PREDICTIONS
    raise ValueError(f"ensemble input {source}: not a train dir (no checkpoints/ folder), an ONNX export (FILE.onnx or "
                     f"a folder with {MODEL_FILE}) or a predictions file (.csv or .jsonl)")


@dataclass
class ModelInput:
    """A train dir or ONNX export: predicts the shards itself."""

    source: str
    kind: str
    predict: Predictor
    spec: FeatureSpec  # how its batches are read
    about: dict[str, Any]


@dataclass
class FileInput:
    """A prediction file, checked into a table: video id -> int32 class bytes, float32 confidence bytes."""

    source: str
    database: TemporaryDatabase
    table: KeyedTable
    most_classes: int
    kind: str = PREDICTIONS

    def probabilities(self, video_ids: Sequence[str], num_classes: int) -> torch.Tensor:
        """[videos, num_classes]: the listed confidences, 0 for the classes a line does not list."""
        out = torch.zeros(len(video_ids), num_classes)
        for row, video_id in enumerate(video_ids):
            found = self.table.payload_of(video_id)
            if found is None:
                raise ValueError(f"{self.source}: video {quoted(video_id)} is missing: every input must predict every "
                                 "video")
            classes = torch.from_numpy(np.frombuffer(found[0], np.int32).astype(np.int64))
            out[row, classes] = torch.from_numpy(np.frombuffer(found[1], np.float32).copy())
        return out


Input = Union[ModelInput, FileInput]


@contextmanager
def opened_inputs(sources: Sequence[str], num_classes: int, device: str = "auto",
                  num_classes_given: bool = True) -> Iterator[list[Input]]:
    """The inputs, loaded: models on `device`, prediction files into a temporary database (removed on exit). Every
    input must predict `num_classes` classes; without `num_classes_given`, the first train dir's or export's classes
    are the files' (num_classes where there is none)."""
    with TemporaryDatabase() as database:
        kinds = [input_kind(source) for source in sources]
        models = {index: _load_model(source, kind, device) for index, (source, kind) in enumerate(zip(sources, kinds))
                  if kind != PREDICTIONS}
        if models and not num_classes_given:
            first = next(iter(models.values()))
            num_classes, whose = first.spec.num_classes, f"ensemble input {first.source}'s"
        else:
            whose = "--num_classes"
        for model in models.values():
            if model.spec.num_classes != num_classes:
                raise ValueError(f"ensemble input {model.source} predicts {model.spec.num_classes} classes, {whose} "
                                 f"{num_classes}: every input must predict the same classes")
        yield [models[index] if index in models else _load_file(database, f"input{index}", source, num_classes)
               for index, source in enumerate(sources)]


def _load_model(source: str, kind: str, device: str) -> ModelInput:
    predict, spec, about = load_model_predictor(source if kind == RUN else "", source if kind == EXPORT else "", device)
    return ModelInput(source, kind, predict, spec, about)


def _load_file(database: TemporaryDatabase, name: str, source: str, num_classes: int) -> FileInput:
    table = KeyedTable(database, name, ("classes", "confidences"))
    if source.endswith(".csv"):
        load_predictions_csv(table, source, num_classes, probabilities=True)
    else:
        for line, video_id, classes, confidences in numbered_jsonl_predictions(source):
            where = f"{source}:{line}: video {quoted(video_id)}"
            _check_classes(where, classes, num_classes)
            check_probabilities(where, confidences)
            table.add(video_id, line, np.array(classes, np.int32).tobytes(),
                      np.array(confidences, np.float32).tobytes())
        table.flush()  # numbered_jsonl_predictions refused any video listed twice
    if not len(table):
        raise ValueError(f"{source} lists no videos")
    most = database.connection.execute(f"SELECT MAX(LENGTH(classes)) FROM {name}").fetchone()[0] // 4
    if most < min(ADVISED_FILE_TOP_K, num_classes):
        log.warning("%s lists at most %d classes per video: the ensemble counts the others as probability 0 for it; "
                    "predict with --top_k %d or more for an ensemble input", source, most, ADVISED_FILE_TOP_K)
    return FileInput(source, database, table, most)


def _check_classes(where: str, classes: Sequence[int], num_classes: int) -> None:
    outside = [c for c in classes if c >= num_classes]
    if outside:
        raise ValueError(f"{where}: class index {outside[0]} is outside [0, {num_classes}) (--num_classes)")
    if len(set(classes)) != len(classes):
        raise ValueError(f"{where}: a class index appears twice")


# Videos ------------------------------------------------------------------------------------------------------------

def scanned_videos(pattern: str, num_classes: int) -> Iterator[tuple[str, list[int]]]:
    """(video id, labels) of each record of the shards, in file order, features left undecoded."""
    for path in expand_pattern(pattern):
        for offset, payload in read_records(path):
            try:
                yield decode_id_and_labels(payload, num_classes)
            except RecordError as err:
                raise ValueError(f"{path} (record at byte {offset}): {err}") from None


def videos_table(database: TemporaryDatabase, video_ids: Iterable[str], what: str, name: str) -> KeyedTable:
    """A new table `name` of the ids of `what` (a video twice is an error)."""
    table = KeyedTable(database, name)
    for line, video_id in enumerate(video_ids, start=1):
        duplicate = table.add(video_id, line)
        if duplicate is not None:
            raise ValueError(f"{what}: video {quoted(duplicate.key)} appears twice")
    if table.flush() is not None:
        raise ValueError(f"{what}: a video appears twice")
    return table


def check_coverage(files: Sequence[FileInput], reference: KeyedTable, what: str) -> dict[str, int]:
    """ValueError naming the first prediction file that lacks videos of `reference` (the first few and the count);
    returns how many videos each file holds beyond them (ignored, with a warning)."""
    ignored = {}
    for file in files:
        count, first = unmatched(file.database, reference.name, file.table.name)
        if count:
            raise ValueError(f"{file.source}: {count} of the {len(reference)} videos of {what} are missing "
                             f"({_listed(first, count)}): every input must predict every video")
        extra, first = unmatched(file.database, file.table.name, reference.name)
        if extra:
            log.warning("%s: %d videos are not among those of %s (%s): ignored", file.source, extra, what,
                        _listed(first, extra))
            ignored[file.source] = extra
    return ignored


def check_pattern_coverage(files: Sequence[FileInput], pattern: str, num_classes: int, name: str) -> dict[str, int]:
    """check_coverage against the videos of the shards of `pattern` (none without prediction files)."""
    if not files:
        return {}
    scanned = (video_id for video_id, _ in scanned_videos(pattern, num_classes))
    return check_coverage(files, videos_table(files[0].database, scanned, pattern, name), pattern)


def _listed(video_ids: list[str], count: int) -> str:
    return ", ".join(map(repr, video_ids)) + (f" and {count - len(video_ids)} more" if count > len(video_ids) else "")


# Aligned batches ---------------------------------------------------------------------------------------------------

@dataclass
class AlignedBatch:
    """The same videos' predictions by every input: `labels` bool [B, C] (None without shards), `probabilities`
    one float32 [B, C] per input."""

    video_ids: list[str]
    labels: Optional[torch.Tensor]
    probabilities: list[torch.Tensor]


def aligned_batches(inputs: Sequence[Input], pattern: str, num_classes: int, batch_size: int,
                    num_readers: str = "auto") -> Iterator[AlignedBatch]:
    """The videos of `pattern`, or without one the first prediction file's, in their order, each batch predicted by
    every input."""
    files = {index: item for index, item in enumerate(inputs) if isinstance(item, FileInput)}
    batches: Iterator[tuple[list[str], Optional[torch.Tensor], dict[int, torch.Tensor]]]
    if any(isinstance(item, ModelInput) for item in inputs):
        batches = _model_batches(inputs, pattern, batch_size, num_readers)
    elif pattern:
        batches = _listed_batches(scanned_videos(pattern, num_classes), batch_size, num_classes)
    else:
        first = next(iter(files.values())).table
        batches = _listed_batches(((video_id, None) for video_id in first.keys()), batch_size, num_classes)
    for video_ids, labels, probabilities in batches:
        for index, file in files.items():
            probabilities[index] = file.probabilities(video_ids, num_classes)
        yield AlignedBatch(video_ids, labels, [probabilities[index] for index in range(len(inputs))])


def _model_batches(inputs: Sequence[Input], pattern: str, batch_size: int,
                   num_readers: str) -> Iterator[tuple[list[str], Optional[torch.Tensor], dict[int, torch.Tensor]]]:
    """The shards read once per distinct feature spec of the model inputs, each model predicting its spec's batch."""
    models = {index: item for index, item in enumerate(inputs) if isinstance(item, ModelInput)}
    groups: dict[str, list[int]] = {}
    for index, item in models.items():
        groups.setdefault(repr(item.spec), []).append(index)
    loaders = []
    for members in groups.values():
        spec = models[members[0]].spec
        loaders.append(make_loader(YT8MDataset(pattern, spec, batch_size),
                                   reader_workers(num_readers, spec.frame_features)))
    for batches in itertools.zip_longest(*loaders):
        if any(batch is None for batch in batches) or any(batch.video_ids != batches[0].video_ids
                                                         for batch in batches):
            raise ValueError(f"{pattern}: the inputs' feature readers met the videos in different orders")
        probabilities = {}
        for batch, members in zip(batches, groups.values()):
            for index in members:
                predicted = models[index].predict(batch).float()
                if predicted.shape != batch.labels.shape:
                    raise ValueError(f"ensemble input {inputs[index].source} predicted a {list(predicted.shape)} "
                                     f"batch, expected {list(batch.labels.shape)}")
                probabilities[index] = predicted
        yield batches[0].video_ids, batches[0].labels, probabilities


def _listed_batches(videos: Iterator[tuple[str, Optional[list[int]]]], batch_size: int,
                    num_classes: int) -> Iterator[tuple[list[str], Optional[torch.Tensor], dict[int, torch.Tensor]]]:
    while chunk := list(itertools.islice(videos, batch_size)):
        labels = None
        if chunk[0][1] is not None:
            labels = torch.zeros(len(chunk), num_classes, dtype=torch.bool)
            for row, (_, label_ids) in enumerate(chunk):
                labels[row, label_ids] = True
        yield [video_id for video_id, _ in chunk], labels, {}


def combine(probabilities: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """The weighted average (weights normalized to sum 1)."""
    total = float(sum(weights))
    return functools.reduce(torch.add, (probability * (weight / total)
                                        for probability, weight in zip(probabilities, weights)))


# Fitting -----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FitObjective:
    """What fitted weights optimize: a metric of the ensemble's predictions on the labelled shards (a task's own,
    loss and segment_map aside, or one of one's own, as a config names it), higher or lower being better."""

    metric: str = "gap"
    maximize: bool = True

    def problem(self) -> Optional[str]:
        """Why the weights cannot be fitted for this metric, or None."""
        if self.metric in ("loss", "segment_map"):
            return (f"an ensemble's weights are fitted on its video-level predictions, which give no {self.metric} "
                    "(fit them for gap, map, map_all_classes, hit_at_one, perr or a metric of one's own)")
        return None

    def signed(self, value: float) -> float:
        """`value` as fitting maximizes it."""
        return value if self.maximize else -value


@dataclass
class Candidates:
    """Per labelled video: its candidate classes (ascending; padding where `valid` is False), their labels and each
    input's probability of them ([inputs, videos, candidates])."""

    classes: torch.Tensor
    valid: torch.Tensor
    labels: torch.Tensor
    scores: torch.Tensor

    @classmethod
    def of_batch(cls, probabilities: Sequence[torch.Tensor], labels: torch.Tensor, depth: int) -> "Candidates":
        """The union of each input's top `depth` classes (those it gives a positive probability) and the labels:
        each input's GAP@20, hit@1 and PERR (for videos of at most `depth` labels) are exact on them."""
        present = labels.clone()
        for probability in probabilities:
            top = torch.topk(probability, min(depth, probability.shape[1]), dim=1)
            present |= torch.zeros_like(present).scatter_(1, top.indices, top.values > 0)
        width = max(int(present.sum(dim=1).max()), 1)
        classes = torch.sort(present.to(torch.int8), dim=1, descending=True, stable=True).indices[:, :width]
        valid = present.gather(1, classes)
        return cls(classes, valid, labels.gather(1, classes) & valid,
                   torch.stack([probability.gather(1, classes) for probability in probabilities]))

    @classmethod
    def concat(cls, pieces: Sequence["Candidates"]) -> "Candidates":
        width = max(piece.classes.shape[1] for piece in pieces)

        def padded(tensor: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(tensor, (0, width - tensor.shape[-1]))

        return cls(*(torch.cat([padded(getattr(piece, name)) for piece in pieces], dim=-2)
                     for name in ("classes", "valid", "labels", "scores")))

    def combined(self, weights: Sequence[float]) -> torch.Tensor:
        """The ensemble's scores [videos, candidates], -inf at padding (never predicted)."""
        normalized = torch.tensor(weights, dtype=torch.float32) / float(sum(weights))
        scores = torch.einsum("n,nvu->vu", normalized, self.scores)
        return scores.masked_fill(~self.valid, float("-inf"))

    def gap(self, weights: Sequence[float]) -> float:
        """GAP@20 of the ensemble: the labels all lie among the candidates, so the candidate columns score it as
        the full [videos, classes] matrix would, in the same tie order (ascending class)."""
        with EvaluationMetrics(self.classes.shape[1], GAP_TOP_K) as metrics:
            metrics.accumulate(self.combined(weights).numpy(), self.labels.numpy())
            return metrics.get()["gap"]

    def value(self, weights: Sequence[float], metric: str, num_classes: int) -> float:
        """`metric` of the ensemble: GAP@20 from the candidates alone, any other from the [videos, classes] scores."""
        return self.gap(weights) if metric == "gap" else self.metrics(weights, num_classes, metric)[metric]

    def metrics(self, weights: Sequence[float], num_classes: int, objective: str = "gap") -> dict[str, float]:
        """GAP, mAP, hit@1 and PERR of the ensemble, and `objective` (a task's own metric, or one of one's own, given
        probability 0 outside the candidates), the classes outside the candidates not predicted."""
        combined = self.combined(weights)
        own = None if is_own_metric(objective) else parse_metric(objective).build(num_classes)
        with EvaluationMetrics(num_classes, GAP_TOP_K) as metrics:
            for start in range(0, combined.shape[0], _METRICS_CHUNK):
                rows, cols = torch.nonzero(self.valid[start:start + _METRICS_CHUNK], as_tuple=True)
                classes = self.classes[start:start + _METRICS_CHUNK][rows, cols]
                count = min(_METRICS_CHUNK, combined.shape[0] - start)
                scores = torch.full((count, num_classes), float("-inf"))
                scores[rows, classes] = combined[start:start + _METRICS_CHUNK][rows, cols]
                labels = torch.zeros(count, num_classes, dtype=torch.bool)
                labels[rows, classes] = self.labels[start:start + _METRICS_CHUNK][rows, cols]
                metrics.accumulate(scores.numpy(), labels.numpy())
                if own is not None:
                    own.update(scores.clamp(min=0).numpy(), labels.numpy())
            result = {**metrics.get(), **({objective: float(own.compute())} if own is not None else {})}
        return {name: round(result[name], 6) for name in dict.fromkeys([*REPORTED_METRICS, objective])}


def fit_weights(gap: Callable[[list[float]], float], count: int) -> tuple[list[float], float]:
    """Deterministic coordinate ascent over the simplex: start from the best of equal weights and each input alone,
    move `step` of weight from one input to another while `gap` (GAP, or any score to maximize) rises, halve the
    step when no move helps (from 1/2 down to 1/64). The result is never below equal weights or any single input."""
    starts = [[1.0 / count] * count] + [[float(i == j) for j in range(count)] for i in range(count)]
    best, weights = max(((gap(start), start) for start in starts), key=lambda scored: scored[0])
    step = _FIRST_STEP
    while step >= _SMALLEST_STEP:
        for _ in range(_ROUNDS_PER_STEP):
            improved = False
            for gaining, losing in itertools.permutations(range(count), 2):
                moved = min(step, weights[losing])
                if moved <= 0:
                    continue
                trial = list(weights)
                trial[gaining] += moved
                trial[losing] -= moved
                value = gap(trial)
                if value > best:
                    best, weights, improved = value, trial, True
            if not improved:
                break
        step /= 2
    return weights, best


def fit_ensemble(inputs: Sequence[Input], pattern: str, num_classes: int, *, fit_top_k: int = 100,
                 batch_size: int = 1024, num_readers: str = "auto",
                 objective: FitObjective = FitObjective()) -> dict[str, Any]:
    """Fit the weights for the best `objective` (default: the most GAP) on the labelled shards of `pattern`; returns
    the weights, each input's and the ensemble's validation metrics (the objective's among them), and equal
    weights' GAP and objective."""
    problem = objective.problem()
    if problem:
        raise ValueError(problem)
    started = time.perf_counter()
    candidates, ignored = labelled_candidates(inputs, pattern, num_classes, fit_top_k, batch_size, num_readers)
    weights, _ = fit_weights(lambda trial: objective.signed(candidates.value(trial, objective.metric, num_classes)),
                             len(inputs))
    singles = [candidates.metrics([float(i == j) for j in range(len(inputs))], num_classes, objective.metric)
               for i in range(len(inputs))]
    equal = [1.0] * len(inputs)
    result = {"fit_weights_on": pattern, "videos": int(candidates.classes.shape[0]),
              "weights": [round(weight, 6) for weight in weights], "objective": objective.metric,
              "ensemble": candidates.metrics(weights, num_classes, objective.metric),
              "equal_weights_gap": round(candidates.gap(equal), 6),
              "equal_weights_objective": round(candidates.value(equal, objective.metric, num_classes), 6),
              "inputs": [{"input": item.source, **single} for item, single in zip(inputs, singles)],
              "seconds": round(time.perf_counter() - started, 3)}
    if ignored:
        result["ignored_videos"] = ignored
    return result


def labelled_candidates(inputs: Sequence[Input], pattern: str, num_classes: int, fit_top_k: int = 100,
                        batch_size: int = 1024, num_readers: str = "auto") -> tuple[Candidates, dict[str, int]]:
    """The inputs' candidates on the labelled shards of `pattern`, and the prediction files' videos beyond them."""
    ignored = check_pattern_coverage([item for item in inputs if isinstance(item, FileInput)], pattern, num_classes,
                                     "fit_videos")
    pieces = [Candidates.of_batch(batch.probabilities, labels, fit_top_k)
              for batch in aligned_batches(inputs, pattern, num_classes, batch_size, num_readers)
              if (labels := batch.labels) is not None]  # shards give every batch its labels
    if not pieces or not any(bool(piece.labels.any()) for piece in pieces):
        raise ValueError(f"{pattern}: the shards hold no labels to fit the weights on")
    return Candidates.concat(pieces), ignored


def scored_ensemble(inputs: Sequence[Input], weights: Sequence[float], pattern: str, num_classes: int,
                    fit_top_k: int = 100, objective: str = "gap") -> dict[str, Any]:
    """GAP, mAP, hit@1 and PERR (and `objective`) of the ensemble with these weights on the labelled shards of
    `pattern` (held-out data: nothing fitted there)."""
    candidates, _ = labelled_candidates(inputs, pattern, num_classes, fit_top_k)
    return {"videos": int(candidates.classes.shape[0]), **candidates.metrics(weights, num_classes, objective)}


# The command -------------------------------------------------------------------------------------------------------

def run_ensemble(config: EnsembleConfig, num_classes_given: bool = True) -> dict[str, Any]:
    """Fit or take the weights, write the ensemble's predictions as `yt8m predict` does; returns the summary.
    Without `num_classes_given`, a train dir's or export's classes are the prediction files' too."""
    chosen, data, output = config.inputs, config.data, config.output
    if not chosen.inputs:
        raise ValueError("no inputs: give the train dirs, exports or prediction files to combine (as arguments or "
                         "--inputs)")
    problems = config_problems(config)
    if problems:
        raise ConfigError("invalid ensemble config", problems)
    with opened_inputs(chosen.inputs, chosen.num_classes, data.device, num_classes_given) as inputs:
        models = [item for item in inputs if isinstance(item, ModelInput)]
        num_classes = models[0].spec.num_classes if models else chosen.num_classes
        if models and not data.input_data_pattern:
            raise ValueError(f"--input_data_pattern is required: {models[0].source} predicts the shards it names")
        summary: dict[str, Any] = {}
        weights = list(chosen.weights) or [1.0] * len(inputs)
        if chosen.fit_weights_on:
            summary["fit"] = fit_ensemble(inputs, chosen.fit_weights_on, num_classes, fit_top_k=chosen.fit_top_k,
                                          batch_size=data.batch_size, num_readers=data.num_readers)
            weights = summary["fit"]["weights"]
        started = time.perf_counter()
        videos, ignored = _write(inputs, weights, num_classes, data, output)
    total = float(sum(weights))
    summary = {"output_file": output.output_file, "output_format": output.output_format, "videos": videos,
               "inputs": [{"input": item.source, "kind": item.kind, "weight": round(weight / total, 6)}
                          for item, weight in zip(inputs, weights)],
               **({"ignored_videos": ignored} if ignored else {}), **summary,
               "seconds": round(time.perf_counter() - started, 3)}
    log.info("wrote the ensemble's predictions of %d videos to %s", videos, output.output_file)
    return summary


def _write(inputs: Sequence[Input], weights: Sequence[float], num_classes: int, data: EnsembleDataConfig,
           output: OutputConfig) -> tuple[int, dict[str, int]]:
    files = [item for item in inputs if isinstance(item, FileInput)]
    pattern = data.input_data_pattern
    locate = None
    if pattern:
        ignored = check_pattern_coverage(files, pattern, num_classes, "output_videos")
        paths = expand_pattern(pattern)
        locate = lambda video_id: find_video(paths, video_id)  # noqa: E731
    else:
        ignored = check_coverage(files[1:], files[0].table, files[0].source)
    batches = aligned_batches(inputs, pattern, num_classes, data.batch_size, data.num_readers)
    videos = write_file_atomically(output.output_file, lambda out: write_predictions(
        lambda batch: combine(batch.probabilities, weights), batches, out, output.top_k, output.output_format,
        output.output_file, locate))
    return videos, ignored

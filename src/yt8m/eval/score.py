"""Scoring a Kaggle-format submission (`VideoId,LabelConfidencePairs`) against a ground-truth file
(`VideoId,Labels`) with the starter kit's metrics (`score_files`, what `yt8m score` prints).

A class a video's line does not list counts as not predicted (it never enters the video's top-k). Memory does not
grow with the files: they are checked into a temporary SQLite database and scored from there.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
from typing import Callable, Iterable, Iterator, Optional, Sequence, TypeVar

import numpy as np

from yt8m.config import load_yaml, read_section
from yt8m.data.format.tfrecord import expand_pattern
from yt8m.data.reading.inspection import LABELS_HEADER, find_video, shard_labels
from yt8m.data.reading.spec import FeatureSpec
from yt8m.eval.metrics import EvaluationMetrics
from yt8m.fields import quoted
from yt8m.io import storage
from yt8m.io.checkpoints import CONFIG_FILE
from yt8m.io.spill import Duplicate, KeyedTable, TemporaryDatabase, add_unique
from yt8m.tasks.labels import read_vocabulary

log = logging.getLogger("yt8m.eval.score")

PREDICTIONS_HEADER = "VideoId,LabelConfidencePairs"
SCORE_KEYS = ("gap", "map", "map_all_classes", "hit_at_one", "perr", "num_videos")
# The 2018 vocabulary's classes: what map_all_classes averages over where neither the flags nor a run nor a
# vocabulary say how many classes the data has (the starter kit's --num_classes), said in a log line.
STARTER_NUM_CLASSES = 3862
_BATCH_VIDEOS = 1024
_EXAMPLES_SHOWN = 5
T = TypeVar("T")


class CsvFormatError(ValueError):
    """A malformed line of a predictions or labels CSV; the message names the file and line."""


def _rows(path: str, header: str) -> Iterator[tuple[str, int, str, str]]:
    """(`path:line`, line number, video id, second field) for each non-blank line after the header."""
    lines = text_lines(path)
    first = next(lines, (1, ""))[1]
    if first.strip() != header:
        raise CsvFormatError(f"{path}:1: expected the header {header!r}, got {quoted(first)}")
    for number, line in lines:
        if not line.strip():
            continue
        where = f"{path}:{number}"
        fields = line.split(",")
        video_id = fields[0].strip()
        if len(fields) != 2 or not video_id:
            raise CsvFormatError(f"{where}: expected 'VideoId,<space-separated values>', got {quoted(line)}")
        yield where, number, video_id, fields[1]


def text_lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text without its line break) of each line of a UTF-8 file (a byte order mark passed over);
    bytes that are not UTF-8 are a CsvFormatError naming the file, line and byte."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            yield number, decoded(raw, f"{path}:{number}", "utf-8-sig" if number == 1 else "utf-8").rstrip("\r\n")


def decoded(raw: bytes, where: str, encoding: str = "utf-8") -> str:
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as err:
        raise CsvFormatError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start + 1} of the line: "
                             f"{quoted(raw[err.start:err.start + 4])})") from None


def _duplicate_error(path: str, duplicate: Duplicate) -> CsvFormatError:
    return CsvFormatError(f"{path}:{duplicate.line}: video {quoted(duplicate.key)} is already on line "
                          f"{duplicate.first_line}")


def _class_ids(where: str, tokens: Sequence[str], num_classes: int) -> list[int]:
    classes = _converted(where, tokens, int, "class ids must be integers")
    if classes and (min(classes) < 0 or max(classes) >= num_classes):
        outside = next(c for c in classes if not 0 <= c < num_classes)
        raise CsvFormatError(f"{where}: class id {outside} is outside [0, {num_classes})")
    return classes


def _converted(where: str, tokens: Sequence[str], convert: Callable[[str], T], rule: str) -> list[T]:
    """`convert` of each token; CsvFormatError naming `rule` and the first token it refuses."""
    try:
        return list(map(convert, tokens))
    except ValueError:
        bad = next(token for token in tokens if not _converts(convert, token))
        raise CsvFormatError(f"{where}: {rule}, got {quoted(bad)}") from None


def _converts(convert: Callable[[str], object], token: str) -> bool:
    try:
        convert(token)
    except ValueError:
        return False
    return True


def _label_ids(where: str, field: str, num_classes: int) -> np.ndarray:
    """A labels line's distinct class ids, sorted (int64)."""
    return np.array(sorted(set(_class_ids(where, field.split(), num_classes))), dtype=np.int64)


def _prediction_pairs(where: str, field: str, num_classes: int) -> tuple[list[int], list[float]]:
    """A predictions line's class ids and confidences, as listed."""
    tokens = field.split()
    if len(tokens) % 2:
        raise CsvFormatError(f"{where}: expected 'class confidence' pairs, got an odd number of values")
    classes = _class_ids(where, tokens[0::2], num_classes)
    confidences = _converted(where, tokens[1::2], float, "confidences must be numbers")
    if not all(map(math.isfinite, confidences)):
        raise CsvFormatError(f"{where}: confidences must be finite numbers")
    if len(set(classes)) != len(classes):
        raise CsvFormatError(f"{where}: a class id appears twice")
    return classes, confidences


def _read_dict(path: str, header: str, parse: Callable[[str, str, str], T]) -> dict[str, T]:
    rows = {}
    with TemporaryDatabase() as database:
        for _, video_id, parsed in _checked(KeyedTable(database, "videos"), path, header, parse):
            rows[video_id] = parsed
    return rows


def _checked(table: KeyedTable, path: str, header: str, parse: Callable[[str, str, str], T],
             payload: Callable[[T], tuple] = lambda parsed: ()) -> Iterator[tuple[int, str, T]]:
    """(line, video id, parsed second field) of each line of a CSV, checked, with `payload(parsed)` stored in `table`
    beside the id: a video twice is an error too, and the first problem in line order is the one raised."""
    parsed = ((line, video_id, parse(where, video_id, field)) for where, line, video_id, field in _rows(path, header))
    return add_unique(table, parsed, lambda row: (row[1], row[0], *payload(row[2])),
                      lambda duplicate: _duplicate_error(path, duplicate))


def read_labels_csv(path: str, num_classes: int = 3862) -> dict[str, np.ndarray]:
    """Video id -> its distinct class ids (int64, sorted; empty for a video without labels), in file order."""
    return _read_dict(path, LABELS_HEADER, lambda where, _, field: _label_ids(where, field, num_classes))


def read_predictions_csv(path: str, num_classes: int = 3862) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Video id -> (class ids int64, confidences float64) as listed on its line, in file order."""
    def parse(where: str, video_id: str, field: str) -> tuple[np.ndarray, np.ndarray]:
        classes, confidences = _prediction_pairs(where, field, num_classes)
        return np.array(classes, dtype=np.int64), np.array(confidences, dtype=np.float64)

    return _read_dict(path, PREDICTIONS_HEADER, parse)


def load_predictions_csv(table: KeyedTable, path: str, num_classes: int = 3862, probabilities: bool = False) -> None:
    """Check every line of a predictions CSV into `table` (payload columns classes, confidences: int32 and float32
    bytes), as `yt8m score` reads it: a malformed line or a video twice is an error naming the file and line; with
    `probabilities`, so is a confidence outside [0, 1] (Kaggle's scoring only ranks them, an ensemble averages)."""
    def parse(where: str, video_id: str, field: str) -> tuple[bytes, bytes]:
        classes, confidences = _prediction_pairs(where, field, num_classes)
        if probabilities:
            check_probabilities(f"{where}: video {quoted(video_id)}", confidences)
        # Scores are float32 (EvaluationMetrics compares them so): rounded here as they would be in its input.
        return np.array(classes, dtype=np.int32).tobytes(), np.array(confidences, dtype=np.float32).tobytes()

    _load(table, path, PREDICTIONS_HEADER, parse)


def check_probabilities(where: str, confidences: Sequence[float]) -> None:
    """ValueError naming `where` and the first confidence outside [0, 1]."""
    outside = next((value for value in confidences if not 0 <= value <= 1), None)
    if outside is not None:
        raise ValueError(f"{where} has confidence {outside:g}, outside [0, 1]: an ensemble input holds probabilities "
                         "(yt8m predict's output)")


def _load(table: KeyedTable, path: str, header: str, parse: Callable[[str, str, str], tuple]) -> None:
    """Check every line of a CSV into `table`: its video id, its line and the parsed second field's columns."""
    for _ in _checked(table, path, header, parse, payload=lambda columns: columns):
        pass


def _stored_labels(where: str, field: str, num_classes: int) -> tuple[bytes]:
    return (_label_ids(where, field, num_classes).astype(np.int32).tobytes(),)


def _examples(video_ids: list[str], count: int) -> str:
    return ", ".join(video_ids[:_EXAMPLES_SHOWN]) + (", ..." if count > _EXAMPLES_SHOWN else "")


def unmatched(database: TemporaryDatabase, table: str, other: str) -> tuple[int, list[str]]:
    """How many videos of `table` `other` lacks, and the first few of them in file order."""
    absent = f"FROM {table} AS t WHERE NOT EXISTS (SELECT 1 FROM {other} AS o WHERE o.key = t.key)"
    count = database.connection.execute(f"SELECT COUNT(*) {absent}").fetchone()[0]
    first = database.connection.execute(f"SELECT t.key {absent} ORDER BY t.line LIMIT {_EXAMPLES_SHOWN}")
    return count, [key for (key,) in first]


def _check_coverage(database: TemporaryDatabase, predictions_path: str, labels_path: str,
                    allow_missing: bool) -> None:
    missing, missing_examples = unmatched(database, "labels", "predictions")
    unknown, unknown_examples = unmatched(database, "predictions", "labels")
    problems = {}  # what --allow_missing does about it -> the problem
    if missing:
        problems["counted as predicting nothing"] = (f"{missing} videos of {labels_path} have no line in "
                                                     f"{predictions_path} ({_examples(missing_examples, missing)})")
    if unknown:
        problems["ignored"] = (f"{unknown} videos of {predictions_path} are not in {labels_path} "
                               f"({_examples(unknown_examples, unknown)})")
    if problems and not allow_missing:
        raise ValueError("; ".join(problems.values()) + ". With --allow_missing, missing videos count as "
                         "predicting nothing and unknown ones are ignored.")
    for consequence, problem in problems.items():
        log.warning("%s: %s", problem, consequence)


def _score_rows(rows: Iterable[tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]], num_classes: int,
                top_k: int) -> dict:
    """The metrics of (label ids, predicted classes or None, their confidences or None) rows, in batches."""
    rows = iter(rows)
    # Reused: a fresh 16 MB array per batch would be mapped afresh and page-faulted (process_settings.map_large_blocks).
    all_scores = np.empty((_BATCH_VIDEOS, num_classes), dtype=np.float32)
    all_truth = np.empty((_BATCH_VIDEOS, num_classes), dtype=np.float32)
    with EvaluationMetrics(num_classes, top_k) as metrics:
        while batch := list(itertools.islice(rows, _BATCH_VIDEOS)):
            scores, truth = all_scores[:len(batch)], all_truth[:len(batch)]
            scores.fill(-np.inf)
            truth.fill(0)
            for row, (labels, classes, confidences) in enumerate(batch):
                truth[row, labels] = 1
                if classes is not None:
                    scores[row, classes] = confidences
            metrics.accumulate(scores, truth)
        result = metrics.get()
    return {key: result[key] for key in SCORE_KEYS}


def _stored_rows(database: TemporaryDatabase) -> Iterator[tuple[np.ndarray, Optional[np.ndarray],
                                                                 Optional[np.ndarray]]]:
    """Each labelled video's label ids and predictions (None without a line), in the labels file's order."""
    joined = database.connection.execute(
        "SELECT l.classes, p.classes, p.confidences FROM labels AS l LEFT JOIN predictions AS p ON p.key = l.key "
        "ORDER BY l.line")
    for labels, classes, confidences in joined:
        yield (np.frombuffer(labels, np.int32), None if classes is None else np.frombuffer(classes, np.int32),
               None if confidences is None else np.frombuffer(confidences, np.float32))


def _load_shard_labels(table: KeyedTable, pattern: str, num_classes: int) -> None:
    """Every record's id and distinct labels into `table`, in reading order; an id in two records is an error
    naming both."""
    def duplicate_error(duplicate: Duplicate) -> ValueError:
        found = find_video(expand_pattern(pattern), duplicate.key)
        return ValueError(f"{pattern}: video {quoted(duplicate.key)} is in two records ({' and '.join(found)})")

    rows = ((video_id, number, np.unique(labels).astype(np.int32).tobytes())
            for number, (video_id, labels) in enumerate(shard_labels(pattern, num_classes), start=1))
    for _ in add_unique(table, rows, lambda row: row, duplicate_error):
        pass


def score_files(predictions_path: str, labels_path: str, *, top_k: int = 20, num_classes: int = 3862,
                allow_missing: bool = False) -> dict:
    """Read, check and score a submission against a labels CSV, or the labels of TFRecord shards (a `labels_path`
    not ending in .csv: comma-separated paths or globs); what `yt8m score` prints.

    Both go through a temporary SQLite database, so that memory does not grow with their size.
    """
    with TemporaryDatabase() as database:
        labels = KeyedTable(database, "labels", ("classes",))
        if labels_path.lower().endswith(".csv"):
            _load(labels, labels_path, LABELS_HEADER,
                  lambda where, _, field: _stored_labels(where, field, num_classes))
        else:
            _load_shard_labels(labels, labels_path, num_classes)
        if not len(labels):
            raise ValueError(f"{labels_path} lists no videos")
        predictions = KeyedTable(database, "predictions", ("classes", "confidences"))
        load_predictions_csv(predictions, predictions_path, num_classes)
        _check_coverage(database, predictions_path, labels_path, allow_missing)
        return _score_rows(_stored_rows(database), num_classes, top_k)


def score_class_count(num_classes: Optional[int], train_dir: str = "", vocabulary_file: str = "") -> int:
    """The classes a submission's class ids range over and `map_all_classes` averages over: `num_classes` given, the
    run's (`train_dir`'s config.yaml), the vocabulary's (its largest Index + 1); where none is known, 3862 (the 2018
    vocabulary's), with a log line saying so. Counts that disagree are a ValueError naming them."""
    known = {}
    if num_classes is not None:
        known["--num_classes"] = num_classes
    if train_dir:
        known[f"--train_dir {train_dir}"] = run_class_count(train_dir)
    if vocabulary_file:
        indices = read_vocabulary(vocabulary_file, [], "--vocabulary_file")
        if not indices:
            raise ValueError(f"--vocabulary_file {vocabulary_file} lists no classes")
        known[f"--vocabulary_file {vocabulary_file}"] = max(indices) + 1
    if len(set(known.values())) > 1:
        raise ValueError("the class counts disagree: " + ", ".join(f"{source} has {count}"
                                                                  for source, count in known.items()))
    if known:
        return next(iter(known.values()))
    log.info("scoring over %d classes, the 2018 vocabulary's (map_all_classes averages over them): no --num_classes, "
             "--train_dir or --vocabulary_file gives the data's", STARTER_NUM_CLASSES)
    return STARTER_NUM_CLASSES


def run_class_count(train_dir: str) -> int:
    """The classes of the run in `train_dir` (its config.yaml's --num_classes)."""
    path = os.path.join(train_dir, CONFIG_FILE)
    if not storage.exists(path):
        raise FileNotFoundError(f"--train_dir {train_dir} is not a yt8m train dir (no {CONFIG_FILE})")
    return read_section(load_yaml(path), "features", FeatureSpec, path).num_classes

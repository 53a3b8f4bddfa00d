"""`yt8m score`: score a Kaggle-format submission (`VideoId,LabelConfidencePairs`) against a ground-truth
file (`VideoId,Labels`) with the starter kit's metrics; prints one JSON object.

A class a video's line does not list counts as not predicted (it never enters the video's top-k).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from typing import Iterator, Sequence

import numpy as np

from yt8m.metrics import EvaluationMetrics

log = logging.getLogger("yt8m.score")

PREDICTIONS_HEADER = "VideoId,LabelConfidencePairs"
LABELS_HEADER = "VideoId,Labels"
SCORE_KEYS = ("gap", "map", "map_all_classes", "hit_at_one", "perr", "num_videos")
_BATCH_VIDEOS = 1024
_EXAMPLES_SHOWN = 5


class CsvFormatError(ValueError):
    """A malformed line of a predictions or labels CSV; the message names the file and line."""


def _rows(path: str, header: str) -> Iterator[tuple[str, str, str]]:
    """(`path:line`, video id, second field) for each non-blank line after the header."""
    with open(path, encoding="utf-8-sig") as fh:
        first = fh.readline().rstrip("\r\n")
        if first.strip() != header:
            raise CsvFormatError(f"{path}:1: expected the header {header!r}, got {first!r}")
        first_line_of: dict[str, int] = {}
        for number, line in enumerate(fh, start=2):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            where = f"{path}:{number}"
            fields = line.split(",")
            video_id = fields[0].strip()
            if len(fields) != 2 or not video_id:
                raise CsvFormatError(f"{where}: expected 'VideoId,<space-separated values>', got {line!r}")
            if video_id in first_line_of:
                raise CsvFormatError(f"{where}: video {video_id!r} is already on line {first_line_of[video_id]}")
            first_line_of[video_id] = number
            yield where, video_id, fields[1]


def _class_ids(where: str, tokens: Sequence[str], num_classes: int) -> np.ndarray:
    try:
        classes = np.array([int(token) for token in tokens], dtype=np.int64)
    except ValueError:
        raise CsvFormatError(f"{where}: class ids must be integers, got {' '.join(tokens)!r}") from None
    outside = classes[(classes < 0) | (classes >= num_classes)]
    if len(outside):
        raise CsvFormatError(f"{where}: class id {outside[0]} is outside [0, {num_classes})")
    return classes


def read_labels_csv(path: str, num_classes: int = 3862) -> dict[str, np.ndarray]:
    """Video id -> its distinct class ids (int64, sorted; empty for a video without labels), in file order."""
    return {video_id: np.unique(_class_ids(where, field.split(), num_classes))
            for where, video_id, field in _rows(path, LABELS_HEADER)}


def read_predictions_csv(path: str, num_classes: int = 3862) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Video id -> (class ids int64, confidences float64) as listed on its line, in file order."""
    predictions = {}
    for where, video_id, field in _rows(path, PREDICTIONS_HEADER):
        tokens = field.split()
        if len(tokens) % 2:
            raise CsvFormatError(f"{where}: expected 'class confidence' pairs, got an odd number of values")
        classes = _class_ids(where, tokens[0::2], num_classes)
        try:
            confidences = np.array([float(token) for token in tokens[1::2]], dtype=np.float64)
        except ValueError:
            raise CsvFormatError(f"{where}: confidences must be numbers, got {' '.join(tokens[1::2])!r}") from None
        if not all(math.isfinite(value) for value in confidences):
            raise CsvFormatError(f"{where}: confidences must be finite numbers")
        if len(np.unique(classes)) != len(classes):
            raise CsvFormatError(f"{where}: a class id appears twice")
        predictions[video_id] = (classes, confidences)
    return predictions


def _examples(video_ids: list[str]) -> str:
    shown = ", ".join(video_ids[:_EXAMPLES_SHOWN])
    return shown + (", ..." if len(video_ids) > _EXAMPLES_SHOWN else "")


def _check_coverage(predictions: dict, labels: dict, predictions_path: str, labels_path: str,
                    allow_missing: bool) -> None:
    missing = [video_id for video_id in labels if video_id not in predictions]
    unknown = [video_id for video_id in predictions if video_id not in labels]
    problems = {}  # what --allow_missing does about it -> the problem
    if missing:
        problems["counted as predicting nothing"] = (
            f"{len(missing)} videos of {labels_path} have no line in {predictions_path} ({_examples(missing)})")
    if unknown:
        problems["ignored"] = (
            f"{len(unknown)} videos of {predictions_path} are not in {labels_path} ({_examples(unknown)})")
    if problems and not allow_missing:
        raise ValueError("; ".join(problems.values()) + ". With --allow_missing, missing videos count as "
                         "predicting nothing and unknown ones are ignored.")
    for consequence, problem in problems.items():
        log.warning("%s: %s", problem, consequence)


def score_predictions(predictions: dict[str, tuple[np.ndarray, np.ndarray]], labels: dict[str, np.ndarray],
                      num_classes: int = 3862, top_k: int = 20) -> dict:
    """The metrics over the labelled videos; a video without predictions predicts nothing."""
    metrics = EvaluationMetrics(num_classes, top_k)
    video_ids = list(labels)
    for start in range(0, len(video_ids), _BATCH_VIDEOS):
        batch = video_ids[start:start + _BATCH_VIDEOS]
        scores = np.full((len(batch), num_classes), -np.inf, dtype=np.float32)
        truth = np.zeros((len(batch), num_classes), dtype=np.float32)
        for row, video_id in enumerate(batch):
            truth[row, labels[video_id]] = 1
            if video_id in predictions:
                classes, confidences = predictions[video_id]
                scores[row, classes] = confidences
        metrics.accumulate(scores, truth)
    result = metrics.get()
    return {key: result[key] for key in SCORE_KEYS}


def score_files(predictions_path: str, labels_path: str, *, top_k: int = 20, num_classes: int = 3862,
                allow_missing: bool = False) -> dict:
    """Read, check and score a submission against a labels file (what `yt8m score` prints)."""
    labels = read_labels_csv(labels_path, num_classes)
    if not labels:
        raise ValueError(f"{labels_path} lists no videos")
    predictions = read_predictions_csv(predictions_path, num_classes)
    _check_coverage(predictions, labels, predictions_path, labels_path, allow_missing)
    return score_predictions(predictions, labels, num_classes, top_k)


def main(argv: Sequence[str]) -> int:
    from yt8m.runtime import setup_logging

    parser = argparse.ArgumentParser(prog="yt8m score", description=__doc__.splitlines()[0])
    parser.add_argument("--predictions", required=True, help="Kaggle CSV: VideoId,LabelConfidencePairs.")
    parser.add_argument("--labels", required=True, help="Ground truth CSV: VideoId,Labels (space-separated).")
    parser.add_argument("--top_k", type=int, default=20, help="Predictions per video that count (default: 20).")
    parser.add_argument("--num_classes", type=int, default=3862, help="Number of classes (default: 3862).")
    parser.add_argument("--allow_missing", action="store_true",
                        help="Score labelled videos without predictions as predicting nothing and ignore "
                             "predictions for unknown videos (with a warning) instead of failing.")
    args = parser.parse_args(argv)
    setup_logging()
    result = score_files(args.predictions, args.labels, top_k=args.top_k, num_classes=args.num_classes,
                         allow_missing=args.allow_missing)
    print(json.dumps(result))
    return 0

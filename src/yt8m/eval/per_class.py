"""Which classes are hard (`yt8m eval --per_class FILE`): each class's AP and positives on the evaluation shards, how
often it was trained on, its name and vertical, as a CSV; with the plots extra, AP against training frequency and by
vertical beside it."""

from __future__ import annotations

import csv
import logging
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from yt8m.config import load_yaml, read_section
from yt8m.data.reading.inspection import shard_labels
from yt8m.data.reading.spec import DataConfig
from yt8m.eval.config import ReportConfig
from yt8m.eval.figures import png_bytes, pyplot
from yt8m.io.checkpoints import CONFIG_FILE
from yt8m.io.files import atomic_writer, write_file_atomically
from yt8m.optional import available
from yt8m.tasks.labels import read_vocabulary
from yt8m.tasks.spec import TasksConfig

log = logging.getLogger("yt8m.eval")

COLUMNS = ("class", "name", "vertical", "ap", "positives", "train_videos")
VOCABULARY_COLUMNS = ("Name", "Vertical1")
TRAIN_COUNT_COLUMN = "TrainVideoCount"
MISSING_VERTICAL = "(no vertical)"


@dataclass(frozen=True)
class ClassTable:
    """Each class of a checkpoint's evaluation as a row (COLUMNS: its AP as text, empty without positives), and where
    its training videos were counted."""

    rows: list[dict]
    train_videos_from: str

    def scored(self) -> list[dict]:
        """The rows of the classes with positives on the evaluation shards (those with an AP)."""
        return [row for row in self.rows if row["positives"]]


def class_table(report: ReportConfig, train_dir: str, per_class: dict[str, np.ndarray]) -> ClassTable:
    """The rows of the per-class CSV: each class's AP and positives (`per_class`, EvaluationMetrics.per_class()),
    name and vertical (--vocabulary_file, default the train dir's) and training videos."""
    path = os.path.join(train_dir, CONFIG_FILE)
    document = load_yaml(path)
    vocabulary_file = report.vocabulary_file or read_section(document, "tasks", TasksConfig, path).vocabulary_file
    vocabulary = _vocabulary(vocabulary_file)
    train_pattern = read_section(document, "data", DataConfig, path).train_data_pattern
    train_videos, counted_from = _train_videos(vocabulary, vocabulary_file, train_pattern, len(per_class["ap"]))
    rows = [_row(index, vocabulary.get(index, {}), per_class, train_videos) for index in range(len(per_class["ap"]))]
    return ClassTable(rows, counted_from)


def write_per_class(path: str, table: ClassTable) -> dict[str, Any]:
    """Write the per-class CSV (and its plots) of a checkpoint's evaluation to `path`; returns where, and how the
    training frequency was found, for the command's JSON."""
    write_file_atomically(path, lambda out: _write_csv(table.rows, out))
    log.info("wrote the AP of %d classes to %s (training videos from %s)", len(table.rows), path,
             table.train_videos_from)
    return {"file": path, "train_videos_from": table.train_videos_from, "plots": _plots(table.scored(), path)}


def _vocabulary(path: str) -> dict[int, dict[str, str]]:
    if not path:
        return {}
    with open(path, newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh), [])
    columns = [name for name in (*VOCABULARY_COLUMNS, TRAIN_COUNT_COLUMN) if name in header]
    return read_vocabulary(path, columns, "--vocabulary_file")


def _train_videos(vocabulary: dict[int, dict[str, str]], vocabulary_file: str, train_pattern: str,
                  num_classes: int) -> tuple[np.ndarray, str]:
    """Each class's training videos: the vocabulary's TrainVideoCount where it has one, else counted in the run's
    training shards (labels only, features not read)."""
    if any(TRAIN_COUNT_COLUMN in row for row in vocabulary.values()):
        listed = [int(vocabulary.get(index, {}).get(TRAIN_COUNT_COLUMN) or 0) for index in range(num_classes)]
        return np.array(listed, np.int64), f"{vocabulary_file} ({TRAIN_COUNT_COLUMN})"
    counts = np.zeros(num_classes, np.int64)
    for _, labels in shard_labels(train_pattern, num_classes):
        counts[np.unique(labels)] += 1
    return counts, train_pattern


def _row(index: int, entry: dict[str, str], per_class: dict[str, np.ndarray], train_videos: np.ndarray) -> dict:
    positives = int(per_class["positives"][index])
    return {"class": index, "name": entry.get("Name", ""), "vertical": entry.get("Vertical1", ""),
            "ap": f"{per_class['ap'][index]:.6f}" if positives else "", "positives": positives,
            "train_videos": int(train_videos[index])}


def _write_csv(rows: list[dict], out: TextIO) -> None:
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


def _plots(scored: list[dict], csv_path: str) -> dict[str, str]:
    """AP against training frequency, and AP by vertical, as PNGs beside the CSV (the plots extra)."""
    if not scored or not available("plots", "the per-class plots are not drawn"):
        return {}
    plt = pyplot()
    stem = os.path.splitext(csv_path)[0]
    paths = {"ap_vs_train_videos": f"{stem}_ap_vs_train_videos.png", "ap_by_vertical": f"{stem}_ap_by_vertical.png"}
    for name, figure in ap_figures(plt, scored).items():
        with atomic_writer(paths[name], binary=True) as out:
            out.write(png_bytes(plt, figure))
    return paths


def ap_figures(plt: Any, scored: list[dict]) -> dict[str, Any]:
    """The per-class figures of the rows with positives (ClassTable.scored): "ap_vs_train_videos" (AP against
    training frequency) and "ap_by_vertical"."""
    return {"ap_vs_train_videos": _frequency_figure(plt, scored), "ap_by_vertical": _vertical_figure(plt, scored)}


def _frequency_figure(plt: Any, rows: list[dict]) -> Any:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    axes.scatter([max(row["train_videos"], 1) for row in rows], [float(row["ap"]) for row in rows], s=8, alpha=0.5)
    axes.set_xscale("log")
    axes.set(xlabel="training videos of the class (log; 0 drawn at 1)", ylabel="AP on the evaluation shards",
             title=f"AP against training frequency ({len(rows)} classes with positives)")
    return figure


def _vertical_figure(plt: Any, rows: list[dict]) -> Any:
    by_vertical: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        by_vertical[row["vertical"] or MISSING_VERTICAL].append(float(row["ap"]))
    ordered = sorted(by_vertical, key=lambda name: np.median(by_vertical[name]))
    figure, axes = plt.subplots(figsize=(7, 0.3 * len(ordered) + 1.5))
    for position, name in enumerate(ordered):  # each class a dot, the vertical's median a bar
        aps = by_vertical[name]
        axes.scatter(aps, [position] * len(aps), s=8, alpha=0.5, color="tab:blue")
        axes.plot([np.median(aps)] * 2, [position - 0.35, position + 0.35], color="tab:red")
    axes.set_yticks(range(len(ordered)))
    axes.set_yticklabels([f"{name} ({len(by_vertical[name])})" for name in ordered])
    axes.set(xlabel="AP on the evaluation shards (red: the vertical's median)",
             title="AP by vertical (classes with positives)")
    return figure

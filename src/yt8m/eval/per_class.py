"""Which classes are hard (`yt8m eval --per_class FILE`): each class's AP and positives on the evaluation shards, how
often it was trained on, its name and vertical, as a CSV; with the plots extra, AP against training frequency and by
vertical beside it."""

from __future__ import annotations

import csv
import io
import logging
import os
from collections import defaultdict
from typing import Any, TextIO

import numpy as np

from yt8m.config import load_yaml, read_section
from yt8m.data.inspection import shard_labels
from yt8m.data.spec import DataConfig
from yt8m.eval.config import ReportConfig
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


def write_per_class(report: ReportConfig, train_dir: str, per_class: dict[str, np.ndarray]) -> dict[str, Any]:
    """Write the per-class CSV (and its plots) of a checkpoint's evaluation; returns where, and how the training
    frequency was found, for the command's JSON."""
    path = os.path.join(train_dir, CONFIG_FILE)
    document = load_yaml(path)
    vocabulary_file = report.vocabulary_file or read_section(document, "tasks", TasksConfig, path).vocabulary_file
    vocabulary = _vocabulary(vocabulary_file)
    train_pattern = read_section(document, "data", DataConfig, path).train_data_pattern
    train_videos, counted_from = _train_videos(vocabulary, vocabulary_file, train_pattern, len(per_class["ap"]))
    rows = [_row(index, vocabulary.get(index, {}), per_class, train_videos) for index in range(len(per_class["ap"]))]
    write_file_atomically(report.per_class, lambda out: _write_csv(rows, out))
    log.info("wrote the AP of %d classes to %s (training videos from %s)", len(rows), report.per_class, counted_from)
    return {"file": report.per_class, "train_videos_from": counted_from, "plots": _plots(rows, report.per_class)}


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


def _plots(rows: list[dict], csv_path: str) -> dict[str, str]:
    """AP against training frequency, and AP by vertical, as PNGs beside the CSV (the plots extra)."""
    scored = [row for row in rows if row["positives"]]
    if not scored or not available("plots", "the per-class plots are not drawn"):
        return {}
    import matplotlib  # the plots extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # the plots extra

    stem = os.path.splitext(csv_path)[0]
    paths = {"ap_vs_train_videos": f"{stem}_ap_vs_train_videos.png", "ap_by_vertical": f"{stem}_ap_by_vertical.png"}
    _save(plt, _frequency_figure(plt, scored), paths["ap_vs_train_videos"])
    _save(plt, _vertical_figure(plt, scored), paths["ap_by_vertical"])
    return paths


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


def _save(plt: Any, figure: Any, path: str) -> None:
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    with atomic_writer(path, binary=True) as out:
        out.write(png.getvalue())

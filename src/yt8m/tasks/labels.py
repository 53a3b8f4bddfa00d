"""Label sources of tasks besides the record's own labels: a vocabulary column (e.g. Vertical1 of the YouTube-8M
vocabulary.csv) maps each entity class to one class of the task, so a video's task labels are its entities' values.
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
import torch

from yt8m.data.reading.batch import Batch
from yt8m.tasks.base import Output


@dataclass
class VocabularyMapping:
    """Entity class i maps to task class `targets[i]`; the task's classes are the column's values, sorted."""

    class_names: list[str]
    targets: torch.Tensor  # int64 [entity classes]

    def __call__(self, labels: torch.Tensor) -> torch.Tensor:
        """Multi-hot entity labels [batch, entities] (bool or float) as multi-hot task labels [batch, classes]:
        a task class is present where any of its entities is."""
        mapped = torch.zeros(labels.shape[0], len(self.class_names), dtype=torch.bool, device=labels.device)
        rows, entities = labels.nonzero(as_tuple=True)
        mapped[rows, self.targets.to(labels.device)[entities]] = True
        return mapped


def read_vocabulary(path: str, columns: Sequence[str], where: str) -> dict[int, dict[str, str]]:
    """Class index -> {column: value} of the vocabulary CSV at `path` (the 2018 vocabulary.csv: rows in any order,
    looked up by their Index); a ValueError naming `where`, the file and a missing column or a bad Index."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing_columns = [name for name in ("Index", *columns) if name not in header]
            if missing_columns:
                raise ValueError(f"{where}: vocabulary_file {path} has no column {' or '.join(missing_columns)} "
                                 f"(columns: {', '.join(header)})")
            rows = {}
            for line, row in enumerate(reader, start=2):
                try:
                    rows[int(row["Index"])] = {column: (row[column] or "").strip() for column in columns}
                except (TypeError, ValueError):
                    raise ValueError(f"{where}: vocabulary_file {path}, row {line}: Index {row['Index']!r} is not "
                                     "a class index") from None
    except OSError as err:
        raise ValueError(f"{where}: vocabulary_file {path} cannot be read: {err}") from None
    return rows


def read_vocabulary_mapping(path: str, column: str, entity_classes: int, where: str) -> VocabularyMapping:
    """The mapping of `column` of the vocabulary CSV at `path` (rows looked up by their Index) for entity classes
    0..entity_classes-1; a ValueError naming `where` (the task), the file and the classes it misses."""
    values = {index: row[column] for index, row in read_vocabulary(path, [column], where).items()}
    missing = [index for index in range(entity_classes) if not values.get(index)]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise ValueError(f"{where}: vocabulary_file {path} maps no {column} for {len(missing)} of the "
                         f"{entity_classes} label classes: {shown}")
    names = sorted({values[index] for index in range(entity_classes)})
    position = {name: target for target, name in enumerate(names)}
    targets = torch.tensor([position[values[index]] for index in range(entity_classes)], dtype=torch.int64)
    return VocabularyMapping(names, targets)


class LabelMappedTask:
    """A task (yt8m.tasks.video) on labels mapped from the record's (`mapping`, e.g. a VocabularyMapping): it sees each
    batch with its "labels" mapped, and is otherwise the task it wraps."""

    def __init__(self, task: Any, mapping: Callable[[torch.Tensor], torch.Tensor]):
        self.task, self.mapping = task, mapping
        self.metric_names, self.num_classes = task.metric_names, task.num_classes
        self.reads_segments = task.reads_segments

    def mapped(self, batch: Batch) -> Batch:
        return dataclasses.replace(batch, labels=self.mapping(batch.labels))

    def loss(self, output: Output, batch: Batch) -> torch.Tensor:
        return self.task.loss(output, self.mapped(batch))

    def metrics(self) -> ContextManager:
        return self.task.metrics()

    def accumulate(self, metrics: Any, predictions: np.ndarray, batch: Batch, loss: float) -> None:
        self.task.accumulate(metrics, predictions, self.mapped(batch), loss)

    def results(self, metrics: Any, source: str) -> dict[str, Any]:
        return self.task.results(metrics, source)

    def batch_metrics(self, predictions: torch.Tensor, batch: Batch) -> dict[str, float]:
        return self.task.batch_metrics(predictions, self.mapped(batch))

    def judged(self) -> "LabelMappedTask":
        return self

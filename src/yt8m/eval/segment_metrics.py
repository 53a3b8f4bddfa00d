"""The 2019 segment task's metrics over rated (segment, class) pairs: mAP@K over classes and the pooled GAP,
accumulated batch by batch from dense [segments, classes] matrices in which only rated entries count.

Definitions (a rated pair: an entry whose label weight is > 0; its label 1 (present) or 0 (absent)):
  segment_map  per class, its rated pairs ranked by predicted score (best first), the first K kept (K = top_n);
               AP = sum over the positives among them of precision@rank, divided by min(positives, K)
               (the starter kit's `ap_at_n`: a perfect ranking scores 1; positives past K count as missed);
               mean over the classes with at least one positive rated pair: a class with only negative
               (or no) rated pairs is left out, as the starter kit's MeanAveragePrecisionCalculator
               (filter_empty_classes) leaves it out.
  gap          every rated pair of every class in one ranking by score; AP = sum over positives of
               precision@rank divided by the number of positives (yt8m.eval.metrics' GAP, no top-k cut).

Ties (the starter kit shuffles them): equal scores keep arrival order, batch by batch, then row-major within a
batch (segment, then class), as yt8m.eval.metrics does. Scores are compared as float32; NaN is an error.
Memory is O(rated pairs): 9 bytes per pair.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import numpy as np

from yt8m.eval.metrics import descending_key
from yt8m.fields import setting

_CLASS_SHIFT = np.uint64(32)
# K of the 2019 competition's mAP@K: the segments a submission lists per class (its --segment_max_pred too).
DEFAULT_TOP_N = 100_000


def top_n_setting() -> Any:
    """The `top_n` setting of train's validation and of eval: K of the segment mAP@K."""
    return setting(DEFAULT_TOP_N, "With --segment_labels: K of the segment mAP@K, the segments ranked per class that "
                                  "count.", at_least=1)


def average_precisions(classes: np.ndarray, labels: np.ndarray, num_positives: np.ndarray,
                       top_n: int) -> np.ndarray:
    """Per-class AP@top_n (float64 [num_classes]) of rated pairs grouped by class, each class's in rank order.

    `classes` int (equal classes contiguous), `labels` bool, `num_positives` every class's positive rated pairs
    (those not listed too). A class without positives gets 0.
    """
    starts_group = np.ones(len(classes), dtype=bool)
    starts_group[1:] = classes[1:] != classes[:-1]
    group_starts = np.flatnonzero(starts_group)
    group_of = np.cumsum(starts_group) - 1
    rank = np.arange(len(classes)) - group_starts[group_of]  # 0-based within the class
    hits = np.cumsum(labels)
    hits_before_group = (hits - labels)[group_starts]
    counted = labels & (rank < top_n)
    precisions = (hits[counted] - hits_before_group[group_of[counted]]) / (rank[counted] + 1)
    sums = np.bincount(classes[counted], weights=precisions, minlength=len(num_positives))
    denominators = np.minimum(num_positives, top_n)
    return np.divide(sums, denominators, out=np.zeros(len(num_positives)), where=denominators > 0)


def mean_over_positive_classes(class_ap: np.ndarray, num_positives: np.ndarray) -> float:
    """The mean AP over the classes with at least one positive rated pair (0.0 when there are none)."""
    present = num_positives > 0
    return float(class_ap[present].mean()) if present.any() else 0.0


class SegmentMetrics:
    """Segment-level metrics over rated (segment, class) pairs, accumulated batch by batch."""

    def __init__(self, num_classes: int, top_n: int = DEFAULT_TOP_N):
        if int(num_classes) < 1 or int(top_n) < 1:
            raise ValueError(f"num_classes ({num_classes}) and top_n ({top_n}) must be positive")
        self.num_classes = int(num_classes)
        self.top_n = int(top_n)
        self.clear()

    def clear(self) -> None:
        """Forget everything accumulated."""
        self._scores: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._classes: list[np.ndarray] = []
        self._sum_loss = 0.0
        self._num_segments = 0

    def accumulate(self, predictions: np.ndarray, labels: np.ndarray, label_weights: np.ndarray,
                   loss: float = 0.0) -> None:
        """Add a batch: [segments, num_classes] scores, labels (1 present, 0 absent) and label weights (> 0 marks
        a rated pair; other entries are ignored); `loss` is the batch's mean loss."""
        shape = np.shape(predictions)
        if len(shape) != 2 or shape[1] != self.num_classes or np.shape(labels) != shape \
                or np.shape(label_weights) != shape:
            raise ValueError(f"predictions {shape}, labels {np.shape(labels)} and label_weights "
                             f"{np.shape(label_weights)} must all be [segments, {self.num_classes}]")
        rows, classes = np.nonzero(np.asarray(label_weights) > 0)
        scores = np.asarray(predictions, dtype=np.float32)[rows, classes]
        rated_labels = np.asarray(labels)[rows, classes]
        if np.isnan(scores).any():
            raise ValueError("predictions of rated pairs contain NaN")
        not_binary = np.flatnonzero((rated_labels != 0) & (rated_labels != 1))
        if len(not_binary):
            first = not_binary[0]
            raise ValueError(f"labels of rated pairs must be 0 or 1, found {rated_labels[first]} at segment "
                             f"{rows[first]}, class {classes[first]} of the batch")
        self._scores.append(scores)
        self._labels.append(rated_labels == 1)
        self._classes.append(classes.astype(np.int32))
        self._sum_loss += float(loss) * shape[0]
        self._num_segments += shape[0]

    def totals(self) -> dict:
        """What was accumulated besides the rated pairs (for `extend`)."""
        return {"sum_loss": self._sum_loss, "num_segments": self._num_segments}

    def pooled_blocks(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The rated pairs in arrival order as (scores, labels, classes), a batch at a time (for `extend`)."""
        return zip(self._scores, self._labels, self._classes)

    def extend(self, totals: dict, pooled_blocks: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """Add another accumulator's segments (its `totals()` and `pooled_blocks()`) as if its batches were
        accumulated now: `get()` then gives what one accumulator fed both inputs in turn gives."""
        for scores, labels, classes in pooled_blocks:
            self._scores.append(scores)
            self._labels.append(labels)
            self._classes.append(classes)
        self._sum_loss += totals["sum_loss"]
        self._num_segments += totals["num_segments"]

    def get(self) -> dict:
        """segment_map, gap, loss (mean over segments), num_segments, num_rated_pairs, num_positive_pairs and
        num_classes_with_positives."""
        if self._num_segments == 0:
            raise ValueError("no segments were accumulated")
        scores = np.concatenate(self._scores)
        labels = np.concatenate(self._labels)
        classes = np.concatenate(self._classes)
        score_keys = descending_key(scores)
        ranked_labels = labels[np.argsort(score_keys, kind="stable")]
        num_positives = np.bincount(classes[labels], minlength=self.num_classes)
        by_class = np.argsort((classes.astype(np.uint64) << _CLASS_SHIFT) | score_keys, kind="stable")
        class_ap = average_precisions(classes[by_class], labels[by_class], num_positives, self.top_n)
        return {
            "segment_map": mean_over_positive_classes(class_ap, num_positives),
            "gap": float(average_precisions(np.zeros(len(labels), np.int64), ranked_labels,
                                            np.array([labels.sum()]), max(len(labels), 1))[0]),
            "loss": self._sum_loss / self._num_segments,
            "num_segments": self._num_segments,
            "num_rated_pairs": len(labels),
            "num_positive_pairs": int(labels.sum()),
            "num_classes_with_positives": int((num_positives > 0).sum()),
        }

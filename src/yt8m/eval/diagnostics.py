"""What the evaluation report (`yt8m eval --report`) shows beyond the metrics, streamed over the evaluation's batches
in memory that does not grow with the videos:

  Confusions   which classes a model mistakes for which: for each video and each class c it is labelled with, the
               class the model ranks highest among those the video is not labelled with (its strongest false
               positive; ties to the lowest class index, as Hit@1's) counts once for the pair (c, that class).
               A sparse count: only the pairs seen are held (16 bytes each), at most min(classes², labels seen),
               and the pairs of batches not yet added in (8 bytes each), at most about max(COMPACT_AFTER, pairs
               held) before they are.
  Calibration  how far the predicted probabilities are from the rate of positives they meet: every (video, class)
               pair falls in the bin floor(p * bins) of its probability p (clipped to [0, 1], the top bin closed),
               and each bin counts its pairs, its positives and the sum of their probabilities (3 * bins numbers).
               The expected calibration error (ECE) is the pair-weighted mean of |positive rate - mean probability|
               over the bins.

Both merge (`merge`) what another process accumulated, for eval under torchrun.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Pairs of (true, confused) classes buffered before they are added into the sorted count (bounds the buffer).
COMPACT_AFTER = 1 << 20
DEFAULT_BINS = 20
# Rows of a batch binned at a time: bounds the float64 temporaries of the calibration's binning.
_CALIBRATION_ROWS = 256


def _matrices(predictions: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(predictions, dtype=np.float32)
    positive = np.asarray(labels) > 0
    if scores.ndim != 2 or positive.shape != scores.shape:
        raise ValueError(f"predictions {scores.shape} and labels {positive.shape} must be equal [videos, classes] "
                         "matrices")
    return scores, positive


class Confusions:
    """Counts of (true class, the highest-ranked class the video is not labelled with) over the videos, sparse."""

    def __init__(self, num_classes: int, compact_after: int = COMPACT_AFTER):
        self.num_classes = int(num_classes)
        self.compact_after = int(compact_after)
        self._keys = np.empty(0, np.int64)  # true * num_classes + confused, ascending
        self._counts = np.empty(0, np.int64)
        self._buffer: list[np.ndarray] = []
        self._buffered = 0

    def update(self, predictions: np.ndarray, labels: np.ndarray) -> None:
        """Add a batch: scores and 0/1 labels, both [videos, num_classes]."""
        scores, positive = _matrices(predictions, labels)
        if scores.shape[1] != self.num_classes:
            raise ValueError(f"predictions have {scores.shape[1]} classes, expected {self.num_classes}")
        masked = np.where(positive, np.float32(-np.inf), scores)
        confused = masked.argmax(axis=1)  # the first of equal maxima: the lowest class index
        # A video with no labels, or whose every unlabelled class scores -inf (not predicted), adds nothing.
        counted = positive.any(axis=1) & (masked[np.arange(len(masked)), confused] > -np.inf)
        rows, true = np.nonzero(positive & counted[:, None])
        if not len(rows):
            return
        self._buffer.append(true.astype(np.int64) * self.num_classes + confused[rows])
        self._buffered += len(rows)
        if self._buffered >= max(self.compact_after, len(self._keys)):
            self._compact()

    def _compact(self) -> None:
        if not self._buffer:
            return
        keys, counts = np.unique(np.concatenate(self._buffer), return_counts=True)
        self._add(keys, counts.astype(np.int64))
        self._buffer, self._buffered = [], 0

    def _add(self, keys: np.ndarray, counts: np.ndarray) -> None:
        merged, where = np.unique(np.concatenate([self._keys, keys]), return_inverse=True)
        totals = np.zeros(len(merged), np.int64)
        np.add.at(totals, where, np.concatenate([self._counts, counts]))
        self._keys, self._counts = merged, totals

    def merge(self, other: "Confusions") -> None:
        """Add another accumulator's counts (another process's videos)."""
        other._compact()
        self._compact()
        self._add(other._keys, other._counts)

    def pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(true classes, confused classes, counts) of every pair seen, ordered by true then confused class."""
        self._compact()
        return self._keys // self.num_classes, self._keys % self.num_classes, self._counts.copy()

    def most_confused(self, true_class: int, count: int) -> list[tuple[int, int]]:
        """The `count` classes most often ranked highest among the unlabelled ones of the videos labelled
        `true_class`, as (class, videos), most first (ties: lower class first)."""
        self._compact()
        start, end = np.searchsorted(self._keys, [true_class * self.num_classes,
                                                  (true_class + 1) * self.num_classes])
        classes, counts = self._keys[start:end] % self.num_classes, self._counts[start:end]
        order = np.lexsort((classes, -counts))[:count]
        return [(int(classes[i]), int(counts[i])) for i in order]

    def __getstate__(self) -> dict[str, Any]:
        self._compact()
        return dict(self.__dict__)


class Calibration:
    """Streaming reliability histogram: per probability bin, its (video, class) pairs, positives and probability
    sum."""

    def __init__(self, bins: int = DEFAULT_BINS):
        if int(bins) < 1:
            raise ValueError(f"bins must be positive, got {bins}")
        self.bins = int(bins)
        self.counts = np.zeros(self.bins, np.int64)
        self.positives = np.zeros(self.bins, np.int64)
        self.probability_sums = np.zeros(self.bins, np.float64)

    def update(self, predictions: np.ndarray, labels: np.ndarray) -> None:
        """Add a batch: probabilities and 0/1 labels, both [videos, classes]."""
        scores, positive = _matrices(predictions, labels)
        for start in range(0, len(scores), _CALIBRATION_ROWS):
            probabilities = np.clip(scores[start:start + _CALIBRATION_ROWS].astype(np.float64), 0.0, 1.0).ravel()
            index = self.bin_of(probabilities)
            self.counts += np.bincount(index, minlength=self.bins)
            self.positives += np.bincount(index[positive[start:start + _CALIBRATION_ROWS].ravel()],
                                          minlength=self.bins)
            self.probability_sums += np.bincount(index, weights=probabilities, minlength=self.bins)

    def bin_of(self, probabilities: np.ndarray) -> np.ndarray:
        """The bin of each probability in [0, 1]: floor(p * bins), 1 in the top bin."""
        return np.minimum((probabilities * self.bins).astype(np.int64), self.bins - 1)

    def merge(self, other: "Calibration") -> None:
        if other.bins != self.bins:
            raise ValueError(f"cannot merge {other.bins} calibration bins into {self.bins}")
        self.counts += other.counts
        self.positives += other.positives
        self.probability_sums += other.probability_sums

    def table(self) -> list[dict[str, Any]]:
        """Each bin: its probability range, pairs, positives, positive rate and mean probability (None when empty)."""
        rows = []
        for index in range(self.bins):
            count = int(self.counts[index])
            rows.append({"low": index / self.bins, "high": (index + 1) / self.bins, "pairs": count,
                         "positives": int(self.positives[index]),
                         "positive_rate": self.positives[index] / count if count else None,
                         "mean_probability": self.probability_sums[index] / count if count else None})
        return rows

    def expected_calibration_error(self) -> float:
        """Sum over bins of (pairs in bin / all pairs) * |positive rate - mean probability|; 0 without pairs."""
        total = int(self.counts.sum())
        if not total:
            return 0.0
        filled = self.counts > 0
        gaps = np.abs(self.positives[filled] - self.probability_sums[filled])  # count * |rate - mean|
        return float(gaps.sum() / total)


class Diagnostics:
    """The report's accumulators fed together: `update` each evaluation batch, `merge` another process's."""

    def __init__(self, num_classes: int, bins: int = DEFAULT_BINS):
        self.confusions = Confusions(num_classes)
        self.calibration = Calibration(bins)

    def update(self, predictions: np.ndarray, labels: np.ndarray) -> None:
        self.confusions.update(predictions, labels)
        self.calibration.update(predictions, labels)

    def merge(self, other: "Diagnostics") -> None:
        self.confusions.merge(other.confusions)
        self.calibration.merge(other.calibration)

"""Micro-averaged F1 at a threshold, as a yt8m metric: `--metrics micro_f1`, `--best_metric micro_f1`, or with an
argument, `micro_f1(threshold=0.3)`."""

from __future__ import annotations


class MicroF1:
    """F1 over every (video, class) pair, a class predicted where its probability is at least `threshold`:
    2 TP / (2 TP + FP + FN), from counts summed over the batches (and over processes, by merge); 0 with no positive
    predicted or labelled."""

    higher_is_better = True

    def __init__(self, num_classes: int, threshold: float = 0.5):
        if not 0 < threshold < 1:
            raise ValueError(f"micro_f1: threshold must be in (0, 1), got {threshold}")
        self.threshold = threshold
        self.true_positives = self.false_positives = self.false_negatives = 0

    def update(self, predictions, labels) -> None:
        """predictions: probabilities [videos, classes] (NumPy float32); labels: 0/1 of the same shape."""
        predicted, labelled = predictions >= self.threshold, labels > 0
        self.true_positives += int((predicted & labelled).sum())
        self.false_positives += int((predicted & ~labelled).sum())
        self.false_negatives += int((~predicted & labelled).sum())

    def compute(self) -> float:
        denominator = 2 * self.true_positives + self.false_positives + self.false_negatives
        return 2 * self.true_positives / denominator if denominator else 0.0

    def merge(self, other: "MicroF1") -> None:
        self.true_positives += other.true_positives
        self.false_positives += other.false_positives
        self.false_negatives += other.false_negatives

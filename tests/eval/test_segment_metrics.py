"""yt8m.eval.segment_metrics against a brute-force float64 computation written straight from the definitions and the
documented tie order (arrival order), on seeded random data with ties, capped K and classes without positives."""

from __future__ import annotations

import numpy as np
import pytest

from yt8m.eval.segment_metrics import SegmentMetrics


def rated_pairs(predictions, labels, weights) -> list[tuple[float, bool, int]]:
    """(score, positive, class) of each rated pair in arrival order (row-major)."""
    pairs = []
    for row in range(len(predictions)):
        for c in range(predictions.shape[1]):
            if weights[row, c] > 0:
                pairs.append((float(np.float32(predictions[row, c])), bool(labels[row, c] == 1), c))
    return pairs


def average_precision(ranked: list[bool], num_positives: int, cap: int) -> float:
    found, total = 0, 0.0
    for rank, positive in enumerate(ranked[:cap], start=1):
        if positive:
            found += 1
            total += found / rank
    return total / min(num_positives, cap) if num_positives else 0.0


def brute_force(pairs: list[tuple[float, bool, int]], num_classes: int, top_n: int) -> dict:
    ranked = sorted(pairs, key=lambda pair: -pair[0])  # stable: ties keep arrival order
    aps = []
    for c in range(num_classes):
        in_class = [positive for _, positive, cls in ranked if cls == c]
        if sum(in_class):
            aps.append(average_precision(in_class, sum(in_class), top_n))
    positives = sum(positive for _, positive, _ in pairs)
    return {
        "segment_map": float(np.mean(aps)) if aps else 0.0,
        "gap": average_precision([p for _, p, _ in ranked], positives, len(ranked)) if positives else 0.0,
        "num_rated_pairs": len(pairs),
        "num_positive_pairs": positives,
        "num_classes_with_positives": len(aps),
    }


def random_batch(rng, segments: int, num_classes: int):
    """Scores on a coarse grid (many ties); ~3 rated classes per segment; class 0 never rated, class 1 rated only
    negative, class 2 rated only positive, the rest mixed."""
    predictions = rng.integers(0, 8, size=(segments, num_classes)).astype(np.float32) / 8
    weights = (rng.random((segments, num_classes)) < 3 / num_classes).astype(np.float32)
    weights[:, 0] = 0
    labels = (rng.random((segments, num_classes)) < 0.4).astype(np.float32)
    labels[:, 1], labels[:, 2] = 0, 1
    labels[weights == 0] = rng.integers(0, 2, size=int((weights == 0).sum()))  # ignored: not rated
    return predictions, labels, weights


@pytest.mark.parametrize("seed, top_n", [(0, 100000), (1, 3), (2, 1), (3, 10)])
def test_metrics_equal_the_brute_force_definitions(seed, top_n):
    rng = np.random.default_rng(seed)
    num_classes = 12
    predictions, labels, weights = random_batch(rng, 300, num_classes)
    metrics = SegmentMetrics(num_classes, top_n=top_n)
    metrics.accumulate(predictions, labels, weights, loss=0.5)
    result = metrics.get()
    expected = brute_force(rated_pairs(predictions, labels, weights), num_classes, top_n)
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, rel=1e-12, abs=1e-15), name
    assert result["num_segments"] == 300 and result["loss"] == 0.5
    assert result["num_classes_with_positives"] == num_classes - 2  # never rated, only negatives: left out


def test_several_batches_equal_one_batch():
    rng = np.random.default_rng(4)
    predictions, labels, weights = random_batch(rng, 200, 9)
    whole = SegmentMetrics(9, top_n=5)
    whole.accumulate(predictions, labels, weights, loss=1.0)
    pieces = SegmentMetrics(9, top_n=5)
    for start, stop, loss in [(0, 1, 1.0), (1, 70, 1.0), (70, 70, 5.0), (70, 200, 1.0)]:
        pieces.accumulate(predictions[start:stop], labels[start:stop], weights[start:stop], loss=loss)
    assert pieces.get() == whole.get()


def test_loss_is_averaged_over_segments_and_clear_forgets():
    metrics = SegmentMetrics(3)
    ones = np.ones((2, 3), np.float32)
    metrics.accumulate(ones, ones, ones, loss=1.0)
    metrics.accumulate(ones[:1], ones[:1], ones[:1], loss=4.0)
    assert metrics.get()["loss"] == pytest.approx(2.0)
    metrics.clear()
    with pytest.raises(ValueError, match="no segments"):
        metrics.get()


def test_ties_keep_arrival_order():
    # Class 0: one negative then one positive, both scored 0.5 -> ranked negative first: AP = 1/2.
    predictions = np.full((2, 2), 0.5, np.float32)
    labels = np.array([[0, 0], [1, 0]], np.float32)
    weights = np.array([[1, 0], [1, 0]], np.float32)
    metrics = SegmentMetrics(2)
    metrics.accumulate(predictions, labels, weights)
    assert metrics.get()["segment_map"] == 0.5 and metrics.get()["gap"] == 0.5
    flipped = SegmentMetrics(2)
    flipped.accumulate(predictions[::-1], labels[::-1], weights[::-1])
    assert flipped.get()["segment_map"] == 1.0


def test_a_cap_below_the_positives_divides_by_the_cap():
    predictions = np.array([[0.9], [0.8], [0.7], [0.6]], np.float32)
    labels = np.array([[1], [0], [1], [1]], np.float32)
    metrics = SegmentMetrics(1, top_n=2)
    metrics.accumulate(predictions, labels, np.ones_like(labels))
    assert metrics.get()["segment_map"] == pytest.approx(1 / 2)  # (1/1) / min(3, 2)
    assert metrics.get()["gap"] == pytest.approx((1 + 2 / 3 + 3 / 4) / 3)  # no cap


def test_no_rated_pairs_scores_zero():
    metrics = SegmentMetrics(4)
    metrics.accumulate(np.zeros((3, 4)), np.ones((3, 4)), np.zeros((3, 4)))
    result = metrics.get()
    assert result["segment_map"] == 0.0 and result["gap"] == 0.0
    assert result["num_rated_pairs"] == 0 and result["num_segments"] == 3


@pytest.mark.parametrize("predictions, labels, weights, message", [
    (np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 4)), "must all be \\[segments, 3\\]"),
    (np.zeros((2, 4)), np.zeros((2, 4)), np.zeros((2, 4)), "must all be \\[segments, 3\\]"),
    (np.full((2, 3), np.nan), np.zeros((2, 3)), np.ones((2, 3)), "NaN"),
    (np.zeros((2, 3)), np.full((2, 3), 0.5), np.ones((2, 3)), "0 or 1, found 0.5 at segment 0, class 0"),
])
def test_bad_input_is_an_error(predictions, labels, weights, message):
    with pytest.raises(ValueError, match=message):
        SegmentMetrics(3).accumulate(predictions, labels, weights)


def test_unrated_nan_and_non_binary_entries_are_ignored():
    predictions = np.array([[0.5, np.nan]], np.float32)
    labels = np.array([[1, 0.3]], np.float32)
    metrics = SegmentMetrics(2)
    metrics.accumulate(predictions, labels, np.array([[1, 0]], np.float32))
    assert metrics.get()["segment_map"] == 1.0

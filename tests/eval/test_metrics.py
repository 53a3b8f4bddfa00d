"""yt8m.eval.metrics against brute-force computations straight from the definitions and the tie order,
and against the starter kit's own algorithms (argpartition top-k, per-class heaps) where no ties exist."""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np
import pytest

import yt8m.eval.metrics as metrics_module
import yt8m.io.spill as spill_module
from yt8m.eval.metrics import EvaluationMetrics, calculate_gap, calculate_hit_at_one, calculate_perr


def video_order(scores: np.ndarray) -> list[int]:
    """Classes by score descending, equal scores by ascending class (the documented tie order)."""
    return sorted(range(len(scores)), key=lambda c: (-scores[c], c))


def ranked_pool(predictions: np.ndarray, labels: np.ndarray, k: int) -> list[tuple[float, bool, int]]:
    """Every video's top-k (score, label, class), ranked by score; ties keep accumulation order."""
    pool = []
    for scores, truth in zip(predictions.astype(np.float32), labels):
        finite = [c for c in video_order(scores) if scores[c] > -np.inf]
        pool += [(float(scores[c]), bool(truth[c]), c) for c in finite[:k]]
    return sorted(pool, key=lambda entry: -entry[0])  # stable


def brute_force(predictions: np.ndarray, labels: np.ndarray, k: int) -> dict:
    num_videos, num_classes = predictions.shape
    hits, perrs = [], []
    for scores, truth in zip(predictions.astype(np.float32), labels):
        order = video_order(scores)
        finite = [c for c in order if scores[c] > -np.inf]
        hits.append(float(truth[finite[0]]) if finite else 0.0)
        m = int(truth.sum())
        perrs.append(sum(1 for c in order[:m] if truth[c] and scores[c] > 0) / m if m else 0.0)
    ranked = ranked_pool(predictions, labels, k)

    def average_precision(entries: list, num_positives: int) -> float:
        if num_positives == 0:
            return 0.0
        found, total = 0, 0.0
        for rank, (_, positive, _) in enumerate(entries, start=1):
            if positive:
                found += 1
                total += found / rank
        return total / num_positives

    positives = labels.sum(axis=0)
    class_ap = [average_precision([e for e in ranked if e[2] == c], int(positives[c]))
                for c in range(num_classes)]
    labelled = [ap for ap, n in zip(class_ap, positives) if n > 0]
    return {
        "gap": average_precision(ranked, int(labels.sum())),
        "map": float(np.mean(labelled)) if labelled else 0.0,
        "map_all_classes": float(np.mean(class_ap)),
        "hit_at_one": float(np.mean(hits)),
        "perr": float(np.mean(perrs)),
        "num_videos": num_videos,
    }


def whole_pool_floats(predictions: np.ndarray, labels: np.ndarray, k: int) -> dict:
    """gap, map and map_all_classes computed as yt8m computed them from the whole pool in memory (before the pool
    could be spilled to files): one NumPy sum of GAP's terms, each class's terms added one by one in rank order."""
    ranked = ranked_pool(predictions, labels, k)
    positive_ranks = np.array([rank for rank, entry in enumerate(ranked, start=1) if entry[1]], dtype=np.int64)
    num_positives = int(labels.sum())
    terms = np.arange(1, len(positive_ranks) + 1) / positive_ranks
    class_sums = np.zeros(labels.shape[1])
    seen, hits = np.zeros(labels.shape[1], np.int64), np.zeros(labels.shape[1], np.int64)
    for _, positive, c in ranked:
        seen[c] += 1
        if positive:
            hits[c] += 1
            class_sums[c] += hits[c] / seen[c]
    class_positives = labels.sum(axis=0).astype(np.int64)
    class_ap = np.divide(class_sums, class_positives, out=np.zeros(len(class_sums)), where=class_positives > 0)
    return {"gap": float(terms.sum() / num_positives) if num_positives else 0.0,
            "map": float(class_ap[class_positives > 0].mean()) if (class_positives > 0).any() else 0.0,
            "map_all_classes": float(class_ap.mean())}


def starter_kit(predictions: np.ndarray, labels: np.ndarray, k: int) -> dict:
    """The starter kit's eval_util algorithms, rewritten plainly (valid where scores have no ties)."""
    labels = labels.astype(np.float64)
    num_classes = predictions.shape[1]
    k = min(k, num_classes)
    per_class: list[list] = [[] for _ in range(num_classes)]
    perr = 0.0
    for scores, truth in zip(predictions, labels):
        for c in np.argpartition(scores, -k)[-k:]:
            per_class[c].append((scores[c], truth[c]))
        m = int(truth.sum())
        top = np.argpartition(scores, -m)[-m:] if m else np.arange(num_classes)
        perr += sum(truth[c] for c in top if scores[c] > 0) / top.size

    def ap(pairs: list, num_positives: float) -> float:
        if num_positives == 0:
            return 0.0
        pairs = sorted(pairs, key=lambda pair: pair[0], reverse=True)
        found, total = 0, 0.0
        for rank, (_, actual) in enumerate(pairs, start=1):
            if actual > 0:
                found += 1
                total += found / rank / num_positives
        return total

    positives = labels.sum(axis=0)
    aps = [ap(per_class[c], positives[c]) for c in range(num_classes)]
    hits = labels[np.arange(len(labels)), np.argmax(predictions, 1)]
    return {
        "gap": ap([pair for pairs in per_class for pair in pairs], positives.sum()),
        "map_all_classes": float(np.mean(aps)),
        "hit_at_one": float(np.mean(hits)),
        "perr": perr / len(labels),
    }


def streamed(predictions: np.ndarray, labels: np.ndarray, k: int, pieces: int = 1, loss: float = 0.0,
             **options) -> dict:
    with EvaluationMetrics(predictions.shape[1], top_k=k, **options) as metrics:
        for part_p, part_y in zip(np.array_split(predictions, pieces), np.array_split(labels, pieces)):
            metrics.accumulate(part_p, part_y, loss)
        return metrics.get()


def assert_metrics_equal(actual: dict, expected: dict) -> None:
    for name, value in expected.items():
        assert actual[name] == pytest.approx(value, abs=1e-9), name


def random_case(seed: int, videos: int, classes: int, label_rate: float, ties: bool = False):
    rng = np.random.default_rng(seed)
    if ties:  # few distinct values: ties everywhere, also at the top-k boundary
        predictions = rng.integers(0, 4, (videos, classes)).astype(np.float32) / 4
    else:
        predictions = rng.random((videos, classes), dtype=np.float32)
    labels = (rng.random((videos, classes)) < label_rate).astype(np.float32)
    return predictions, labels


@pytest.mark.parametrize("seed, videos, classes, k, label_rate", [
    (0, 60, 50, 20, 0.05),
    (1, 40, 12, 20, 0.2),     # k > num_classes
    (2, 300, 400, 5, 0.01),
    (3, 30, 7, 3, 0.5),       # many videos with more labels than k
])
def test_random_scores_match_brute_force_and_starter_kit(seed, videos, classes, k, label_rate):
    predictions, labels = random_case(seed, videos, classes, label_rate)
    result = streamed(predictions, labels, k)
    assert_metrics_equal(result, brute_force(predictions, labels, k))
    assert_metrics_equal(result, starter_kit(predictions, labels, k))


@pytest.mark.parametrize("seed, classes, k", [(4, 9, 4), (5, 30, 20), (6, 5, 20)])
def test_tied_scores_follow_the_documented_order(seed, classes, k):
    predictions, labels = random_case(seed, 80, classes, 0.3, ties=True)
    assert_metrics_equal(streamed(predictions, labels, k), brute_force(predictions, labels, k))


def test_hand_made_case_with_ties():
    predictions = np.array([[0.9, 0.5, 0.5], [0.5, 0.8, 0.1]], dtype=np.float32)
    labels = np.array([[0, 1, 0], [1, 1, 0]], dtype=np.float32)
    result = streamed(predictions, labels, k=2)
    # Video 0 keeps class 1 (not 2) at the 0.5 tie; the pooled 0.5 tie keeps video order.
    assert result["gap"] == pytest.approx((1 / 2 + 2 / 3 + 3 / 4) / 3)
    assert result["hit_at_one"] == pytest.approx(0.5)
    assert result["perr"] == pytest.approx(0.5)
    assert result["map"] == pytest.approx((0.5 + 1.0) / 2)
    assert result["map_all_classes"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)


def test_videos_and_classes_without_labels():
    predictions, labels = random_case(7, 50, 30, 0.1)
    labels[::3] = 0        # videos without labels
    labels[:, 5:12] = 0    # classes without labels
    result = streamed(predictions, labels, 10)
    assert_metrics_equal(result, brute_force(predictions, labels, 10))
    assert result["map_all_classes"] < result["map"]


def test_no_labels_at_all_scores_zero():
    predictions, _ = random_case(8, 10, 6, 0.0)
    result = streamed(predictions, np.zeros_like(predictions), 3)
    assert (result["gap"], result["map"], result["map_all_classes"], result["perr"]) == (0.0, 0.0, 0.0, 0.0)


def test_batches_streamed_in_pieces_equal_one_batch():
    predictions, labels = random_case(9, 700, 40, 0.08, ties=True)
    whole = streamed(predictions, labels, 20, pieces=1, loss=0.25)
    assert_metrics_equal(streamed(predictions, labels, 20, pieces=7, loss=0.25), whole)
    assert whole["loss"] == pytest.approx(0.25)
    assert whole["num_videos"] == 700


def test_large_batches_cross_chunk_boundaries():
    predictions, labels = random_case(10, 1100, 300, 0.01)
    labels[3, :40] = 1  # one video with more labels than k: a deeper search in its chunk
    assert_metrics_equal(streamed(predictions, labels, 20), brute_force(predictions, labels, 20))


def test_inputs_split_into_pieces_when_rows_outgrow_the_sort_key(monkeypatch):
    predictions, labels = random_case(15, 100, 8, 0.2, ties=True)
    monkeypatch.setattr(metrics_module, "_KEY_BITS", metrics_module._SCORE_BITS + 3 + 4)  # 16 rows a piece
    assert_metrics_equal(streamed(predictions, labels, 3), brute_force(predictions, labels, 3))


def test_minus_infinity_means_not_predicted():
    predictions = np.full((3, 5), -np.inf, dtype=np.float32)
    predictions[0, [1, 3]] = [0.7, 0.2]
    predictions[1, 4] = 0.9
    labels = np.array([[0, 0, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 1, 0, 0]], dtype=np.float32)
    result = streamed(predictions, labels, 20)
    assert_metrics_equal(result, brute_force(predictions, labels, 20))
    assert result["gap"] == pytest.approx((1 / 3) / 3)  # one hit at rank 3 of 3 pooled; 3 labels
    assert result["hit_at_one"] == 0.0


def test_metrics_ignore_input_dtype_and_negative_zero():
    predictions, labels = random_case(11, 20, 8, 0.2, ties=True)
    predictions[predictions == 0] = -0.0
    reference = streamed(predictions, labels, 4)
    assert_metrics_equal(streamed(predictions.astype(np.float64), labels.astype(bool), 4), reference)


def test_batch_functions_equal_the_streamed_metrics():
    predictions, labels = random_case(12, 64, 25, 0.1)
    result = streamed(predictions, labels, 20)
    assert calculate_gap(predictions, labels) == pytest.approx(result["gap"])
    assert calculate_gap(predictions, labels, top_k=3) == pytest.approx(brute_force(predictions, labels, 3)["gap"])
    assert calculate_hit_at_one(predictions, labels) == pytest.approx(result["hit_at_one"])
    assert calculate_perr(predictions, labels) == pytest.approx(result["perr"])


def test_clear_forgets_everything():
    predictions, labels = random_case(13, 10, 6, 0.3)
    metrics = EvaluationMetrics(6, 3)
    metrics.accumulate(predictions, labels, 1.0)
    metrics.clear()
    metrics.accumulate(predictions[:4], labels[:4], 0.5)
    assert_metrics_equal(metrics.get(), {**brute_force(predictions[:4], labels[:4], 3), "loss": 0.5})


@pytest.mark.parametrize("predictions, labels, message", [
    (np.zeros((2, 5)), np.zeros((2, 4)), "must be equal"),
    (np.zeros((2, 4)), np.zeros((2, 4)), "expected \\[videos, 5\\]"),
    (np.full((2, 5), np.nan), np.zeros((2, 5)), "NaN"),
])
def test_bad_inputs_are_clear_errors(predictions, labels, message):
    with pytest.raises(ValueError, match=message):
        EvaluationMetrics(5).accumulate(predictions, labels)


def test_get_without_videos_and_bad_settings_are_errors():
    with pytest.raises(ValueError, match="no videos"):
        EvaluationMetrics(5).get()
    with pytest.raises(ValueError, match="positive"):
        EvaluationMetrics(5, top_k=0)
    with pytest.raises(ValueError, match="positive"):
        EvaluationMetrics(5, pool_budget=0)


def test_full_size_batch_matches_starter_kit():
    predictions, labels = random_case(14, 64, 3862, 3 / 3862)
    result = streamed(predictions, labels, 20)
    expected = starter_kit(predictions, labels, 20)
    assert_metrics_equal(result, expected)
    assert not math.isnan(result["map"])


@pytest.mark.parametrize("seed, videos, classes, k, ties", [
    (20, 2500, 40, 20, True),    # over 8,192 pooled positives: several levels of NumPy's pairwise sum
    (21, 700, 9, 4, True),
    (22, 400, 300, 20, False),
])
@pytest.mark.parametrize("pool_budget", [1, 37, 5000, metrics_module.POOL_BUDGET])
def test_spilled_pool_gives_the_same_floats_bit_for_bit(monkeypatch, tmp_path, seed, videos, classes, k, ties,
                                                        pool_budget):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(spill_module, "MERGE_BLOCK", 64)  # many merge steps
    predictions, labels = random_case(seed, videos, classes, 0.3, ties=ties)
    predictions[np.random.default_rng(seed).random(predictions.shape) < 0.2] = -np.inf
    result = streamed(predictions, labels, k, pieces=9, pool_budget=pool_budget)
    expected = whole_pool_floats(predictions, labels, k)
    assert {name: result[name] for name in expected} == expected  # exactly equal floats
    assert_metrics_equal(result, brute_force(predictions, labels, k))
    assert os.listdir(tmp_path) == []  # the runs' files are gone


def test_pairwise_sum_from_pieces_equals_numpys_sum():
    rng = np.random.default_rng(23)
    for count in [*range(0, 300), 1000, 8191, 8192, 8193, 50_001]:
        values = rng.random(count) * 10.0 ** rng.integers(-8, 8, count)
        total = metrics_module._PairwiseSum(count)
        for piece in np.array_split(values, rng.integers(1, 12)):
            total.add(piece)
        assert total.total() == np.sum(values), count


def test_spilled_runs_live_in_a_temporary_folder_until_closed_or_cleared(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    predictions, labels = random_case(24, 50, 10, 0.2)
    metrics = EvaluationMetrics(10, 3, pool_budget=20)
    metrics.accumulate(predictions, labels)
    assert [name.startswith("yt8m-metrics-") for name in os.listdir(tmp_path)] == [True]
    first = metrics.get()
    assert metrics.get() == first  # get() reads the runs again; it changes nothing
    metrics.clear()
    assert os.listdir(tmp_path) == []
    metrics.accumulate(predictions, labels)
    metrics.close()
    assert os.listdir(tmp_path) == []


def test_num_labels_counts_the_positive_entries():
    predictions, labels = random_case(25, 30, 8, 0.25)
    metrics = EvaluationMetrics(8, 3)
    metrics.accumulate(predictions, labels)
    metrics.accumulate(predictions[:5], np.zeros_like(labels[:5]))
    assert metrics.num_labels == int(labels.sum()) > 0

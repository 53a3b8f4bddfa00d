"""Metrics of one's own: named with arguments, keyed canonically, fed beside a task's own metrics, merged across
processes exactly, and their direction used to judge a better model."""

from __future__ import annotations

import numpy as np
import pytest

from yt8m.config import config_from_dict
from yt8m.eval.metrics import EvaluationMetrics
from yt8m.fields import parse_list
from yt8m.tasks.metrics import METRICS, MetricSet, canonical_metric, higher_is_better, parse_metric, register_metric
from yt8m.training.config import TrainConfig
from yt8m.training.validation import better


class CountAbove:
    """Predictions above `threshold` that are labels, per video (a toy metric with two arguments)."""

    higher_is_better = False

    def __init__(self, num_classes: int, threshold: float = 0.5, scale: float = 1.0):
        self.threshold, self.scale, self.hits, self.videos = threshold, scale, 0.0, 0

    def update(self, predictions: np.ndarray, labels: np.ndarray) -> None:
        self.hits += float(((predictions > self.threshold) & (labels > 0)).sum())
        self.videos += len(predictions)

    def compute(self) -> float:
        return self.scale * self.hits / self.videos

    def merge(self, other: "CountAbove") -> None:
        self.hits += other.hits
        self.videos += other.videos


@pytest.fixture(autouse=True)
def registered():
    register_metric(CountAbove)
    yield
    METRICS.remove("CountAbove")


def test_arguments_are_typed_and_keyed_canonically_defaults_left_out():
    request = parse_metric("CountAbove( scale=2, threshold=0.5 )")
    assert (request.arguments.threshold, request.arguments.scale) == (0.5, 2.0)
    path = f"{CountAbove.__module__}:CountAbove"  # recorded as another process finds it: its import path
    assert request.key == f"{path}(scale=2.0)" == canonical_metric("CountAbove(scale=2)")
    assert parse_metric("CountAbove").key == path and parse_metric("gap").arguments is None


def test_a_list_of_metrics_splits_at_commas_outside_parentheses():
    assert parse_list("CountAbove(threshold=0.2, scale=3),gap", str) == ["CountAbove(threshold=0.2, scale=3)", "gap"]
    config = config_from_dict(TrainConfig, {"train_data_pattern": "x",
                                            "metrics": "CountAbove(threshold=0.2, scale=3),gap"})
    assert config.validation.metrics == ["CountAbove(threshold=0.2, scale=3)", "gap"]


def test_a_metric_is_fed_beside_the_tasks_own_and_merges_as_one_accumulator_would():
    rng = np.random.default_rng(0)
    predictions, labels = rng.random((40, 6)).astype(np.float32), rng.random((40, 6)) < 0.3
    whole = MetricSet(EvaluationMetrics(6), [("c", parse_metric("CountAbove(threshold=0.4)").build(6))])
    whole.accumulate(predictions, labels)
    halves = [MetricSet(EvaluationMetrics(6), [("c", parse_metric("CountAbove(threshold=0.4)").build(6))])
              for _ in range(2)]
    halves[0].accumulate(predictions[:25], labels[:25])
    halves[1].accumulate(predictions[25:], labels[25:])
    halves[0].extend(halves[1].totals(), halves[1].pooled_blocks())
    expected = ((predictions > 0.4) & labels).sum() / 40
    assert whole.get()["c"] == pytest.approx(expected) == halves[0].get()["c"]
    assert whole.get()["gap"] == pytest.approx(halves[0].get()["gap"])


def test_its_direction_judges_a_better_model():
    assert not higher_is_better("CountAbove") and higher_is_better("gap")
    assert better("CountAbove", 0.1, 0.2) and not better("gap", 0.1, 0.2)

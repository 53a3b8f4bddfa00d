"""Tasks: what a model learns and is judged on (its labels, loss and metrics), chosen once from the config, so
that training, in-training evaluation, `yt8m eval` and tuning handle video labels and 2019 segment ratings alike.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional, Union

import numpy as np
import torch
from torch import nn

from yt8m.tasks.losses import WEIGHTED_LOSSES, create_loss

VIDEO_METRICS = ("gap", "map", "map_all_classes", "hit_at_one", "perr", "loss", "num_videos")
SEGMENT_METRICS = ("segment_map", "gap", "loss", "num_segments", "num_rated_pairs", "num_positive_pairs",
                   "num_classes_with_positives")
DEFAULT_TOP_K = 20


class VideoTask:
    """Video-level labels: the multi-hot "labels" of every class, the loss on all of them, and GAP@top_k, mAP,
    Hit@1, PERR (EvaluationMetrics)."""

    metric_names = VIDEO_METRICS

    def __init__(self, loss_fn: nn.Module, num_classes: int, top_k: int = DEFAULT_TOP_K):
        self.loss_fn, self.num_classes, self.top_k = loss_fn, num_classes, top_k

    def loss(self, output: dict[str, torch.Tensor], batch: dict) -> torch.Tensor:
        return self.loss_fn(output, batch.labels)

    def metrics(self) -> ContextManager:
        """A fresh accumulator for `accumulate`, as a context manager that frees it."""
        from yt8m.eval.metrics import EvaluationMetrics

        return EvaluationMetrics(self.num_classes, self.top_k)

    def accumulate(self, metrics: Any, predictions: np.ndarray, batch: dict, loss: float) -> None:
        metrics.accumulate(predictions, batch.labels.cpu().numpy(), loss)

    def results(self, metrics: Any, source: str) -> dict[str, Any]:
        """The accumulated metrics; shards without a single label (`source`'s) are an error, not metrics of 0."""
        if not metrics.num_labels:
            raise ValueError(f"no labels in {source}: evaluation needs labelled shards "
                             "(test shards have none; `yt8m predict` takes them)")
        return metrics.get()

    def batch_metrics(self, predictions: torch.Tensor, batch: dict) -> dict[str, float]:
        """Hit@1, PERR and GAP@20 of one training batch, from one ranking of its predictions."""
        from yt8m.eval.metrics import EvaluationMetrics

        metrics = EvaluationMetrics(predictions.shape[1])
        metrics.accumulate(predictions.detach().float().cpu().numpy(), batch.labels.detach().cpu().numpy())
        scores = metrics.get()
        return {"hit_at_one": scores["hit_at_one"], "perr": scores["perr"], "gap": scores["gap"]}


class SegmentTask:
    """2019 segment ratings: each example is a rated segment, "labels" marks the classes rated present and
    `label_weights` every class rated there; only rated (segment, class) pairs count in the loss (weighted by
    label_weights, as the starter kit) and in the metrics (segment mAP@top_n per class, GAP; SegmentMetrics)."""

    metric_names = SEGMENT_METRICS

    def __init__(self, loss_fn: nn.Module, num_classes: int, top_n: int):
        self.loss_fn, self.num_classes, self.top_n = loss_fn, num_classes, top_n

    def loss(self, output: dict[str, torch.Tensor], batch: dict) -> torch.Tensor:
        return self.loss_fn(output, batch.labels, batch.label_weights)

    def metrics(self) -> ContextManager:
        from yt8m.eval.segment_metrics import SegmentMetrics

        return contextlib.nullcontext(SegmentMetrics(self.num_classes, self.top_n))

    def accumulate(self, metrics: Any, predictions: np.ndarray, batch: dict, loss: float) -> None:
        metrics.accumulate(predictions, batch.labels.cpu().numpy(), batch.label_weights.cpu().numpy(), loss)

    def results(self, metrics: Any, source: str) -> dict[str, Any]:
        result = metrics.get()
        if not result["num_rated_pairs"]:
            raise ValueError(f"no rated segments in {source}: segment evaluation needs 2019 segment-rated shards")
        return result

    def batch_metrics(self, predictions: torch.Tensor, batch: dict) -> dict[str, float]:
        """Segment mAP and GAP over the rated pairs of one training batch."""
        from yt8m.eval.segment_metrics import SegmentMetrics

        metrics = SegmentMetrics(predictions.shape[1], self.top_n)
        self.accumulate(metrics, predictions.detach().float().cpu().numpy(), batch, 0.0)
        scores = metrics.get()
        return {"segment_map": scores["segment_map"], "gap": scores["gap"]}


Task = Union[VideoTask, SegmentTask]


def task_type(segment_labels: bool) -> type:
    return SegmentTask if segment_labels else VideoTask


def task_from_config(config: Any, loss_fn: Optional[nn.Module] = None, top_k: int = DEFAULT_TOP_K) -> Task:
    """The task a train or eval config asks for, with `loss_fn` (default: --label_loss's); `top_k`: the video
    task's GAP depth (eval's --top_k)."""
    loss_fn = loss_fn if loss_fn is not None else create_loss(config.label_loss)
    if config.segment_labels:
        return SegmentTask(loss_fn, config.num_classes, config.top_n)
    return VideoTask(loss_fn, config.num_classes, top_k)


def task_problems(segment_labels: bool, label_loss: str, metric: Optional[str] = None) -> list[str]:
    """What a config asks of its task that the task lacks: a loss it cannot weight, a metric it does not report."""
    problems = []
    if segment_labels and label_loss not in WEIGHTED_LOSSES:
        problems.append(f"--label_loss {label_loss} cannot weight the rated classes of --segment_labels: use "
                        f"{' or '.join(WEIGHTED_LOSSES)}")
    names = task_type(segment_labels).metric_names
    if metric is not None and metric not in names:
        kind = "segment" if segment_labels else "video-level (no --segment_labels)"
        problems.append(f"--best_metric {metric} is not a {kind} metric: use one of "
                        f"{', '.join(name for name in names if not name.startswith('num_'))}")
    return problems

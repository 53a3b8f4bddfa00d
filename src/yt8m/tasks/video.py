"""The video task (YouTube-8M's labels of each video: GAP@20, mAP, Hit@1, PERR), and the task a run's features ask
for, video labels or 2019 segment ratings (yt8m.tasks.segment), with the checks of what it asks."""

from __future__ import annotations

from typing import Any, ContextManager, Optional, Sequence

import numpy as np
import torch
from torch import nn

from yt8m.data.reading.batch import Batch
from yt8m.data.reading.spec import FeatureSpec
from yt8m.eval.metrics import EvaluationMetrics
from yt8m.eval.segment_metrics import DEFAULT_TOP_N
from yt8m.tasks.base import Output, Task
from yt8m.tasks.losses import LossConfig, create_loss, weights_labels
from yt8m.tasks.metrics import MetricRequest, MetricSet, is_own_metric, metric_problem, parse_metric
from yt8m.tasks.segment import SEGMENT_METRICS, SegmentTask

VIDEO_METRICS = ("gap", "map", "map_all_classes", "hit_at_one", "perr", "loss", "num_videos")
DEFAULT_TOP_K = 20


class VideoTask:
    """Video-level labels: the multi-hot "labels" of every class, the loss on all of them, and GAP@top_k, mAP,
    Hit@1, PERR (EvaluationMetrics)."""

    reads_segments = False

    def __init__(self, loss_fn: nn.Module, num_classes: int, top_k: int = DEFAULT_TOP_K,
                 extra: Sequence[MetricRequest] = ()):
        self.loss_fn, self.num_classes, self.top_k, self.extra = loss_fn, num_classes, top_k, tuple(extra)
        self.metric_names = VIDEO_METRICS + tuple(request.key for request in self.extra)

    def loss(self, output: Output, batch: Batch) -> torch.Tensor:
        return self.loss_fn(output, batch.labels)

    def metrics(self) -> ContextManager:
        extra = [(request.key, request.build(self.num_classes)) for request in self.extra]
        return MetricSet(EvaluationMetrics(self.num_classes, self.top_k), extra)

    def accumulate(self, metrics: Any, predictions: np.ndarray, batch: Batch, loss: float) -> None:
        metrics.accumulate(predictions, batch.labels.cpu().numpy(), loss)

    def results(self, metrics: Any, source: str) -> dict[str, Any]:
        """The accumulated metrics; shards without a single label (`source`'s) are an error, not metrics of 0."""
        if not metrics.num_labels:
            raise ValueError(f"no labels in {source}: evaluation needs labelled shards "
                             "(test shards have none; `yt8m predict` takes them)")
        return metrics.get()

    def batch_metrics(self, predictions: torch.Tensor, batch: Batch) -> dict[str, float]:
        """Hit@1, PERR and GAP@20 of one training batch, from one ranking of its predictions."""
        metrics = EvaluationMetrics(predictions.shape[1])
        metrics.accumulate(predictions.detach().float().cpu().numpy(), batch.labels.detach().cpu().numpy())
        scores = metrics.get()
        return {"hit_at_one": scores["hit_at_one"], "perr": scores["perr"], "gap": scores["gap"]}

    def judged(self) -> "VideoTask":
        return self


def label_task(segments: bool, loss_fn: nn.Module, num_classes: int, top_k: int = DEFAULT_TOP_K,
               top_n: int = DEFAULT_TOP_N, metrics: Sequence[str] = ()) -> Task:
    """The task of a record's own labels: its video labels, or its 2019 segment ratings (mAP@top_n); `metrics`:
    those of one's own it reports beside its own (video labels only: task_problems says so)."""
    extra = [parse_metric(name) for name in dict.fromkeys(metrics) if not is_own_metric(name)]
    if segments:
        if extra:
            raise ValueError(f"metric {extra[0].key}: a metric of one's own judges video labels, not segment ratings")
        return SegmentTask(loss_fn, num_classes, top_n)
    return VideoTask(loss_fn, num_classes, top_k, list({request.key: request for request in extra}.values()))


def features_task(features: FeatureSpec, loss: LossConfig, top_k: int = DEFAULT_TOP_K,
                  top_n: int = DEFAULT_TOP_N, metrics: Sequence[str] = ()) -> Task:
    """The task of what a run's features say it reads (its classes, video labels or segment ratings), learning
    `loss` (--label_loss); `top_k`: the video task's GAP depth (eval's --top_k), `top_n` the segment task's K;
    `metrics`: those of one's own it reports too."""
    return label_task(features.segment_labels, create_loss(loss), features.num_classes, top_k, top_n, metrics)


def metric_names(segments: bool) -> tuple[str, ...]:
    return SEGMENT_METRICS if segments else VIDEO_METRICS


def task_problems(segments: bool, loss: Optional[str], metric: Optional[str] = None, loss_field: str = "--label_loss",
                  metric_field: str = "--best_metric") -> list[str]:
    """What a label task is asked that it lacks: a loss that cannot weight the rated classes of segments, a metric
    it does not report (None: not asked). `loss_field` and `metric_field` name the fields as the config does."""
    problems = []
    if segments and loss is not None and not weights_labels(loss):
        problems.append(f"{loss_field} {loss} cannot weight the rated classes of --segment_labels: use a loss that "
                        "takes label_weights (CrossEntropyLoss, HingeLoss, FocalLoss)")
    if metric is not None:
        problems += metric_task_problems(segments, metric, metric_field)
    return problems


def metric_task_problems(segments: bool, metric: str, metric_field: str) -> list[str]:
    """Why a label task (of segment ratings, or video labels) does not report `metric`: a task's own metric of the
    other kind, a metric of one's own on segments, or a name that finds no metric."""
    names = metric_names(segments)
    kind = "segment" if segments else "video-level (no --segment_labels)"
    known = ", ".join(name for name in names if not name.startswith("num_"))
    if metric in names:
        return []
    if is_own_metric(metric) or (segments and metric_problem(metric) is None):
        return [f"{metric_field} {metric} is not a {kind} metric: use one of {known}"
                + ("" if is_own_metric(metric) else " (a metric of one's own judges video labels)")]
    problem = metric_problem(metric)
    return [f"{metric_field} {problem}"] if problem else []

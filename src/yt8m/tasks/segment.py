"""The 2019 segment task: each example a rated segment, only rated (segment, class) pairs counting in the loss and
the metrics (segment mAP@top_n per class, GAP over the pairs)."""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import numpy as np
import torch
from torch import nn

from yt8m.data.reading.batch import Batch
from yt8m.eval.segment_metrics import SegmentMetrics
from yt8m.tasks.base import Output

SEGMENT_METRICS = ("segment_map", "gap", "loss", "num_segments", "num_rated_pairs", "num_positive_pairs",
                   "num_classes_with_positives")


class SegmentTask:
    """2019 segment ratings: each example is a rated segment, "labels" marks the classes rated present and
    `label_weights` every class rated there; only rated (segment, class) pairs count in the loss (weighted by
    label_weights, as the starter kit) and in the metrics (segment mAP@top_n per class, GAP; SegmentMetrics)."""

    metric_names = SEGMENT_METRICS
    reads_segments = True

    def __init__(self, loss_fn: nn.Module, num_classes: int, top_n: int):
        self.loss_fn, self.num_classes, self.top_n = loss_fn, num_classes, top_n

    def loss(self, output: Output, batch: Batch) -> torch.Tensor:
        return self.loss_fn(output, batch.labels, batch.label_weights)

    def metrics(self) -> ContextManager:
        return contextlib.nullcontext(SegmentMetrics(self.num_classes, self.top_n))

    def accumulate(self, metrics: Any, predictions: np.ndarray, batch: Batch, loss: float) -> None:
        metrics.accumulate(predictions, batch.labels.cpu().numpy(), batch.label_weights.cpu().numpy(), loss)

    def results(self, metrics: Any, source: str) -> dict[str, Any]:
        result = metrics.get()
        if not result["num_rated_pairs"]:
            raise ValueError(f"no rated segments in {source}: segment evaluation needs 2019 segment-rated shards")
        return result

    def batch_metrics(self, predictions: torch.Tensor, batch: Batch) -> dict[str, float]:
        """Segment mAP and GAP over the rated pairs of one training batch."""
        metrics = SegmentMetrics(predictions.shape[1], self.top_n)
        self.accumulate(metrics, predictions.detach().float().cpu().numpy(), batch, 0.0)
        scores = metrics.get()
        return {"segment_map": scores["segment_map"], "gap": scores["gap"]}

    def judged(self) -> "SegmentTask":
        return self

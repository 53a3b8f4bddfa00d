"""The Task protocol: what a model learns and is judged on. Training, in-training validation, `yt8m eval` and tuning
ask every task the same questions, whatever its labels: video labels, segment ratings, mapped labels, a teacher's."""

from __future__ import annotations

from typing import Any, ContextManager, Protocol

import numpy as np
import torch

from yt8m.data.reading.batch import Batch

# A model's output on a batch: {"logits": [batch, classes], "predictions": sigmoid(logits)}.
Output = dict[str, torch.Tensor]


class Task(Protocol):
    """A task: the loss of a head's output on a batch, and the metrics of its predictions.

    `metric_names` are the keys `results` reports, `num_classes` the width of its head, `reads_segments` what its
    batches must carry: 2019 rated segments (`label_weights`, every class rated) instead of video labels.
    """

    @property
    def metric_names(self) -> tuple[str, ...]: ...

    @property
    def num_classes(self) -> int: ...

    @property
    def reads_segments(self) -> bool: ...

    def loss(self, output: Output, batch: Batch) -> torch.Tensor:
        """The batch's mean loss, differentiable."""

    def metrics(self) -> ContextManager[Any]:
        """A fresh accumulator for `accumulate`, as a context manager that frees it."""

    def accumulate(self, metrics: Any, predictions: np.ndarray, batch: Batch, loss: float) -> None:
        """Add a batch's predictions (float32 [batch, classes]) and its loss to the accumulator."""

    def results(self, metrics: Any, source: str) -> dict[str, Any]:
        """The accumulated metrics, `metric_names` each; data without a single label (`source`'s) is an error."""

    def batch_metrics(self, predictions: torch.Tensor, batch: Batch) -> dict[str, float]:
        """The metrics of one training batch, for the step's log line."""

    def judged(self) -> "Task":
        """The task evaluation scores: the task itself, or for a teacher's targets the labels they stand for."""

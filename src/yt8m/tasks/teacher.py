"""The teacher task: a label task whose loss also learns a teacher's soft targets (distillation, Hinton et al. 2015),
and the Teacher protocol it reads them from (the teachers themselves: yt8m.inference.teachers)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ContextManager, Optional, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from yt8m.data.reading.batch import Batch
from yt8m.fields import setting
from yt8m.tasks.base import Output, Task

DISTILL_LOSSES = ("binary", "softmax")
# The settings that define what a distilled run learns: resuming it with other values is refused.
DISTILLATION_FIELDS = ("teacher", "distill_weight", "distill_temperature", "distill_loss")


@dataclass(frozen=True)
class DistillationConfig:
    """The `distillation` section: --teacher and how the student learns its soft targets."""

    teacher: str = setting("", "Distillation: the student also learns this teacher's soft targets: a train dir (its "
                               "best export, else newest checkpoint), an ONNX export, or a predictions file (.jsonl, "
                               ".csv).")
    distill_weight: float = setting(0.5, "With --teacher: the loss is (1 - W) x label loss + W x distillation loss.",
                                    at_least=0, at_most=1)
    distill_temperature: float = setting(1.0, "With --teacher: T dividing teacher and student logits (the "
                                              "distillation loss is scaled by T^2).", above=0)
    distill_loss: str = setting("binary", "With --teacher: 'binary' (sigmoid cross-entropy per class) or 'softmax' "
                                          "(KL divergence of softmaxes over the classes, NeXtVLAD's).",
                                choices=lambda: DISTILL_LOSSES)

    def problems(self) -> list[str]:
        if self.teacher:
            return []
        given = [f"--{name}" for name, default in ((f.name, f.default) for f in dataclasses.fields(self))
                 if name != "teacher" and getattr(self, name) != default]
        return [f"{' and '.join(given)} without --teacher: distillation needs a teacher"] if given else []
# Probabilities are capped below 1 so that every teacher logit but that of a class left out (probability 0,
# logit -inf: a softmax or sigmoid at any temperature keeps it 0) is finite.
_MAX_PROBABILITY = 1.0 - 1e-7


class Teacher(Protocol):
    """Soft targets of a batch: `logits(batch)` [batch, classes] float32 on the batch's device."""

    source: str  # what the teacher is, for logs and errors
    mode: str  # "streamed" (run on each batch) or "stored" (computed once, looked up)

    def logits(self, batch: Batch) -> torch.Tensor: ...

    def close(self) -> None: ...


def probability_logits(probabilities: torch.Tensor) -> torch.Tensor:
    """The logits of probabilities in [0, 1]; 0 gives -inf (the class stays at 0 whatever the temperature)."""
    capped = probabilities.clamp(max=_MAX_PROBABILITY)
    return torch.log(capped) - torch.log1p(-capped)


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
                      kind: str = "binary") -> torch.Tensor:
    """The distillation loss of a batch, summed over classes and averaged over videos as the label losses are,
    scaled by T^2 so that its gradients keep their size whatever the temperature (Hinton, Vinyals & Dean 2015,
    "Distilling the Knowledge in a Neural Network", section 2).

    "binary": each class a yes/no question, as YouTube-8M's multi-label classes are: the cross-entropy between
    sigmoid(student / T) and sigmoid(teacher / T). "softmax": the KL divergence from the teacher's softmax over the
    classes at temperature T to the student's, the distillation loss of NeXtVLAD's mixture of three models (Lin,
    Xiao & Fan 2018, "NeXtVLAD", its section on knowledge distillation with on-the-fly naive ensemble: there the
    teacher is the gated mixture of the branches' logits and the KL term is added to the label loss)."""
    student = student_logits.float() / temperature
    teacher = teacher_logits.float() / temperature
    if kind == "binary":
        loss = F.binary_cross_entropy_with_logits(student, torch.sigmoid(teacher), reduction="sum")
    elif kind == "softmax":
        loss = F.kl_div(F.log_softmax(student, dim=1), F.softmax(teacher, dim=1), reduction="sum")
    else:
        raise ValueError(f"unknown distillation loss {kind!r}: use one of {', '.join(DISTILL_LOSSES)}")
    return loss * (temperature ** 2) / student.shape[0]


class DistillationTask:
    """A label task whose loss also learns a teacher's soft targets: (1 - W) x the label loss + W x the
    distillation loss. Metrics, in training and in evaluation, stay the label task's: a task whose label source is
    the teacher's predictions, beside the label task it wraps."""

    def __init__(self, label_task: Task, teacher: Teacher, weight: float, temperature: float, kind: str = "binary"):
        self.label_task, self.teacher = label_task, teacher
        self.weight, self.temperature, self.kind = weight, temperature, kind
        self.metric_names = label_task.metric_names
        self.num_classes = label_task.num_classes
        self.reads_segments = label_task.reads_segments
        self.last_losses: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def loss(self, output: Output, batch: Batch) -> torch.Tensor:
        label_loss = self.label_task.loss(output, batch)
        distill_loss = distillation_loss(output["logits"], self.teacher.logits(batch), self.temperature, self.kind)
        self.last_losses = (label_loss.detach(), distill_loss.detach())
        return (1.0 - self.weight) * label_loss + self.weight * distill_loss

    def metrics(self) -> ContextManager:
        return self.label_task.metrics()

    def accumulate(self, metrics: Any, predictions: np.ndarray, batch: Batch, loss: float) -> None:
        self.label_task.accumulate(metrics, predictions, batch, loss)

    def results(self, metrics: Any, source: str) -> dict[str, Any]:
        return self.label_task.results(metrics, source)

    def batch_metrics(self, predictions: torch.Tensor, batch: Batch) -> dict[str, float]:
        """The label task's batch metrics, and the last batch's label and distillation losses apart."""
        scores = self.label_task.batch_metrics(predictions, batch)
        if self.last_losses is not None:
            scores.update(label_loss=float(self.last_losses[0]), distill_loss=float(self.last_losses[1]))
        return scores

    def judged(self) -> Task:
        """Validation judges the labels the teacher stands for, and never asks the teacher (its file need not list
        the validation videos)."""
        return self.label_task.judged()



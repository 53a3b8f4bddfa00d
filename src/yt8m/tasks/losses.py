"""Label losses by `--label_loss` name: the starter kit's CrossEntropyLoss (with optional label smoothing),
HingeLoss and SoftmaxLoss, FocalLoss, and one's own by import path or entry point (group yt8m.losses).

Each is called as `loss_fn(model_output, labels, label_weights=None)` and returns the mean over the batch of a
per-video sum; label weights (the 2019 segment task: 1 for rated classes) multiply each (example, class) term. A
loss's hyper-parameters are its dataclass's fields (or its constructor's keyword arguments): flags and YAML fields.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from yt8m.config import ComponentSection
from yt8m.fields import setting
from yt8m.plugins.faults import calling
from yt8m.plugins.registry import Registry, described
from yt8m.plugins.signature import annotated_hparams, signature_hparams


@dataclass(frozen=True)
class CrossEntropyHParams:
    label_smoothing: float = setting(0.0, "CrossEntropyLoss: label smoothing e, each target y becomes "
                                          "y (1 - e) + e / 2 (a class's two outcomes; Szegedy et al. 2016). 0: the "
                                          "starter kit's loss.", at_least=0, below=1)


class CrossEntropyLoss(nn.Module):
    """Binary cross-entropy summed over classes, averaged over videos (the starter kit's
    reduce_mean(reduce_sum(ce, 1))), computed from logits: exact where the starter kit's
    log(p + 1e-5) form saturates at confident predictions. With `label_smoothing` e, on targets y (1 - e) + e / 2."""

    def __init__(self, hparams: CrossEntropyHParams = CrossEntropyHParams()):
        super().__init__()
        self.smoothing = hparams.label_smoothing

    def forward(self, output: dict[str, torch.Tensor], labels: torch.Tensor,
                label_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        logits = output["logits"].float()
        if self.smoothing:
            labels = labels.to(logits.dtype) * (1 - self.smoothing) + self.smoothing / 2
        if label_weights is not None:
            weighted = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype),
                                                          weight=label_weights.to(logits.dtype), reduction="sum")
            return weighted / logits.shape[0]
        predictions = output["predictions"].detach()
        if predictions.dtype != logits.dtype:  # e.g. under autocast: recompute at the loss's precision
            predictions = torch.sigmoid(logits.detach())
        if labels.dtype != torch.bool or labels.device.type != "cpu" or torch.compiler.is_compiling():
            labels = labels.to(logits.dtype)  # dense: NumPy's positives, below, would break a compiled graph
        return SummedBinaryCrossEntropy.apply(logits, predictions, labels)


class SummedBinaryCrossEntropy(torch.autograd.Function):
    """sum(softplus(x) - x * y) / batch, equal to BCE-with-logits summed over classes and averaged over
    videos; its gradient (sigmoid(x) - y) / batch reuses the model's predictions instead of recomputing
    sigmoid (element-wise passes dominate the step on CPU).

    Labels are the reader's bool multi-hot tensor on the CPU, taken by the few positives' flat index so that x * y
    and - y touch only those entries, or dense floats. (A fused C pass of the sum and gradient was deleted: it
    gained 1-3% of LogisticModel's step, bench/README.md.)"""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, predictions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        batch = logits.shape[0]
        ctx.positives = None
        if labels.dtype == torch.bool:
            # NumPy's flatnonzero: 0.56 ms for 1024 x 3862, torch's nonzero 1.6.
            ctx.positives = torch.from_numpy(np.flatnonzero(labels.numpy()))
            ctx.save_for_backward(predictions)
            cross_term = logits.reshape(-1)[ctx.positives].sum()
        else:
            ctx.save_for_backward(predictions, labels)
            cross_term = torch.dot(logits.reshape(-1), labels.reshape(-1))
        return (F.softplus(logits).sum() - cross_term) / batch

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        scale = grad / ctx.saved_tensors[0].shape[0]
        if ctx.positives is not None:
            gradient = ctx.saved_tensors[0] * scale
            gradient.view(-1).index_put_((ctx.positives,), -scale, accumulate=True)
            return gradient, None, None
        predictions, labels = ctx.saved_tensors
        return torch.sub(predictions, labels).mul_(scale), None, None


class HingeLoss(nn.Module):
    """sum over classes of max(0, b - y * p) with y = +1/-1 and p the predicted probability (the
    starter kit applies it to the model's predictions, with its default b = 1), averaged over videos."""

    b = 1.0

    def forward(self, output: dict[str, torch.Tensor], labels: torch.Tensor,
                label_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        predictions = output["predictions"].float()
        signs = 2 * labels.to(predictions.dtype) - 1
        hinge = torch.clamp(self.b - signs * predictions, min=0)
        if label_weights is not None:
            hinge = hinge * label_weights.to(hinge.dtype)
        return hinge.sum(dim=1).mean()


class SoftmaxLoss(nn.Module):
    """Cross-entropy between each video's labels normalized to sum 1 and a softmax over the
    predicted probabilities, as the starter kit computes it; a video without labels adds 0.

    Label weights have no meaning here: the softmax spans every class, rated or not, so the segment task refuses
    this loss (`weights_labels`, checked with the config)."""

    weights_labels = False

    def forward(self, output: dict[str, torch.Tensor], labels: torch.Tensor,
                label_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        if label_weights is not None:
            raise ValueError("SoftmaxLoss takes no label weights: its softmax spans every class, rated or not")
        predictions = output["predictions"].float()
        labels = labels.to(predictions.dtype)
        normalized = labels / labels.sum(dim=1, keepdim=True).clamp(min=1e-7)
        return -(normalized * F.log_softmax(predictions, dim=1)).sum(dim=1).mean()


@dataclass(frozen=True)
class FocalHParams:
    focal_gamma: float = setting(2.0, "FocalLoss: the focusing exponent gamma: (1 - p_t)^gamma scales each term "
                                      "down as the model gets it right (0: cross-entropy).", at_least=0)
    focal_alpha: float = setting(0.25, "FocalLoss: the weight alpha of the positive terms, 1 - alpha of the negative "
                                       "ones (0.5: equal, at half the scale).", at_least=0, at_most=1)


class FocalLoss(nn.Module):
    """The focal loss of Lin et al. 2017 ("Focal Loss for Dense Object Detection", eq. 5) per class: -alpha_t (1 -
    p_t)^gamma log(p_t), p_t the probability given to the class's true outcome and alpha_t alpha for a positive, 1 -
    alpha for a negative; summed over classes, averaged over videos, as CrossEntropyLoss. Defaults are the paper's
    (gamma 2, alpha 0.25). From logits: log(p_t) is minus the cross-entropy with logits, exact when p_t rounds to 1."""

    def __init__(self, hparams: FocalHParams = FocalHParams()):
        super().__init__()
        self.gamma, self.alpha = hparams.focal_gamma, hparams.focal_alpha

    def forward(self, output: dict[str, torch.Tensor], labels: torch.Tensor,
                label_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        logits = output["logits"].float()
        targets = labels.to(logits.dtype)
        cross_entropy = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        probabilities = torch.sigmoid(logits)
        p_true = probabilities * targets + (1 - probabilities) * (1 - targets)
        alpha = self.alpha * targets + (1 - self.alpha) * (1 - targets)
        terms = alpha * (1 - p_true).pow(self.gamma) * cross_entropy
        if label_weights is not None:
            terms = terms * label_weights.to(terms.dtype)
        return terms.sum(dim=1).mean()


@dataclass(frozen=True)
class LossEntry:
    """A registered loss: what builds it from its hyper-parameters, their dataclass, and whether it takes label
    weights (the segment task's rated classes): a forward with a label_weights argument does, unless its class says
    `weights_labels = False`."""

    build: Callable[[Any], nn.Module]
    hparams: type
    weights_labels: bool


# The arguments a loss is called with; a function loss's others are its hyper-parameters.
CALL = ("output", "labels", "label_weights")


class FunctionLoss(nn.Module):
    """A loss written as a function `loss(output, labels[, label_weights], **hparams)`, as a module."""

    def __init__(self, function: Callable[..., torch.Tensor], hparams: Any):
        super().__init__()
        self.function, self.values = function, dataclasses.asdict(hparams)

    def forward(self, output: dict[str, torch.Tensor], labels: torch.Tensor,
                label_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        weights = {} if label_weights is None else {"label_weights": label_weights}
        loss = calling(f"loss {self.function.__qualname__}", self.function.__qualname__, self.function, output,
                       labels, **weights, **self.values, passing=(torch.OutOfMemoryError,))
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            got = f"a tensor of shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else \
                f"a {type(loss).__name__}"
            raise ValueError(f"loss {self.function.__qualname__} returned {got}: a loss returns the batch's loss, a "
                             "scalar tensor (e.g. the per-video sums' .mean())")
        return loss


def adopt_loss(name: str, obj: Any) -> LossEntry:
    """What a name or import path finds, as a loss: an nn.Module class taking its hyper-parameters' dataclass (an
    `hparams` argument) or keyword arguments with defaults, whose forward takes (output, labels[, label_weights]);
    or such a function. A TypeError says what it lacks."""
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        _check_call(obj.forward, skip_self=True)
        own = annotated_hparams(obj)
        hparams = own or signature_hparams(obj, ())
        build: Callable[[Any], nn.Module] = obj if own else functools.partial(_by_keyword, obj)
        takes_weights = "label_weights" in inspect.signature(obj.forward).parameters
        return LossEntry(build, hparams, getattr(obj, "weights_labels", takes_weights))
    if inspect.isfunction(obj):
        _check_call(obj, skip_self=False)
        hparams = signature_hparams(obj, CALL)
        return LossEntry(functools.partial(FunctionLoss, obj), hparams,
                         "label_weights" in inspect.signature(obj).parameters)
    raise TypeError(f"{described(obj)} is not a loss: a loss is an nn.Module class or a function called as (output, "
                    "labels[, label_weights]) that returns the batch's loss")


def _by_keyword(cls: type[nn.Module], hparams: Any) -> nn.Module:
    return cls(**dataclasses.asdict(hparams))


def _check_call(function: Callable, skip_self: bool) -> None:
    parameters = [p.name for p in inspect.signature(function).parameters.values()][1 if skip_self else 0:]
    if parameters[:2] != ["output", "labels"]:
        raise TypeError(f"{function.__qualname__} takes ({', '.join(parameters)}), but a loss is called as "
                        "(output, labels[, label_weights]) (output: the model's dict of logits and predictions; "
                        "its hyper-parameters after them, with defaults): name its first two arguments output and "
                        "labels")


LOSSES: Registry[LossEntry] = Registry("loss", "yt8m.losses", adopt_loss)
L = TypeVar("L", bound=Callable)
for _builtin in (CrossEntropyLoss, HingeLoss, SoftmaxLoss, FocalLoss):
    LOSSES.add(_builtin.__name__, adopt_loss(_builtin.__name__, _builtin), _builtin, builtin=True)


def register_loss(loss: L) -> L:
    """Decorator: make a loss available by its name (`--label_loss MyLoss`, a task's `loss: MyLoss`): an nn.Module
    class whose forward takes (output, labels[, label_weights]), its hyper-parameters its constructor's `hparams`
    dataclass or keyword arguments with defaults (flags of their own names); or such a function.

    Examples:
        >>> @register_loss
        ... def squared_error(output, labels, label_weights=None, scale: float = 1.0):
        ...     return scale * ((output["predictions"] - labels.float()) ** 2).sum(1).mean()
        >>> create_loss(LossConfig("squared_error", {"scale": 2.0}))  # doctest: +ELLIPSIS
        FunctionLoss(...)
        >>> LOSSES.remove("squared_error")
    """
    LOSSES.add(loss.__name__, adopt_loss(loss.__name__, loss), loss)
    return loss


def known_loss(name: str) -> Optional[str]:
    """The `check` of a loss name field: None, or why `name` is not a loss."""
    return LOSSES.problem(name)


def weights_labels(name: str) -> bool:
    """Whether loss `name` takes label weights (the segment task's losses must)."""
    return LOSSES.get(name).weights_labels


def loss_names() -> list[str]:
    return LOSSES.names()


@dataclass(frozen=True)
class LossConfig(ComponentSection):
    """The `loss` section: the label loss a run's task learns (and eval reports), and its hyper-parameters (as
    given; once resolved, the loss's dataclass at its defaults where not given)."""

    name: str = setting("CrossEntropyLoss", "Loss: CrossEntropyLoss, HingeLoss, SoftmaxLoss, FocalLoss, or one's own "
                                            "(package.module:Name).", flag="label_loss")
    hparams: Any = setting(None, "The loss's hyper-parameters (YAML mapping); each is also given by its dotted name "
                                 "(--loss.focal_gamma 2) and, for the built-in losses, by its starter-kit flag "
                                 "(--label_smoothing 0.1, --focal_gamma 2).", flag="loss_hparams")

    SCOPE: ClassVar[str] = "loss"

    @classmethod
    def registry(cls) -> Registry[Any]:
        return LOSSES


def create_loss(loss: LossConfig | str) -> nn.Module:
    """The loss a `loss` section (or a name, at its defaults) describes, its section resolved first where it is not
    yet (a ValueError names what is wrong)."""
    config = (LossConfig(loss) if isinstance(loss, str) else loss).resolved()
    return LOSSES.get(config.name, "--label_loss").build(config.hparams)

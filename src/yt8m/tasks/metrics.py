"""Metrics by name: a task's own (GAP, mAP, Hit@1, PERR, loss; segment mAP) and metrics of one's own, a class fed
every validation batch's predictions and labels, named in --best_metric, --metrics, a task's metric or a tuning
objective, by registered name, entry point (group yt8m.metrics) or import path, with arguments as NAME(arg=value).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Protocol, TypeVar

import numpy as np
import yaml

from yt8m.config import ConfigError, config_from_dict
from yt8m.eval.metrics import HIGHER_IS_BETTER, METRIC_MEANINGS, EvaluationMetrics
from yt8m.fields import closest, problem_of
from yt8m.plugins.faults import calling, finite_number
from yt8m.plugins.registry import Registry, described
from yt8m.plugins.signature import annotated_hparams, signature_hparams

# What yt8m gives a metric's constructor; its other arguments are the metric's own, given as NAME(arg=value).
GIVEN = ("num_classes",)
METHODS = ("update", "compute", "merge")
_REQUEST = re.compile(r"^\s*(?P<name>[^()\s]+)\s*(?:\((?P<args>.*)\))?\s*$")


class Metric(Protocol):
    """A metric of one's own, made per evaluation as `Metric(num_classes, **arguments)`.

    `update` gets each batch's predictions [videos, classes] (probabilities, float32) and labels (0/1, same shape);
    `compute` gives the value over everything updated; `merge` adds another process's metric of the same kind (under
    torchrun, each evaluates its own shards and rank 0 merges them). `higher_is_better` says which way is better: it
    picks the best model, drives early stopping and a tuning objective's direction.
    """

    higher_is_better: bool

    def update(self, predictions: np.ndarray, labels: np.ndarray) -> None: ...

    def compute(self) -> float: ...

    def merge(self, other: Any) -> None: ...


@dataclass(frozen=True)
class MetricEntry:
    """A registered metric: its class, its arguments' dataclass, and which way is better."""

    cls: type
    hparams: type
    higher_is_better: bool
    takes_hparams: bool  # the constructor takes the dataclass whole (`hparams`), not keyword arguments


def adopt_metric(name: str, obj: Any) -> MetricEntry:
    """What a name or import path finds, as a metric: a class with update, compute and merge, a bool
    `higher_is_better`, and a constructor taking num_classes (and its own arguments, with defaults)."""
    if not isinstance(obj, type):
        raise TypeError(f"{described(obj)} is not a metric: a metric is a class with update(predictions, labels), "
                        "compute() and merge(other), and a bool higher_is_better")
    missing = [method for method in METHODS if not callable(getattr(obj, method, None))]
    if missing:
        raise TypeError(f"{obj.__name__} is not a metric: it lacks the method {', '.join(missing)} (a metric has "
                        "update(predictions, labels), compute() and merge(other): merge adds another process's "
                        "metric of the same class)")
    direction = getattr(obj, "higher_is_better", None)
    if not isinstance(direction, bool):
        got = "" if direction is None else f", got {direction!r}"
        raise TypeError(f"{obj.__name__} is not a metric: it lacks the class attribute higher_is_better = True or "
                        f"False (which way a better model moves it: it picks the best model){got}")
    if "num_classes" not in inspect.signature(obj).parameters:
        raise TypeError(f"{obj.__name__}.__init__ takes ({', '.join(inspect.signature(obj).parameters)}), but yt8m "
                        f"builds a metric as {obj.__name__}(num_classes=..., **arguments): add the argument "
                        "num_classes (the task's classes)")
    own = annotated_hparams(obj)
    return MetricEntry(obj, own or signature_hparams(obj, GIVEN), direction, own is not None)


METRICS: Registry[MetricEntry] = Registry("metric", "yt8m.metrics", adopt_metric, also_known=tuple(HIGHER_IS_BETTER))


K = TypeVar("K", bound=type)


def register_metric(metric: K) -> K:
    """Class decorator: make a metric available by its class name (`--best_metric MicroF1`, `--metrics`, a tuning
    objective); see Metric for what it has.

    Examples:
        >>> @register_metric
        ... class MeanMaxScore:
        ...     higher_is_better = True
        ...     def __init__(self, num_classes: int):
        ...         self.total, self.videos = 0.0, 0
        ...     def update(self, predictions, labels):
        ...         self.total += float(predictions.max(axis=1).sum()); self.videos += len(predictions)
        ...     def compute(self):
        ...         return self.total / self.videos
        ...     def merge(self, other):
        ...         self.total += other.total; self.videos += other.videos
        >>> parse_metric("MeanMaxScore").key
        'MeanMaxScore'
        >>> METRICS.remove("MeanMaxScore")
    """
    METRICS.add(metric.__name__, adopt_metric(metric.__name__, metric), metric)
    return metric


@dataclass(frozen=True)
class MetricRequest:
    """A metric as a config names it: NAME, or NAME(arg=value, ...) with its arguments typed by its dataclass."""

    name: str
    arguments: Any  # the metric's hyper-parameters' dataclass instance; None for a task's own metric

    @property
    def key(self) -> str:
        """Its name in results: as written, with the arguments given (canonical order) where they differ."""
        if self.arguments is None:
            return self.name
        defaults = type(self.arguments)()
        given = [f"{f.name}={getattr(self.arguments, f.name)!r}" for f in dataclasses.fields(self.arguments)
                 if getattr(self.arguments, f.name) != getattr(defaults, f.name)]
        return f"{self.name}({', '.join(given)})" if given else self.name

    def build(self, num_classes: int) -> Metric:
        """The metric, made for one evaluation; its constructor raising is a ComponentFault naming it."""
        entry = METRICS.get(self.name)
        kwargs = {"hparams": self.arguments} if entry.takes_hparams else dataclasses.asdict(self.arguments)
        return calling(f"metric {self.key}", f"{entry.cls.__qualname__}(num_classes={num_classes}, ...)",
                       lambda: entry.cls(num_classes=num_classes, **kwargs))


def is_own_metric(name: str) -> bool:
    """A task's own metric (gap, map, ..., segment_map), which its accumulator computes."""
    return name in HIGHER_IS_BETTER


def parse_metric(text: str) -> MetricRequest:
    """A metric named in a config; a ValueError says what is wrong with it (one line)."""
    match = _REQUEST.match(text)
    if match is None:
        raise ValueError(f"metric {text!r}: write NAME or NAME(arg=value, ...)")
    name, arguments = match["name"], match["args"]
    if is_own_metric(name):
        if arguments is not None:
            raise ValueError(f"metric {text!r}: {name} takes no arguments")
        return MetricRequest(name, None)
    found = METRICS.entry(name)
    if found is None:
        raise ValueError(METRICS.unknown(name))
    entry, given = found.component, _arguments(text, arguments)
    own = [f.name for f in dataclasses.fields(entry.hparams)]
    for key in given:
        if key not in own:
            raise ValueError(f"metric {text!r}: {name} takes no argument {key!r}{closest(key, own)} (its arguments: "
                             f"{', '.join(own) or 'none'})")
    try:
        return MetricRequest(found.recorded_name, config_from_dict(entry.hparams, given, source=name))
    except ConfigError as err:
        raise ValueError(f"metric {text!r}: " + "; ".join(err.problems)) from err


def _arguments(text: str, arguments: Optional[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for part in filter(None, (piece.strip() for piece in (arguments or "").split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"metric {text!r}: {part!r} is not arg=value")
        values[key.strip()] = yaml.safe_load(value)
    return values


def canonical_metric(text: str) -> str:
    """A metric name as results key it (an import path as module:Name, arguments in canonical form); `text` itself
    where it names no metric (the checks say so)."""
    try:
        return parse_metric(text).key
    except ValueError:
        return text


def metric_problem(text: str) -> Optional[str]:
    """The check of a metric name: None, or why it names no metric."""
    return problem_of(lambda: parse_metric(text))


def metric_meaning(name: str) -> str:
    """What a metric says, in one line, for the reports people read."""
    if is_own_metric(name):
        return METRIC_MEANINGS[name]
    better = "higher" if higher_is_better(name) else "lower"
    return f"a metric of one's own ({better} is better)"


def metrics_problem(names: list[str]) -> Optional[str]:
    """The check of a list of metric names: None, or why the first bad one names no metric."""
    return next(filter(None, map(metric_problem, names)), None)


def higher_is_better(text: str) -> bool:
    """Which way is better for a metric name (a task's own, or one of one's own)."""
    request = parse_metric(text)
    return HIGHER_IS_BETTER[request.name] if request.arguments is None else METRICS.get(request.name).higher_is_better


class MetricSet:
    """A video task's accumulator (EvaluationMetrics) with metrics of one's own beside it: each batch goes to all,
    `get()` gives all their values, and processes merge all (yt8m.distributed.across_ranks)."""

    def __init__(self, own: EvaluationMetrics, extra: Iterable[tuple[str, Metric]]):
        self.own, self.extra = own, list(extra)

    def __enter__(self) -> "MetricSet":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.own.close()

    @property
    def num_labels(self) -> int:
        return self.own.num_labels

    def accumulate(self, predictions: np.ndarray, labels: np.ndarray, loss: float = 0.0) -> None:
        self.own.accumulate(predictions, labels, loss)
        for key, metric in self.extra:
            calling(f"metric {key}", f"{type(metric).__qualname__}.update", metric.update, predictions, labels)

    def get(self) -> dict[str, Any]:
        """Every metric's value; one of one's own that raises, or gives other than a finite number, is a
        ComponentFault naming it (a nan is never a result, let alone a best one)."""
        own = {}
        for key, metric in self.extra:
            call = f"{type(metric).__qualname__}.compute"
            own[key] = finite_number(f"metric {key}", call, calling(f"metric {key}", call, metric.compute))
        return {**self.own.get(), **own}

    def per_class(self) -> dict[str, np.ndarray]:
        return self.own.per_class()

    def totals(self) -> dict[str, Any]:
        return {**self.own.totals(), "extra": [metric for _, metric in self.extra]}

    def pooled_blocks(self) -> Iterator[np.ndarray]:
        return self.own.pooled_blocks()

    def extend(self, totals: dict[str, Any], pooled_blocks: Iterable[np.ndarray]) -> None:
        self.own.extend(totals, pooled_blocks)
        for (key, metric), other in zip(self.extra, totals["extra"]):
            calling(f"metric {key}", f"{type(metric).__qualname__}.merge", metric.merge, other)

"""Components given to the Python API as objects (a class, a function, an instance) turned into the names configs
record, by their registries (`Registry.named`); and which of a run's components only this process can find."""

from __future__ import annotations

import logging
from typing import Any, Optional

import yaml

from yt8m.models.registry import MODELS
from yt8m.plugins.registry import Entry, Registry
from yt8m.tasks.losses import LOSSES
from yt8m.tasks.metrics import METRICS

log = logging.getLogger("yt8m.api")
# The flat settings that name a component, its registry, and the section its hyper-parameters go to (None: a
# component given its hyper-parameters by another's, as a frame model's classifier is).
NAMING: dict[str, tuple[Registry[Any], Optional[str]]] = {
    "model": (MODELS, "model"), "label_loss": (LOSSES, "loss"), "video_level_classifier_model": (MODELS, None)}
METRIC_SETTINGS = ("best_metric", "metrics")


def named_components(values: dict[str, Any]) -> dict[str, Any]:
    """Flat settings (`flattened`) with each component given as an object replaced by its recorded name, the
    hyper-parameters an object carries (a partial's keywords, an instance's values) given by dotted name unless
    given already."""
    named = dict(values)
    for flag, (registry, scope) in NAMING.items():
        if flag not in values or isinstance(values[flag], str):
            continue
        name, arguments = registry.named(values[flag])
        if arguments and scope is None:
            raise ValueError(f"{flag}: give the classifier as its class: its hyper-parameters are the model's")
        named = {**{f"{scope}.{key}": value for key, value in arguments.items()}, **named, flag: name}
    if "best_metric" in values:
        named["best_metric"] = metric_name(values["best_metric"])
    metrics = values.get("metrics")
    if isinstance(metrics, (list, tuple)):
        named["metrics"] = [metric_name(metric) for metric in metrics]
    elif metrics is not None and not isinstance(metrics, str):
        named["metrics"] = [metric_name(metrics)]  # one metric given as its class or instance
    return named


def metric_name(given: Any) -> str:
    """A metric given as a name, a class, or an instance (its class and arguments: `Name(arg=value)`)."""
    if isinstance(given, str):
        return given
    name, arguments = METRICS.named(given)
    written = [f"{key}={_argument_text(name, key, value)}" for key, value in arguments.items()]
    return f"{name}({', '.join(written)})" if written else name


def _argument_text(name: str, key: str, value: Any) -> str:
    """A metric argument as `NAME(arg=value)` writes it: YAML that reads back to the same value."""
    text = yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
    if any(mark in text for mark in ",()") or yaml.safe_load(text) != value:
        raise ValueError(f"metric {name}: its argument {key}={value!r} cannot be written as NAME(arg=value): give the "
                         "metric as its class, its arguments as the defaults of a subclass")
    return text


def process_local(values: dict[str, Any]) -> list[str]:
    """The components flat settings name (by name) that only this process can find, described ("model Attn")."""
    named = [(registry, values[flag]) for flag, (registry, _) in NAMING.items() if isinstance(values.get(flag), str)]
    metrics = [values.get("best_metric"), *(values.get("metrics") or [])]
    named += [(METRICS, metric.partition("(")[0].strip()) for metric in metrics if isinstance(metric, str)]
    found = [(registry.kind, registry.peek(name)) for registry, name in named]
    return list(dict.fromkeys(_described(kind, entry) for kind, entry in found
                              if entry is not None and entry.process_local))


def _described(kind: str, entry: Entry[Any]) -> str:
    where = getattr(entry.source, "__module__", "")
    return f"{kind} {entry.name} (defined in {'a function' if where != '__main__' else where})"


def warn_or_refuse_process_local(values: dict[str, Any], processes: int, needing: str) -> None:
    """Warn (one line) that other processes (`yt8m eval`, tune jobs, torchrun ranks) cannot find a component only
    this process knows; refuse it (a ValueError) where this run needs `processes` > 1, for `needing`."""
    local = process_local(values)
    if not local:
        return
    if processes > 1:
        raise ValueError(f"{', '.join(local)}: known to this process only, and {needing} runs in {processes} "
                         "processes: define it in a module (on PYTHONPATH) and import it from there")
    log.warning("%s: known to this process only; the run records it by a name that `yt8m eval`, tune jobs and "
                "torchrun ranks cannot find: define it in a module (on PYTHONPATH) and import it from there",
                ", ".join(local))

"""What an evaluation report compares its headline with (`yt8m eval --report FILE --compare_to REFERENCE`): figures
stated somewhere (a recipe's comment: `gap=0.7035,map=0.331`, or a bare GAP), another run's latest evaluation (its
train dir's newest eval/metrics-<step>.json), or a metrics JSON file (eval's JSON line, or one of those files)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

from yt8m.fields import problem_of
from yt8m.io import storage

METRICS_FILE = re.compile(r"metrics-(\d+)\.json")


@dataclass(frozen=True)
class Reference:
    """A reference's name as the report shows it, and its figures by metric (gap, map, ...)."""

    label: str
    metrics: dict[str, float]


def read_reference(text: str) -> Reference:
    """The reference `text` names (see the module); a ValueError says why it names none."""
    if "=" in text or _is_number(text):
        return Reference(f"the stated figures ({text})", _figures(text))
    if storage.isdir(text):
        steps = sorted((int(match[1]), name) for name in storage.listdir(os.path.join(text, "eval"))
                       if (match := METRICS_FILE.fullmatch(name)))
        if not steps:
            raise ValueError(f"{text}: the train dir has no eval/metrics-<step>.json (evaluate it first: yt8m eval "
                             f"--train_dir {text} --run_once --eval_data_pattern ...)")
        step, name = steps[-1]
        return Reference(f"run {text} at step {step}", _metrics_of(os.path.join(text, "eval", name)))
    if storage.exists(text):
        return Reference(f"{text}", _metrics_of(text))
    raise ValueError(f"{text!r} is neither figures (gap=0.70,map=0.33), a train dir nor a metrics JSON file")


def reference_problem(text: str) -> Optional[str]:
    """--compare_to's problem, where it names no reference (a setting's check)."""
    return problem_of(lambda: read_reference(text))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _figures(text: str) -> dict[str, float]:
    """`gap=0.7035,map=0.331` (or a bare number: the GAP) as {metric: value}."""
    if _is_number(text):
        return {"gap": float(text)}
    figures = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, _, value = part.partition("=")
        if not _is_number(value.strip()) or not name.strip():
            raise ValueError(f"{part!r} is not METRIC=NUMBER (gap=0.7035,map=0.331)")
        figures[name.strip()] = float(value)
    return figures


def _metrics_of(path: str) -> dict[str, float]:
    """The numbers of a metrics JSON file (eval's JSON line, or eval/metrics-<step>.json)."""
    try:
        document: Any = json.loads(storage.read_bytes(path))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is not a metrics JSON file ({err})") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path} is not a metrics JSON file (no mapping of metrics)")
    return {name: float(value) for name, value in document.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}

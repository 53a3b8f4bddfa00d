"""The optional parts installed as extras (`pip install 'yt8m[onnx,plots,tensorboard]'`): what each needs, whether
it is installed, and the one-line error or log line naming the extra where it is not."""

from __future__ import annotations

import importlib
import logging

EXTRAS = {"onnx": ("onnx", "onnxscript", "onnxruntime"), "plots": ("matplotlib",), "tensorboard": ("tensorboard",)}
log = logging.getLogger("yt8m")
_said: set[str] = set()


def missing(extra: str) -> list[str]:
    """The modules of `extra` that do not import."""
    absent = []
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            absent.append(module)
    return absent


def require(extra: str, what: str) -> None:
    """A ValueError (one line from the `yt8m` command) when `what` needs an extra that is not installed."""
    absent = missing(extra)
    if absent:
        raise ValueError(f"{what} needs the {extra} extra: pip install 'yt8m[{extra}]' (missing: {', '.join(absent)})")


def available(extra: str, skipped: str) -> bool:
    """Whether `extra` is installed; where not, say once what is `skipped` without it."""
    absent = missing(extra)
    if absent and extra not in _said:
        _said.add(extra)
        log.warning("%s: the %s extra is not installed (pip install 'yt8m[%s]')", skipped, extra, extra)
    return not absent

"""The optional parts of yt8m: the extras (`pip install 'yt8m[onnx,plots,tensorboard]'`: what each needs, whether it
is installed, the one-line error or log line naming it where not) and the compiled extensions (each used where it was
built; its pure-Python fallback runs where not, or where YT8M_NATIVE=0 says to ignore them all)."""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType
from typing import Optional

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


NATIVE_ENV = "YT8M_NATIVE"
_logged: set[str] = set()


def load_extension(name: str) -> tuple[Optional[ModuleType], str]:
    """(the extension module, or None where it is not used; why, for the log line that says which path runs)."""
    if os.environ.get(NATIVE_ENV, "").strip() == "0":
        return None, f"{NATIVE_ENV}=0"
    try:
        return importlib.import_module(name), f"{name} built at install"
    except ImportError as err:
        return None, f"{name} was not built at install ({err})"


def log_path_once(what: str, on: bool, why: str) -> None:
    """Log "<what>: on/off (why)" once per process: which path runs, and why."""
    if what not in _logged:
        _logged.add(what)
        log.info("%s: %s (%s)", what, "on" if on else "off", why)

"""The compiled extensions are optional: each is used where it was built, and its pure-Python fallback runs where
not (an install without a C compiler) or where YT8M_NATIVE=0 says to ignore them all (to test the fallbacks)."""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType
from typing import Optional

NATIVE_ENV = "YT8M_NATIVE"
log = logging.getLogger("yt8m")
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

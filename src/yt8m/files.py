"""File helpers shared by the commands: text files that appear only once completely written.

A watching reader (`yt8m eval`, `tune-report`, a serving job) never sees half a file.
"""

from __future__ import annotations

import os
from typing import Callable, TextIO, TypeVar

T = TypeVar("T")


def write_file_atomically(path: str, write: Callable[[TextIO], T]) -> T:
    """Run `write(out)` into `path`, written under a temporary name and renamed into place; returns its result."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as out:
        result = write(out)
    os.replace(tmp, path)
    return result

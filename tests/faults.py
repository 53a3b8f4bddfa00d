"""Fault injection for the write-path tests: a disk that fills up, in-process or for a CLI subprocess.

Test modules import what they use (`from faults import ...`).
"""

from __future__ import annotations

import errno
import os
import resource
import signal
from pathlib import Path
from typing import Callable


def fill_disk_after(monkeypatch, directory: Path, budget: int) -> None:
    """Make writes to files under `directory` fail with ENOSPC once `budget` bytes were written there,
    as `os.write` on a full disk does (writes to other files go through)."""
    real_write = os.write
    written = [0]
    root = os.path.realpath(directory)

    def write(fd: int, data) -> int:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.startswith(root):
            room = budget - written[0]
            if room <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = memoryview(data)[:room]
            written[0] += len(data)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def file_size_limit(limit: int) -> Callable[[], None]:
    """A `preexec_fn` for subprocess: writes past `limit` bytes in any file fail with EFBIG (instead of
    SIGXFSZ killing the process), as on a file system that fills up mid-file."""
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def files_under(directory: Path) -> list[str]:
    """Every file and folder name below `directory`, relative to it."""
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))

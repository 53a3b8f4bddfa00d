"""What this machine can hold: memory available to this process (cgroup v2 or v1 limits, /proc/meminfo), free space
of /dev/shm for reader workers' batch slots, split among concurrent tune jobs; each probe is a function to replace."""

from __future__ import annotations

import os
import shutil
from typing import Callable, Optional

GiB = 1 << 30
MiB = 1 << 20
# Kept back from the available memory for the model, its optimizer, batches and the interpreter's own growth.
MEMORY_MARGIN = 1 * GiB
_UNLIMITED = 1 << 60  # cgroup v1 writes a huge number (page-rounded 2**63) for "no limit"
_jobs_sharing = 1  # concurrent jobs (yt8m tune --n_jobs) whose caches share the machine's memory


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as file:
            text = file.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2: no limit) reads as None


def _cgroup_v2_room(root: str = "/sys/fs/cgroup") -> Optional[int]:
    limit, used = _read_int(f"{root}/memory.max"), _read_int(f"{root}/memory.current")
    return None if limit is None or used is None else max(0, limit - used)


def _cgroup_v1_room(root: str = "/sys/fs/cgroup/memory") -> Optional[int]:
    limit, used = _read_int(f"{root}/memory.limit_in_bytes"), _read_int(f"{root}/memory.usage_in_bytes")
    if limit is None or used is None or limit >= _UNLIMITED:
        return None
    return max(0, limit - used)


def _meminfo_available(path: str = "/proc/meminfo") -> Optional[int]:
    try:
        with open(path) as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory() -> Optional[int]:
    """Bytes this process may still take: the least of the cgroup's room and MemAvailable; None where nothing says."""
    known = [room for room in (_cgroup_v2_room(), _cgroup_v1_room(), _meminfo_available()) if room is not None]
    return min(known) if known else None


def share_memory_among(jobs: int) -> None:
    """Set in each of `jobs` concurrent jobs (tune --n_jobs): each may take only its share of the memory."""
    global _jobs_sharing
    _jobs_sharing = max(1, jobs)


def jobs_sharing() -> int:
    return _jobs_sharing


def memory_budget(probe: Optional[Callable[[], Optional[int]]] = None) -> Optional[int]:
    """Bytes a RAM cache of this process may take: the available memory (`probe`, default available_memory, looked
    up when called so that tests can replace it) less MEMORY_MARGIN, divided among the jobs sharing the machine;
    None where the memory is unknown (nothing is refused then)."""
    room = (probe or available_memory)()
    if room is None:
        return None
    return max(0, room // _jobs_sharing - MEMORY_MARGIN)


def shm_free_bytes(path: str = "/dev/shm") -> Optional[int]:
    """Free bytes of /dev/shm (where DataLoader workers' shared memory lies); None where it is not there."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def disk_free_bytes(path: str) -> Optional[int]:
    """Free bytes of the volume holding `path` (or its nearest existing parent); None where none exists."""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path.rstrip("/"))
        if parent == path:
            return None
        path = parent
    try:
        return shutil.disk_usage(path or ".").free
    except OSError:
        return None


def human_bytes(count: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB)):
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count / 1024:.0f} KiB"

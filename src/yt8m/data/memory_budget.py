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


def _own_cgroup(controller: str, listing: str = "/proc/self/cgroup") -> str:
    """This process's cgroup path for `controller` ("" for cgroup v2's unified line "0::/path"), or "/"."""
    try:
        with open(listing) as file:
            for line in file:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controller in controllers.split(","):
                    return path
    except (OSError, ValueError):
        pass
    return "/"


def cgroup_v2_room(root: str = "/sys/fs/cgroup", group: Optional[str] = None) -> Optional[int]:
    """memory.max less memory.current of this process's cgroup (v2); None without a limit or a cgroup v2."""
    folder = os.path.join(root, (_own_cgroup("") if group is None else group).lstrip("/"))
    for candidate in (folder, root):  # a container sees its own cgroup as the root
        limit, used = _read_int(f"{candidate}/memory.max"), _read_int(f"{candidate}/memory.current")
        if limit is not None and used is not None:
            return max(0, limit - used)
    return None


def cgroup_v1_room(root: str = "/sys/fs/cgroup/memory", group: Optional[str] = None) -> Optional[int]:
    """memory.limit_in_bytes less memory.usage_in_bytes of this process's memory cgroup (v1); None without one."""
    folder = os.path.join(root, (_own_cgroup("memory") if group is None else group).lstrip("/"))
    for candidate in (folder, root):
        limit = _read_int(f"{candidate}/memory.limit_in_bytes")
        used = _read_int(f"{candidate}/memory.usage_in_bytes")
        if limit is not None and used is not None and limit < _UNLIMITED:
            return max(0, limit - used)
    return None


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
    known = [room for room in (cgroup_v2_room(), cgroup_v1_room(), _meminfo_available()) if room is not None]
    return min(known) if known else None


def share_memory_among(jobs: int) -> None:
    """Set in each of `jobs` concurrent jobs (tune --n_jobs): each may take only its share of the memory."""
    global _jobs_sharing
    _jobs_sharing = max(1, jobs)


def jobs_sharing() -> int:
    return _jobs_sharing


def processes_on_this_machine() -> int:
    """This machine's processes of a torchrun run (LOCAL_WORLD_SIZE), each caching its share of the records."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return max(1, int(value)) if value.isdigit() else 1


def memory_budget(probe: Optional[Callable[[], Optional[int]]] = None) -> Optional[int]:
    """Bytes a RAM cache of this process may take: the available memory (`probe`, default available_memory, looked
    up when called so that tests can replace it) divided among the jobs and torchrun processes sharing the machine,
    less MEMORY_MARGIN; None where the memory is unknown (nothing is refused then)."""
    room = (probe or available_memory)()
    if room is None:
        return None
    return max(0, room // (_jobs_sharing * processes_on_this_machine()) - MEMORY_MARGIN)


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

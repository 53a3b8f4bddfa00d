"""What this machine can hold: memory available to this process (cgroup v2 or v1 limits, /proc/meminfo), free space
of /dev/shm for reader workers' batch slots, split among concurrent tune jobs; each probe is a function to replace."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable, Optional

from yt8m.runtime import processes_sharing_machine

GiB = 1 << 30
MiB = 1 << 20
MACHINE_MEMORY = "the machine's memory"  # MemoryUse.what of /proc/meminfo's
_UNLIMITED = 1 << 60  # cgroup v1 writes a huge number (page-rounded 2**63) for "no limit"


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


@dataclass(frozen=True)
class MemoryUse:
    """Memory in use against the limit the kernel enforces: `used` leaves out the page cache of files (active and
    inactive), which the kernel reclaims before it kills (a streamed shard read twice is active file cache), and
    keeps anonymous and shared memory (/dev/shm batch slots); `limit` the limit and `what` where it is set."""

    used: int
    limit: int
    what: str

    @property
    def room(self) -> int:
        return max(0, self.limit - self.used)


def _file_cache(folder: str, keys: tuple[str, ...]) -> int:
    """The cgroup's page cache of files (memory.stat's `keys`), which the kernel reclaims before it kills."""
    total = 0
    try:
        with open(f"{folder}/memory.stat") as file:
            for line in file:
                name, _, value = line.partition(" ")
                if name in keys and value.strip().isdigit():
                    total += int(value)
    except OSError:
        pass
    return total


def cgroup_v2_use(root: str = "/sys/fs/cgroup", group: Optional[str] = None) -> Optional[MemoryUse]:
    """memory.current against memory.max of this process's cgroup (v2); None without a limit or a cgroup v2."""
    folder = os.path.join(root, (_own_cgroup("") if group is None else group).lstrip("/"))
    for candidate in (folder, root):  # a container sees its own cgroup as the root
        limit, used = _read_int(f"{candidate}/memory.max"), _read_int(f"{candidate}/memory.current")
        if limit is not None and used is not None:
            unreclaimable = used - _file_cache(candidate, ("active_file", "inactive_file"))
            return MemoryUse(max(0, unreclaimable), limit, "the cgroup's memory.max")
    return None


def cgroup_v1_use(root: str = "/sys/fs/cgroup/memory", group: Optional[str] = None) -> Optional[MemoryUse]:
    """memory.usage_in_bytes against memory.limit_in_bytes of this process's memory cgroup (v1); None without one."""
    folder = os.path.join(root, (_own_cgroup("memory") if group is None else group).lstrip("/"))
    for candidate in (folder, root):
        limit = _read_int(f"{candidate}/memory.limit_in_bytes")
        used = _read_int(f"{candidate}/memory.usage_in_bytes")
        if limit is not None and used is not None and limit < _UNLIMITED:
            unreclaimable = used - _file_cache(candidate, ("total_active_file", "total_inactive_file"))
            return MemoryUse(max(0, unreclaimable), limit, "the cgroup's memory.limit_in_bytes")
    return None


def meminfo_use(path: str = "/proc/meminfo") -> Optional[MemoryUse]:
    """MemTotal less MemAvailable against MemTotal: the machine's own memory."""
    values = {}
    try:
        with open(path) as file:
            for line in file:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(values) < 2:
        return None
    return MemoryUse(values["MemTotal"] - values["MemAvailable"], values["MemTotal"], MACHINE_MEMORY)


def memory_use() -> Optional[MemoryUse]:
    """The tightest of the limits on this process (cgroup v2, v1, the machine's memory): the one with the least
    room; None where nothing says."""
    known = [use for use in (cgroup_v2_use(), cgroup_v1_use(), meminfo_use()) if use is not None]
    return min(known, key=lambda use: use.room) if known else None


def available_memory() -> Optional[int]:
    """Bytes this process may still take: the least room of memory_use's limits; None where nothing says."""
    use = memory_use()
    return None if use is None else use.room


def memory_budget(reserve: int, probe: Optional[Callable[[], Optional[int]]] = None) -> Optional[int]:
    """Bytes a RAM cache of this process may take: the available memory (`probe`, default available_memory, looked
    up when called so that tests can replace it) divided among the jobs and torchrun processes sharing the machine,
    less `reserve` (what the run itself will still take); None where the memory is unknown (nothing is refused)."""
    room = (probe or available_memory)()
    if room is None:
        return None
    return max(0, room // processes_sharing_machine() - reserve)


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

"""Checks of what a training run will hold before it holds it (a RAM cache and the run itself against the memory
available, the checkpoints against the disk), and a watch that warns while its memory nears the limit."""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from yt8m.config import ConfigError
from yt8m.data.reading import memory_budget as machine
from yt8m.data.reading.cache_estimate import CacheEstimate, batch_bytes, estimate_cache
from yt8m.data.reading.dataset import YT8MDataset
from yt8m.data.reading.delivery import SLOTS_PER_WORKER, slot_bytes
from yt8m.data.reading.memory_budget import MiB, human_bytes, memory_budget
from yt8m.data.reading.node_plan import ReadingNeeds
from yt8m.data.reading.shuffle_stream import SHUFFLE_BUFFER_MAX_BYTES
from yt8m.io import storage
from yt8m.io.checkpoints import list_checkpoints
from yt8m.models.model_size import BYTES_PER_VALUE, ModelSize
from yt8m.runtime import jobs_sharing, torchrun_processes_here

log = logging.getLogger("yt8m.train")
OPTIMIZER_VALUES_PER_PARAMETER = 2  # Adam's moments
# The interpreter's and allocator's own growth in a first epoch, beyond gradients, optimizer state and batches (the
# 132 real shards' LogisticModel run grew 57 MB in epoch 1 with 17 MB of gradients: bench/README.md).
SLACK = 128 * MiB
BATCHES_IN_FLIGHT = 4  # the readers' next batches, the step's batch and its float32 copy (of uint8 frames: 4x)
WATCH_SECONDS = 1.0
WATCH_WARN_AT = 0.9  # of the limit
# Under a cgroup's limit (the run's own container or job), the run stops itself here, after its step, with a
# checkpoint: before the kernel's kill, which would leave neither. The machine's memory is only warned of: other
# processes may hold it.
WATCH_STOP_AT = 0.95
_limit_reached: list[machine.MemoryUse] = []  # what the watch saw at WATCH_STOP_AT, for the loop's next step


class MemoryLimitReached(OSError):
    """Under a cgroup's limit, the run would not fit (refused at the start) or its memory in use reached
    WATCH_STOP_AT of the limit (stopped after a step, with a checkpoint): before the kernel's kill."""


@dataclass(frozen=True)
class RunMemory:
    """What a training run will still take once its model is built, roughly (checked in a real cgroup in
    bench/README.md): gradients and Adam's state (allocated at the first step), the batches in flight, the reader
    workers' shared-memory batch slots, and where it streams, each reader's shuffle buffer of serialized records."""

    optimizer: int
    batches: int
    shuffle_buffers: int
    reader_slots: int = 0

    def reserve(self, streaming: bool) -> int:
        return self.optimizer + self.batches + self.reader_slots + SLACK + (self.shuffle_buffers if streaming else 0)

    def describe(self, streaming: bool) -> str:
        parts = [f"gradients and optimizer state {human_bytes(self.optimizer)}",
                 f"batches {human_bytes(self.batches + self.reader_slots)}"]
        if streaming:
            parts.append(f"shuffle buffers {human_bytes(self.shuffle_buffers)}")
        return f"{human_bytes(self.reserve(streaming))} ({', '.join(parts)}, {human_bytes(SLACK)} to spare)"


def run_memory(size: ModelSize, datasets: Sequence[YT8MDataset], readers: int) -> RunMemory:
    """RunMemory of a run of a model of `size` reading `datasets`, each with `readers` reader processes (0: in the
    training process, one shuffle buffer)."""
    optimizer = size.parameters * (1 + OPTIMIZER_VALUES_PER_PARAMETER) * BYTES_PER_VALUE
    batches = sum(BATCHES_IN_FLIGHT * batch_bytes(dataset.spec, dataset.batch_size) for dataset in datasets)
    shuffle_buffers = sum(_shuffle_buffers(dataset, max(1, readers)) for dataset in datasets)
    slots = sum(readers * SLOTS_PER_WORKER * slot_bytes(dataset) for dataset in datasets)
    return RunMemory(optimizer, batches, shuffle_buffers, slots)


def reading_needs(memory: RunMemory, datasets: Sequence[YT8MDataset], streaming: bool) -> ReadingNeeds:
    """What one process's reading of `datasets` holds per reader (yt8m.data.reading.node_plan), beside the run's
    own memory."""
    records = sum(dataset.record_bytes for dataset in datasets)
    return ReadingNeeds(records, sum(slot_bytes(dataset) for dataset in datasets),
                        memory.optimizer + memory.batches + SLACK, streaming)


def _shuffle_buffers(dataset: YT8MDataset, readers: int) -> int:
    """Each reader's buffer of --shuffle_buffer records (at most SHUFFLE_BUFFER_MAX_BYTES), at most the shards'
    bytes this process reads."""
    share = dataset.plan.shard_bytes / dataset.plan.world_size
    each = min(dataset.options.shuffle_buffer * dataset.record_bytes, SHUFFLE_BUFFER_MAX_BYTES)
    return round(min(readers * each, share))


def cache_fits(datasets: Sequence[YT8MDataset], required: bool, reserve: int, what: str = "training data") -> bool:
    """Whether the datasets' RAM caches (--cache_in_memory; of `what`) fit this process's memory budget, less
    `reserve` for the run itself; where they do not, one warning and False (the caller streams), or with `required`
    (--cache_in_memory_required) one ConfigError."""
    estimate = sum((estimate_cache(dataset.paths, dataset.spec, dataset.options.skip_corrupt, dataset.plan.world_size,
                                   dataset.batch_size, dataset.plan.shard_bytes, dataset.plan.sizes)
                    for dataset in datasets), CacheEstimate(0, 0))
    budget = memory_budget(reserve)
    if budget is None or estimate.nbytes <= budget:
        log.info("caching the %s in RAM: estimate %s, within the %s available%s", what, estimate,
                 "unknown memory" if budget is None else human_bytes(budget), _per_job())
        return True
    problem = (f"the RAM cache of the {what} would take an estimated {estimate}, more than the "
               f"{human_bytes(budget)} available{_per_job()} (memory less the {human_bytes(reserve)} the run itself "
               "will take)")
    if required:
        raise ConfigError("--cache_in_memory_required", [f"{problem}: leave --cache_in_memory_required off to stream "
                                                          "instead, or set --cache_in_memory false"])
    log.warning("%s: streaming the shards instead (set --cache_in_memory false to skip this check, or "
                "--cache_in_memory_required to stop here instead)", problem)
    return False


def _per_job() -> str:
    jobs, processes = jobs_sharing(), torchrun_processes_here()
    shares = ([f"--n_jobs {jobs}"] if jobs > 1 else []) + ([f"{processes} torchrun processes"] if processes > 1 else [])
    return f" (this process's share: 1/{jobs * processes} for {' x '.join(shares)})" if shares else ""


def checkpoint_bytes(size: ModelSize) -> int:
    """A checkpoint's size, roughly: the model's values (model_size.json's) and the optimizer's state, taken as
    Adam's two values a parameter (the most of torch's usual optimizers), all float32."""
    return (size.buffer_values + size.parameters * (1 + OPTIMIZER_VALUES_PER_PARAMETER)) * BYTES_PER_VALUE


def warn_if_disk_short(train_dir: str, one_checkpoint: int, keep_checkpoints: int) -> None:
    """One warning where the train dir's volume (local only) lacks room for keep_checkpoints + 1 checkpoints (the
    newest is written before the oldest is removed), less those a resumed run has there already."""
    if not storage.is_local(train_dir):
        return
    to_come = max(1, keep_checkpoints + 1 - len(list_checkpoints(train_dir)))
    free, needed = machine.disk_free_bytes(train_dir), one_checkpoint * to_come
    if free is not None and needed > free:
        log.warning("%s has %s free, less than the %s that %d more checkpoints of about %s take (--keep_checkpoints "
                    "%d, and one more while the newest is written): free space or lower --keep_checkpoints", train_dir,
                    human_bytes(free), human_bytes(needed), to_come, human_bytes(one_checkpoint), keep_checkpoints)


def check_run_memory(memory: RunMemory, streaming: bool, check: str) -> None:
    """Where this process's share of the memory available is less than what the run will still take, so that the
    kernel is likely to kill it part-way (a kill leaves nothing in the log): under a cgroup's limit with `check`
    "refuse" one MemoryLimitReached line, otherwise ("warn", or the machine's own memory) one warning; "off": none."""
    reserve = memory.reserve(streaming)
    budget = memory_budget(reserve)
    if check == "off" or budget is None or budget > 0:
        return
    use = machine.memory_use()
    limit = f" of {use.what} ({human_bytes(use.limit)}, {human_bytes(use.used)} in use)" if use else ""
    problem = (f"the run will take about {memory.describe(streaming)} more memory than it holds now, but "
               f"{human_bytes(machine.available_memory() or 0)} is left{limit}{_per_job()}")
    remedy = (f"lower --batch_size{', --shuffle_buffer' if streaming else ''} or --num_readers, or give it more "
              "memory")
    if check == "refuse" and use is not None and use.what != machine.MACHINE_MEMORY:
        raise MemoryLimitReached(f"{problem}: the kernel would kill it part-way; {remedy} (or --memory_check warn to "
                                 "try anyway)")
    log.warning("%s: the kernel is likely to kill it part-way; %s", problem, remedy)


@contextlib.contextmanager
def memory_watch(seconds: Optional[float] = None, stops: bool = True) -> Iterator[None]:
    """While the block runs, a thread reads the memory in use against its tightest limit every `seconds` (default
    WATCH_SECONDS), warns once when it passes WATCH_WARN_AT of it, and with `stops`, under a cgroup at
    WATCH_STOP_AT, has check_memory_limit stop the run: an out-of-memory kill (SIGKILL) leaves no line and no
    checkpoint of its own. (A torchrun process does not stop alone: its peers would wait for it.)"""
    stop = threading.Event()
    every = WATCH_SECONDS if seconds is None else seconds
    _limit_reached.clear()
    thread = threading.Thread(target=_watch, args=(stop, every, stops), name="yt8m-memory-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        _limit_reached.clear()


def check_memory_limit() -> None:
    """Raise MemoryLimitReached where the watch saw the memory in use at WATCH_STOP_AT of a cgroup's limit (the
    training loop asks after each step)."""
    if _limit_reached:
        use = _limit_reached[0]
        raise MemoryLimitReached(f"stopped: memory in use reached {human_bytes(use.used)}, {_percent(use)} of "
                                 f"{use.what} ({human_bytes(use.limit)}), where the kernel kills the run; lower "
                                 f"--batch_size or --num_readers, turn off --cache_in_memory, or give it more memory")


def _watch(stop: threading.Event, seconds: float, stops: bool) -> None:
    warned = False
    while not stop.wait(seconds):
        use: Optional[machine.MemoryUse] = machine.memory_use()
        if use is None:
            continue
        if not warned and use.used >= WATCH_WARN_AT * use.limit:
            warned = True
            log.warning("memory in use is %s, %s of %s (%s): the kernel kills the run when it is reached, without a "
                        "word in this log; lower --batch_size or --num_readers, turn off --cache_in_memory, or give "
                        "the run more memory", human_bytes(use.used), _percent(use), use.what, human_bytes(use.limit))
        if stops and use.used >= WATCH_STOP_AT * use.limit and use.what != machine.MACHINE_MEMORY:
            _limit_reached.append(use)
            return


def _percent(use: machine.MemoryUse) -> str:
    return f"{100 * use.used / use.limit:.0f}%"

"""How a dataset's batches reach their consumer: in-process, or from DataLoader workers through shared-memory slots,
each batch with the read counts its worker met (and a worker's data error raised in the main process as it was)."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import signal
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Protocol, cast

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from yt8m.data.reading import memory_budget
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.batch_build import ROW_FRAMES, finish_batch
from yt8m.data.reading.batch_memory import BatchMemory, SharedSlots
from yt8m.data.reading.memory_budget import human_bytes
from yt8m.data.reading.read_stats import ReadCounter, ReadStats
from yt8m.data.reading.spec import FeatureSpec
from yt8m.runtime import processes_sharing_machine

# Shared-memory batch slots per reader process: the batches it has sent ahead (the DataLoader's prefetch_factor) and
# the one it fills.
SLOTS_PER_WORKER = 3
# Of /dev/shm's free space, what the slots may take: torch sends the rest of each batch (labels, ids) through it too.
SHM_SHARE = 0.9
log = logging.getLogger(__name__)


class DeliveringDataset(Protocol):
    """What BatchLoader uses of its dataset (YT8MDataset): its batch shape, where its workers' batches lie, its read
    counts, and the flag its workers set to send Delivery items."""

    spec: FeatureSpec
    batch_size: int
    memory: BatchMemory
    counter: ReadCounter
    batch_loader_worker: bool


@dataclass
class Delivery:
    """What a DataLoader worker sends: a batch, and what it met since the last one (its read counts, or the data
    error that ended its reading); BatchLoader takes the counts and the error out in the main process."""

    batch: Optional[Batch] = None
    read_stats: Optional[ReadStats] = None
    error: Optional[BaseException] = None
    num_classes: int = 0  # what the batch's label ids expand to
    worker: tuple[int, int] = (0, 0)  # the sending worker's pid and resident memory (bytes) as it sent

    def pin_memory(self) -> "Delivery":
        """Called by the DataLoader's pinning thread (pin_memory=True), off the training loop's thread: the batch
        made whole (finish_batch) in pinned memory, its features copied out of their shared slot (freeing it)."""
        if self.batch is None:
            return self
        batch = finish_batch(self.batch, self.num_classes, pin_memory=True)
        return Delivery(batch.pin_memory(), self.read_stats, self.error, self.num_classes, self.worker)


def in_process(batches: Iterator[Batch], counter: ReadCounter, num_classes: int,
               pin_memory: bool) -> Iterator[Batch]:
    """In the process reading (or a worker of a DataLoader of one's own): the batches made whole, what reading met
    absorbed into the counter's total batch by batch."""
    for batch in batches:
        counter.absorb(counter.take_unsent())
        yield finish_batch(batch, num_classes, pin_memory)
    counter.absorb(counter.take_unsent())


def worker_deliveries(batches: Iterator[Batch], counter: ReadCounter, num_classes: int) -> Iterator[Delivery]:
    """In a worker of a BatchLoader: each batch (labels as LabelIds) with what was read since the last, then what was
    read after it; a data error is sent as data."""
    try:
        for batch in batches:
            yield Delivery(batch, counter.take_unsent() or None, num_classes=num_classes, worker=_own_memory())
        if counter.unsent:
            yield Delivery(read_stats=counter.take_unsent())
    except (ValueError, OSError) as err:
        if not _sendable(err):
            raise
        # Sent as data: torch would re-create it with the worker's traceback in its message.
        yield Delivery(error=err)


class BatchLoader(DataLoader):
    """A DataLoader over a YT8MDataset whose workers send LabelIds, expanded into multi-hot tensors here in the main
    process, with their read counts, added to the dataset's `read_stats`. A data error in a worker (RecordError,
    CorruptRecordError, another ValueError or OSError) is raised here as it was there: same type, same message."""

    # A generator of whole batches where DataLoader's own __iter__ returns its iterator object: callers only iterate.
    def __iter__(self) -> Iterator[Batch]:  # type: ignore[override]
        dataset = self.delivering
        if self.num_workers == 0:  # the batches themselves (pinned by the DataLoader where asked)
            yield from super().__iter__()
            return
        # DataLoader sets 2 where workers run and none was given
        assert self.prefetch_factor is not None, "a DataLoader with workers has a prefetch_factor"
        slots = SharedSlots(self.num_workers, self.prefetch_factor + 1, slot_bytes(dataset),
                            self.multiprocessing_context or torch.multiprocessing)
        dataset.memory.slots = slots
        try:
            deliveries = super().__iter__()  # starts the workers, which take the slots with the dataset
        finally:
            dataset.memory.slots = None
        try:
            for delivery in deliveries:
                _WORKER_RSS[delivery.worker[0]] = delivery.worker[1]
                if delivery.error is not None:
                    raise delivery.error
                if delivery.read_stats is not None:
                    dataset.counter.absorb(delivery.read_stats)
                if delivery.batch is not None:
                    yield finish_batch(delivery.batch, dataset.spec.num_classes, self.pin_memory)
        except RuntimeError as err:
            # torch's "exited unexpectedly" drops how: its worker processes (a private list, read if there) keep it.
            exits = {worker.pid: worker.exitcode for worker in getattr(deliveries, "_workers", [])}
            died = reader_worker_death(err, exits)
            if died is None:
                raise
            raise died from err
        # Held until here, while the workers run: the pinning thread finds the slots by their token, which holds them
        # only weakly.
        del slots

    @property
    def delivering(self) -> DeliveringDataset:
        """The dataset, as what BatchLoader uses of it: batch_loader, which makes every BatchLoader, takes only a
        DeliveringDataset."""
        return cast(DeliveringDataset, self.dataset)

    @property
    def read_stats(self) -> ReadStats:
        return self.delivering.counter.total


def batch_loader(dataset: DeliveringDataset, num_workers: int, pin_memory: bool) -> BatchLoader:
    """A BatchLoader passing the dataset's batches through (batch_size=None), read by `num_workers` processes started
    anew each epoch (so that `set_epoch` reaches them); in-process batches are made in pinned memory where asked."""
    num_workers = workers_fitting_shm(dataset, num_workers, SLOTS_PER_WORKER)
    dataset.memory.pin_memory = pin_memory and num_workers == 0
    # A DeliveringDataset is a torch Dataset (YT8MDataset) that the Protocol cannot name as such.
    return BatchLoader(cast(Dataset, dataset), batch_size=None, num_workers=num_workers, collate_fn=_as_is,
                       pin_memory=pin_memory, worker_init_fn=_deliver_to_batch_loader, persistent_workers=False,
                       prefetch_factor=SLOTS_PER_WORKER - 1 if num_workers > 0 else None)


def workers_fitting_shm(dataset: DeliveringDataset, num_workers: int, depth: int) -> int:
    """The reader processes whose batch slots (`depth` a worker) fit the free space of /dev/shm: `num_workers`, or
    fewer (0: in-process) with one warning naming the size needed, as a container's small /dev/shm would otherwise
    kill a worker with SIGBUS mid-run."""
    per_worker = depth * slot_bytes(dataset)
    free = memory_budget.shm_free_bytes()
    if num_workers == 0 or per_worker == 0 or free is None:
        return num_workers
    room = int(free * SHM_SHARE) // processes_sharing_machine()  # every process of the machine takes its slots
    if num_workers * per_worker <= room:
        return num_workers
    fitting = room // per_worker
    needed = human_bytes(num_workers * per_worker / SHM_SHARE)
    log.warning("/dev/shm has %s free, less than the %s that %d reader processes' batch slots need (%d batches of %s "
                "each): reading %s instead; give the container more shared memory (Docker: --shm-size=%s or more)",
                human_bytes(free), human_bytes(num_workers * per_worker), num_workers, depth,
                human_bytes(per_worker // depth), _readers(fitting), needed.replace(" ", ""))
    return fitting


def slot_bytes(dataset: DeliveringDataset) -> int:
    """The bytes of a worker's batch tensor: float32 [B, D] video level, uint8 [B, max_frames, D] frame level (rated
    segments are sent as torch sends tensors: they take no slot)."""
    spec = dataset.spec
    if spec.segment_labels:
        return 0
    if spec.frame_features:
        return dataset.batch_size * min(spec.max_frames, ROW_FRAMES) * spec.feature_size
    return dataset.batch_size * spec.feature_size * torch.float32.itemsize


def _readers(workers: int) -> str:
    return f"with {workers} worker process{'es' if workers > 1 else ''}" if workers else "in-process"


def _sendable(err: BaseException) -> bool:
    """Whether a worker can send `err` as data; the worker's traceback goes along as a note (Python 3.11+), shown
    wherever a traceback is printed."""
    if hasattr(err, "add_note"):
        err.add_note("Raised in a DataLoader worker process:\n" + "".join(traceback.format_tb(err.__traceback__)))
    try:
        pickle.dumps(err)
    except Exception:  # anything unpicklable takes torch's own way, traceback in the message
        return False
    return True


def _deliver_to_batch_loader(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None, "a worker_init_fn runs in a DataLoader worker, which has its worker info"
    cast(DeliveringDataset, info.dataset).batch_loader_worker = True  # batch_loader's datasets are DeliveringDatasets


def _as_is(item: Any) -> Any:
    return item


class ReaderWorkerDied(OSError):
    """A DataLoader worker (a --num_readers reader process) died: killed by a signal (the out-of-memory killer's
    SIGKILL, most often) or exited; one line names it, the signal, the likely cause and its last memory seen."""


# The last resident memory each worker reported with a batch, by pid: what a killed worker's message quotes.
_WORKER_RSS: dict[int, int] = {}
_WORKER_DEATH = re.compile(r"DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\) (is killed by signal: (.*?)\.|exited "
                           r"unexpectedly(?: with exit code (-?\d+))?)")
# What a worker's signal most likely means, for its one line.
LIKELY_CAUSES: dict[int, str] = {
    int(signal.SIGKILL): "likely out of memory (the kernel's OOM killer sends it; lower --batch_size or --num_readers, "
                         "or free memory)",
    int(signal.SIGSEGV): "a crash in native code",
    int(signal.SIGBUS): "shared memory (/dev/shm) ran out",
}


def reader_worker_death(err: BaseException, exits: Optional[dict[int, Any]] = None) -> Optional[ReaderWorkerDied]:
    """`err` (torch's RuntimeError for a dead DataLoader worker, raised where the main process was when it noticed)
    as one line, or None for any other error; `exits`: the workers' exit codes by pid, where known."""
    if isinstance(err, ReaderWorkerDied):
        return err
    found = _WORKER_DEATH.search(str(err)) if isinstance(err, RuntimeError) else None
    if found is None:
        return None
    pids = [int(pid) for pid in found.group(1).replace(" ", "").split(",") if pid]
    codes = [code for pid in pids for code in [(exits or {}).get(pid)] if isinstance(code, int)]
    number = _signal_number(found.group(3)) if found.group(3) else (-codes[0] if codes and codes[0] < 0 else 0)
    if number or found.group(3):
        cause = LIKELY_CAUSES.get(number, "killed from outside")
        how = f"was killed by signal {number or '?'} ({_signal_name(number, found.group(3) or '')}): {cause}"
    else:
        code = found.group(4) or (str(codes[0]) if codes else None)
        how = f"exited unexpectedly{f' with exit code {code}' if code else ''}"
    seen = [f"{_WORKER_RSS[pid] / 2 ** 20:.0f} MiB" for pid in pids if _WORKER_RSS.get(pid)]
    memory = f"; its memory when it last sent a batch: {', '.join(seen)} resident" if seen else ""
    return ReaderWorkerDied(f"reader process (DataLoader worker, pid {', '.join(map(str, pids))}) {how}{memory}")


@contextlib.contextmanager
def worker_deaths_deferred() -> Iterator[None]:
    """Within: a reader's death, which torch's SIGCHLD handler raises wherever the main thread is, waits for the end
    of the block (an optimizer step, a checkpoint's write), so that what the run then saves is whole."""
    # Only the main thread sets handlers; one installed from C (getsignal None) could not be put back: left as is.
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGCHLD") or \
            signal.getsignal(signal.SIGCHLD) is None:
        yield
        return
    pending: list[Any] = []
    previous = signal.signal(signal.SIGCHLD, lambda signum, frame: pending.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)
        if pending and callable(previous):
            previous(signal.SIGCHLD, pending[-1])


def _signal_number(description: str) -> int:
    """The signal torch described by its strsignal text ("Killed", "Segmentation fault")."""
    for number in signal.Signals:
        if signal.strsignal(number) == description:
            return int(number)
    return 0


def _signal_name(number: int, description: str) -> str:
    return signal.Signals(number).name if number else description


def _own_memory() -> tuple[int, int]:
    """This process's pid and resident bytes, read from /proc (a few microseconds a batch; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as statm:
            return os.getpid(), int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return os.getpid(), 0

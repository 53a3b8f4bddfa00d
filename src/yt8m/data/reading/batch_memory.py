"""Where batch tensors live: shared-memory slots that DataLoader workers decode into and the main process copies out
of, and recycled buffers for the batches a process makes itself (bench/README.md: fresh memory faults every 4 KB)."""

from __future__ import annotations

import itertools
import sys
import weakref
from typing import Any, NamedTuple, Optional

import numpy as np
import torch
from torch.utils.data import get_worker_info

# The pools alive in this process, by token: the DataLoader's pinning thread finds a delivery's pool here.
_POOLS: "weakref.WeakValueDictionary[int, SharedSlots]" = weakref.WeakValueDictionary()
_TOKENS = itertools.count()


class SlotRef(NamedTuple):
    """Where a worker's batch tensor lies: pool, worker, slot, and its shape and dtype."""

    pool: int
    worker: int
    slot: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def fresh_shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor in fresh shared memory, its pages zeroed by the kernel as they are first written; sending it to
    another process (torch.multiprocessing) copies nothing."""
    count = int(np.prod(shape))
    # What torch.multiprocessing itself uses for a tensor it sends.
    storage = torch.UntypedStorage._new_shared(count * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, (count,), (1,)).view(shape)  # 1-D, contiguous


# Buffers kept for reuse, at most: more are in use only while a consumer holds on to that many batches.
RECYCLED_BUFFERS = 8


class RecycledBuffers:
    """Memory for batch tensors, taken back once no tensor uses it.

    A tensor made by torch.from_numpy keeps its array alive, and so do its views: a buffer whose only reference is
    this pool's is free. Hand-written because torch's CPU allocator returns blocks of a batch's size (tens of MB) to
    the kernel, so each new batch page-faults every 4 KB: 3,200 faults and 11.5 ms to copy a 22 MB frame batch into
    fresh memory, 0 faults and 2.4 ms into reused memory (AMD EPYC, one thread).
    """

    def __init__(self) -> None:
        self.buffers: list[np.ndarray] = []

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized tensor of `shape` and `dtype` in a free buffer (a new one where none is)."""
        nbytes = int(np.prod(shape)) * dtype.itemsize
        buffer = next((self.buffers[index] for index in range(len(self.buffers))
                       # 2: the list's reference and getrefcount's argument; one more means a tensor uses it
                       if len(self.buffers[index]) == nbytes and sys.getrefcount(self.buffers[index]) == 2), None)
        if buffer is None:
            buffer = np.empty(nbytes, np.uint8)
            if len(self.buffers) < RECYCLED_BUFFERS:
                self.buffers.append(buffer)
        return torch.from_numpy(buffer[:]).view(dtype).view(shape)


class SharedSlots:
    """`depth` shared-memory buffers of `nbytes` per worker, used in turn, and a semaphore per worker counting its free
    ones: a worker waits for a free slot, the main process frees one when it has copied a batch out.

    Made in the main process before the workers start, and handed to them with the dataset (inherited, or pickled
    by torch.multiprocessing, which shares the memory): a worker's slots must be copied out in the order it filled
    them, which is the order a DataLoader delivers each worker's batches in.
    """

    def __init__(self, workers: int, depth: int, nbytes: int, context: Any):
        self.token = next(_TOKENS)
        self.depth = depth
        self.buffers = [[fresh_shared((nbytes,), torch.uint8) for _ in range(depth)] for _ in range(workers)]
        self.free = [context.Semaphore(depth) for _ in range(workers)]
        self.next_slot = [0] * workers  # a worker's own turn (each process has its copy)
        self.copies = RecycledBuffers()  # in the main process: where batches are copied out to
        _POOLS[self.token] = self

    def take(self, worker: int, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[SlotRef, torch.Tensor]:
        """In a worker: its next slot (waiting until it is free) as a tensor of `shape` and `dtype`."""
        self.free[worker].acquire()
        slot = self.next_slot[worker]
        self.next_slot[worker] = (slot + 1) % self.depth
        ref = SlotRef(self.token, worker, slot, tuple(shape), dtype)
        return ref, self.view(ref)

    def view(self, ref: SlotRef) -> torch.Tensor:
        count = int(torch.Size(ref.shape).numel())
        nbytes = count * ref.dtype.itemsize
        return self.buffers[ref.worker][ref.slot][:nbytes].view(ref.dtype).view(ref.shape)

    def give_back(self, ref: SlotRef) -> None:
        """In a worker: free a slot it took but will not send (its batch outgrew it). Slots are taken in turn, so this
        one is the next to be taken again, after those sent before it are copied out."""
        self.free[ref.worker].release()

    def copy_out(self, ref: SlotRef, pin_memory: bool) -> torch.Tensor:
        """In the main process: the slot's tensor copied into memory of its own (pinned where asked), the slot freed.
        The copy is numpy's, on this thread: torch's would spread it over threads that the workers need."""
        if pin_memory:
            out = torch.empty(ref.shape, dtype=ref.dtype, pin_memory=True)
        else:
            out = self.copies.tensor(ref.shape, ref.dtype)
        np.copyto(out.numpy(), self.view(ref).numpy())
        self.free[ref.worker].release()
        return out


def copy_out(ref: SlotRef, pin_memory: bool) -> torch.Tensor:
    """SharedSlots.copy_out by the pool's token, from any thread of the process that made the pool."""
    return _POOLS[ref.pool].copy_out(ref, pin_memory)


class BatchMemory:
    """Where a dataset's readers make their batch tensors: in a make_loader worker its shared slots (`slots`, set while
    the workers run), in another DataLoader's worker fresh shared memory, in-process pinned memory for a CUDA run
    (`pin_memory`) or recycled buffers."""

    def __init__(self) -> None:
        self.slots: Optional[SharedSlots] = None
        self.pin_memory = False
        self.recycled = RecycledBuffers()

    def new_tensor(self, shape: tuple[int, ...], dtype: torch.dtype,
                   in_slot: bool = True) -> tuple[Optional[SlotRef], torch.Tensor]:
        """A batch's tensor (contents undefined), with the slot it lies in where it is one (`in_slot`: may be)."""
        info = get_worker_info()
        if info is None and self.pin_memory:
            return None, torch.empty(shape, dtype=dtype, pin_memory=True)
        if info is None:
            return None, self.recycled.tensor(shape, dtype)
        if self.slots is not None and in_slot:
            return self.slots.take(info.id, shape, dtype)
        return None, fresh_shared(shape, dtype)

    def free_slot(self, ref: SlotRef) -> None:
        """In a worker: give back a slot it took from `slots` (new_tensor) and will not send."""
        assert self.slots is not None, "a slot is given back where new_tensor took it, from slots"
        self.slots.give_back(ref)

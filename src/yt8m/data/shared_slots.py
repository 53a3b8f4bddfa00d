"""Shared-memory slots that DataLoader workers decode batches into, reused batch after batch: a batch crosses to the
main process as a slot number beside its small parts (ids, labels), and is copied out there, freeing the slot.

Why not torch's own tensor passing: it sends each batch in fresh shared memory, a page fault per 4 KB on both sides
(bench/README.md: a worker then read frame-level data at half the in-process speed); a slot's pages are faulted once.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, NamedTuple

import torch

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
        self.buffers = [[torch.empty(nbytes, dtype=torch.uint8).share_memory_() for _ in range(depth)]
                        for _ in range(workers)]
        self.free = [context.Semaphore(depth) for _ in range(workers)]
        self.next_slot = [0] * workers  # a worker's own turn (each process has its copy)
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
        """In the main process: the slot's tensor copied into memory of its own (pinned where asked), the slot freed."""
        out = torch.empty(ref.shape, dtype=ref.dtype, pin_memory=pin_memory)
        out.copy_(self.view(ref))
        self.free[ref.worker].release()
        return out


def copy_out(ref: SlotRef, pin_memory: bool) -> torch.Tensor:
    """SharedSlots.copy_out by the pool's token, from any thread of the process that made the pool."""
    return _POOLS[ref.pool].copy_out(ref, pin_memory)

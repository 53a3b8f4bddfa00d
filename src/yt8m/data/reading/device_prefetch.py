"""Batches on their way to the device one step ahead: on CUDA the next batch is copied (from pinned memory, on a
stream of its own) while the current step runs; elsewhere batches pass through as they are."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from yt8m.data.reading.batch import Batch


def to_device_ahead(batches: Iterable[Batch], device: torch.device) -> Iterator[Batch]:
    """The batches, on `device`: on CUDA batch n + 1's host-to-device copy is issued before batch n is handed out, so
    it overlaps step n; the consumer's stream waits for a batch's copy before its first use. Elsewhere (CPU) the
    batches as they come."""
    if device.type != "cuda":
        yield from batches
        return
    copy_stream = torch.cuda.Stream(device)
    pending = None
    for batch in batches:
        with torch.cuda.stream(copy_stream):
            moved = batch.to(device)  # non_blocking: the loader's batches are pinned
        copied = copy_stream.record_event()
        if pending is not None:
            yield _ready(*pending, device)
        pending = (moved, copied)
    if pending is not None:
        yield _ready(*pending, device)


def _ready(batch: Batch, copied: torch.cuda.Event, device: torch.device) -> Batch:
    """`batch` for the current stream: it waits for the copy, and the copy stream's allocator does not reuse the
    tensors' memory while the current stream may still read them."""
    stream = torch.cuda.current_stream(device)
    stream.wait_event(copied)
    for tensor in batch.tensors():
        tensor.record_stream(stream)
    return batch

"""The fused kernels' work split over threads: each C call takes a slice of rows (or channels) and releases the GIL,
so that torch's threads' worth of slices run at once."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import numpy as np
import torch

Result = TypeVar("Result")
_pool: dict[int, ThreadPoolExecutor] = {}
# A forked child has none of the parent's pool threads: it starts its own pool.
os.register_at_fork(after_in_child=_pool.clear)


def over_rows(kernel: Callable[..., Result], rows: int, *args: object, grain: int = 1) -> list[Result]:
    """Run kernel(*args, row_start, row_end) over [0, rows) in as many slices as torch has threads, each of at least
    `grain` rows (smaller work costs more to hand to a thread than it saves); returns each slice's result, in order."""
    threads = max(1, min(torch.get_num_threads(), rows // grain))
    bounds = [rows * k // threads for k in range(threads + 1)]
    if threads == 1:
        return [kernel(*args, 0, rows)]
    pool = _pool.get(threads) or _pool.setdefault(threads, ThreadPoolExecutor(threads, "yt8m-kernel"))
    submitted = [pool.submit(kernel, *args, start, end) for start, end in zip(bounds, bounds[1:])]
    return [done.result() for done in submitted]


def as_arrays(*tensors: torch.Tensor) -> list[np.ndarray]:
    """The kernels' buffers: NumPy views sharing the tensors' memory."""
    return [tensor.detach().numpy() for tensor in tensors]

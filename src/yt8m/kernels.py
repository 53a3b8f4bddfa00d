"""The fused CPU kernels of training (_kernels.c) from Python: when they apply, and their work split over threads.

Callers are the models' fused layers (models/fused.py), the loss (losses.py) and the optimizer step (optim.py).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import torch

from yt8m import _kernels  # noqa: F401  (re-exported to the callers)

Result = TypeVar("Result")
# Elements per thread at least for element-wise kernels: smaller slices cost more to hand to a thread than they save.
ELEMENTS_PER_THREAD = 1 << 16
_pool: dict[int, ThreadPoolExecutor] = {}
# A forked child has none of the parent's pool threads: it starts its own pool.
os.register_at_fork(after_in_child=_pool.clear)


def use_fused_kernels(*tensors: torch.Tensor) -> bool:
    """True for contiguous float32 CPU tensors outside tracing (torch.compile, ONNX export) and CPU autocast: the
    kernels' case. Elsewhere (accelerators, bfloat16 autocast, tracing) the eager reference runs."""
    return not torch.compiler.is_compiling() and not torch.is_autocast_enabled("cpu") and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def over_rows(kernel: Callable[..., Result], rows: int, *args: object, grain: int = 1) -> list[Result]:
    """Run kernel(*args, row_start, row_end) over [0, rows) in as many slices as torch has threads, each of at least
    `grain` rows (smaller work costs more to hand to a thread than it saves); returns each slice's result, in order."""
    threads = max(1, min(torch.get_num_threads(), rows // grain))
    bounds = [rows * k // threads for k in range(threads + 1)]
    if threads == 1:
        return [kernel(*args, 0, rows)]
    pool = _pool.get(threads) or _pool.setdefault(threads, ThreadPoolExecutor(threads, "yt8m-kernel"))
    return [done.result() for done in [pool.submit(kernel, *args, start, end) for start, end in zip(bounds, bounds[1:])]]


def as_arrays(*tensors: torch.Tensor) -> list:
    """The kernels' buffers: NumPy views sharing the tensors' memory."""
    return [tensor.detach().numpy() for tensor in tensors]

"""The process-wide settings the `yt8m` commands make for their kind of work: training commands (`train`, `tune`)
speed training up; streaming commands (eval, predict, score, convert-predictions) keep their memory flat. Importing
yt8m makes none, and no setting changes a value a command computes or prints; bench/README.md has the figures."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from typing import Callable, Optional

log = logging.getLogger("yt8m")
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_DEFAULT_MMAP_THRESHOLD = 128 * 1024  # glibc's, before it adjusts it
_DEFAULT_MMAP_MAX = 65536  # glibc's: how many blocks may be mapped on their own at once
LARGEST_MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit


def configure_training_process() -> None:
    """Make the three settings, in the order they must come: the OpenMP wait policy before torch loads."""
    sleep_idle_openmp_threads()
    reuse_freed_memory()
    flush_denormals()


def configure_streaming_process() -> None:
    """The setting of the commands that stream inputs of any size: memory that does not grow with them."""
    map_large_blocks()


def sleep_idle_openmp_threads() -> None:
    """OMP_WAIT_POLICY=PASSIVE (unless the user set it): idle OpenMP threads sleep at the end of a matmul instead of
    spinning on the cores that the fused kernels' threads and the optimizer step run on next (bare LogisticModel
    step: 76 -> 71 ms median). OpenMP reads it once, when torch loads: where torch is already imported, only this
    process's children get it."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "torch" in sys.modules:
        log.debug("torch was imported before the OpenMP wait policy was set: it applies to child processes only")


def reuse_freed_memory() -> None:
    """Have glibc's malloc keep freed blocks of every size for reuse.

    By default it maps each block over 32 MB afresh and unmaps it when freed, so each step's large tensors (MoE
    logits and gradients, weight gradients) page-fault once per 4 KB: MoeModel trains 12% faster without that
    (bench/bench_train.py: 2,326 -> 2,615 examples/s). Outside training it only costs memory (`yt8m eval` of a
    MoeModel: 1.48 instead of 0.77 GB peak), hence training commands only. A no-op where mallopt is missing.
    """
    mallopt = _mallopt()
    if mallopt is None:
        return
    mallopt(_M_MMAP_MAX, 0)  # no block is mapped on its own: all come from the heap, and go back to it
    mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1)  # the heap's free top is returned to the system only past 2 GB


def map_large_blocks() -> None:
    """Have glibc's malloc map each block over 128 KB on its own and unmap it when freed, always.

    By default glibc raises that threshold to the size of each mapped block freed (up to 32 MB), and from then on
    serves batch-sized tensors from its heap, where the smaller blocks that outlive a batch split its free space:
    the heap grew with every batch, free memory it could not reuse (`yt8m eval` of a MoeModel: about 4 KB more per
    video, 0.68 GB at 18,654 real videos, 0.83 GB at 55,962; 0.59 GB at both with this). A fixed threshold stops
    that; it costs a page fault per 4 KB of each batch's large blocks (4-7% more CPU time in that eval; see
    bench/README.md). A no-op where mallopt is missing.
    """
    mallopt = _mallopt()
    if mallopt is None:
        return
    mallopt(_M_MMAP_THRESHOLD, _DEFAULT_MMAP_THRESHOLD)


def map_frame_batch_blocks() -> None:
    """For frame-level training, after reuse_freed_memory: blocks over 32 MB mapped on their own and unmapped when
    freed, smaller ones still kept in the heap for reuse.

    A frame-level batch's float32 copies (dequantized, normalized, pooled: 1.4 GB each at batch 1024 of 300 frames)
    left the heap split between the blocks that outlived a step, and it grew by about one batch's copies a step,
    free memory it could not reuse (FrameLevelLogisticModel on 6 real-size shards: 8.6 GB peak RSS at step 3, of
    which malloc_trim found 5 GB free; bench_release_scale.py's frames part has the figures). A no-op where mallopt
    is missing.
    """
    mallopt = _mallopt()
    if mallopt is None:
        return
    mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
    mallopt(_M_MMAP_THRESHOLD, LARGEST_MMAP_THRESHOLD)


def _mallopt() -> Optional[Callable[[int, int], int]]:
    """glibc's mallopt, or None where the C library has none."""
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return None


def flush_denormals() -> None:
    """Flush float32 denormals to zero on the CPU, as TensorFlow's CPU threads do (the starter kit trained so):
    gradients that decay into the denormal range take a slow microcode path in every op that reads them, DbofModel's
    matmuls among them (its bare step: 534 -> 472 ms median). Threads started afterwards (torch's OpenMP workers,
    the fused kernels' pool) inherit it from the thread that makes it, so it cannot be undone for them: values
    computed in this process afterwards lose their denormals. A no-op where the CPU lacks it."""
    import torch  # after the OpenMP setting: torch reads it as it loads

    torch.set_flush_denormal(True)

"""Process-level plumbing shared by train, eval and predict: logging, device choice, batch transfer.

Kept apart from the commands so that each of them sets up a run the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
from typing import Any, ContextManager

import torch

log = logging.getLogger("yt8m")
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_DEFAULT_MMAP_THRESHOLD = 128 * 1024  # glibc's, before it adjusts it


def reuse_freed_memory() -> None:
    """Have glibc's malloc keep freed blocks of every size for reuse (a process setting, made by the `yt8m` command).

    By default it maps each block over 32 MB afresh and unmaps it when freed, so each step's large tensors (MoE
    logits and gradients, weight gradients) page-fault once per 4 KB: MoeModel trains 12% faster without that
    (bench/bench_train.py: 2,326 -> 2,615 examples/s). A no-op where mallopt is missing (not glibc).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return
    mallopt(_M_MMAP_MAX, 0)  # no block is mapped on its own: all come from the heap, and go back to it
    mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1)  # the heap's free top is returned to the system only past 2 GB


def map_large_blocks() -> None:
    """Have glibc's malloc map each block over 128 KB on its own and unmap it when freed, always (a process setting,
    made by the `yt8m` commands that stream inputs of any size: eval, predict, score, convert-predictions).

    By default glibc raises that threshold to the size of each mapped block freed (up to 32 MB), and from then on
    serves batch-sized tensors from its heap, where the smaller blocks that outlive a batch split its free space:
    the heap grew with every batch, free memory it could not reuse (`yt8m eval` of a MoeModel: about 4 KB more per
    video, 0.68 GB at 18,654 real videos, 0.83 GB at 55,962; 0.59 GB at both with this). A fixed threshold stops
    that; it costs a page fault per 4 KB of each batch's large blocks (4-7% more CPU time in that eval; see
    bench/README.md). A no-op where mallopt is missing.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return
    mallopt(_M_MMAP_THRESHOLD, _DEFAULT_MMAP_THRESHOLD)


def flush_denormals() -> None:
    """Flush float32 denormals to zero on the CPU, as TensorFlow's CPU threads do (the starter kit trained so):
    gradients that decay into the denormal range take a slow microcode path in every op that reads them, DbofModel's
    matmuls among them (its bare step: 534 -> 472 ms median). Threads started afterwards (torch's OpenMP workers,
    the fused kernels' pool) inherit the setting from the one that makes it. A no-op where the CPU lacks it."""
    torch.set_flush_denormal(True)


def configure_process() -> None:
    """The process settings of the `yt8m` command (and of the benchmarks that time it), made before any thread
    starts: freed memory kept for reuse, denormals flushed to zero."""
    reuse_freed_memory()
    flush_denormals()


def setup_logging(level: int = logging.INFO) -> None:
    """Send log lines to stderr, so that stdout carries only the commands' JSON results."""
    logging.basicConfig(stream=sys.stderr, level=level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present; an explicit CUDA request without CUDA is an error, not a fallback."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return device


def available_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def reader_workers(requested: int) -> int:
    """DataLoader workers for --num_readers: more processes than CPUs only thrash."""
    cpus = available_cpus()
    if requested > cpus:
        log.info("--num_readers %d clamped to %d, the CPUs available to this process", requested, cpus)
        return cpus
    return max(requested, 0)


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Move a batch's tensors; non_blocking pays off only from pinned memory, which CUDA runs use."""
    non_blocking = device.type == "cuda"
    return {key: value.to(device, non_blocking=non_blocking) if torch.is_tensor(value) else value
            for key, value in batch.items()}


def autocast(device: torch.device, enabled: bool) -> ContextManager:
    """Mixed precision: on CUDA bfloat16 where the GPU has it (no loss scaling needed), else float16; on the CPU
    bfloat16, whose matmuls run on AMX / AVX512-BF16 units where the CPU has them (7x fp32's on this project's
    Sapphire Rapids VM: 1024 x 1152 x 3862 in 4.7 instead of 33 ms)."""
    if not enabled or device.type not in ("cuda", "cpu"):
        return contextlib.nullcontext()
    if device.type == "cpu":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return torch.autocast("cuda", dtype=amp_dtype())


def amp_dtype() -> torch.dtype:
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16

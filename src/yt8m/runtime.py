"""Process-level plumbing shared by train, eval and predict: logging, device choice, batch transfer.

Kept apart from the commands so that each of them sets up a run the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import ContextManager, Optional

import torch

log = logging.getLogger("yt8m")
MAX_GPU_READERS = 16  # reader processes "auto" starts on a GPU machine, at most


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


DEVICE_HELP = "'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'."


def device_problem(name: str) -> Optional[str]:
    """The check of a --device setting: None, or why `name` is not a device."""
    if name == "auto":
        return None
    try:
        torch.device(name)
    except (RuntimeError, ValueError):
        return f"{name!r} is not a device: use auto, cpu, cuda or cuda:N"
    return None


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as the CUDA runtime reads CUDA_VISIBLE_DEVICES where it is set (indices or
    UUIDs, up to the first invalid entry such as -1; empty: none), else every device torch sees."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return [str(index) for index in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    entries = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return entries


def available_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# Concurrent jobs of this machine (yt8m tune --n_jobs), set in each; the processes a job starts (a trial's torchrun
# ranks with --gpus_per_trial) read it from the environment.
JOBS_ENV = "YT8M_TUNE_JOBS"
_jobs_sharing = int(os.environ.get(JOBS_ENV, "1")) if os.environ.get(JOBS_ENV, "").isdigit() else 1


def share_machine_among(jobs: int) -> None:
    """Set in each of `jobs` concurrent jobs (tune --n_jobs): each takes only its share of the CPUs and memory."""
    global _jobs_sharing
    _jobs_sharing = max(1, jobs)
    os.environ[JOBS_ENV] = str(_jobs_sharing)


def jobs_sharing() -> int:
    return _jobs_sharing


def torchrun_processes_here() -> int:
    """This machine's processes of a torchrun run (LOCAL_WORLD_SIZE; 1 outside torchrun)."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return max(1, int(value)) if value.isdigit() else 1


def processes_sharing_machine() -> int:
    """The processes of this run that share this machine's CPUs and memory: torchrun's local ranks, times the tune
    jobs of each."""
    return _jobs_sharing * torchrun_processes_here()


def reader_workers(requested: int | str, frame_features: bool, accelerator: Optional[bool] = None) -> int:
    """DataLoader worker processes for --num_readers / --num_workers: "auto", or a count ("3" or 3) used as given
    but clamped to this process's CPUs (more processes than CPUs only thrash). The choice is logged. This process's
    CPUs are the machine's divided among the processes sharing it (torchrun's local ranks, tune's jobs): 8 ranks on a
    16-CPU node read with one worker each, not 15.

    "auto" on a machine with a GPU (`accelerator`; default: CUDA is available) takes this process's CPUs but one, up
    to 16: the training loop keeps its core to launch the GPU's work, every other core decodes. The GPU steps take
    7,700-9,000 frame-level videos/s (compiled bf16 NeXtVLAD/NetVLAD on an H200) where one reader process decodes
    7k-10k (`yt8m bench read` on this project's 2-CPU AMD EPYC, bench/README.md); a worker hands its batch over in a
    reused shared-memory slot, the main process copying it out at about 37 us a video, in a thread of its own when
    pinning.

    "auto" without a GPU reads in-process, except frame-level data with 4 CPUs or more, which gets min(CPUs // 2, 8)
    workers: the model then needs the cores. From `yt8m bench read` on the 2-CPU machine (busy, shared):
    - video-level: in-process reading costs about 3 us of CPU per example; a worker adds the main process's copy
      and labels (about 1 us), and with 2 CPUs competes with the model.
    - frame-level (300 frames): about 100 us of CPU per video in-process; one worker spends about as much (its start,
      100-150 ms, aside) and leaves the main process about 45 us: with cores to spare (4 or more, half of them left to
      the model) workers free the training loop; with 2 they compete with it. Above 2 CPUs this is a judgment from
      those costs, not a measurement.
    """
    cpus = _cpus_of_this_process()
    if requested == "auto":
        return _auto_readers(cpus, frame_features, accelerator)
    try:
        count = int(requested)
    except (TypeError, ValueError):
        count = -1
    if count < 0:
        raise ValueError(f"reader processes: expected 'auto' or a whole number >= 0, got {requested!r}")
    if count > cpus:
        log.info("reading with %d worker processes: %d asked for, clamped to the %s", cpus, count, _cpus_text(cpus))
        return cpus
    log.info("reading %s (as asked)", "in-process" if count == 0 else f"with {count} worker processes")
    return count


def _cpus_of_this_process() -> int:
    return max(1, available_cpus() // processes_sharing_machine())


def _cpus_text(cpus: int) -> str:
    sharing = processes_sharing_machine()
    return f"{cpus} CPUs" if sharing == 1 else f"{cpus} of {available_cpus()} CPUs ({sharing} processes share them)"


def _auto_readers(cpus: int, frame_features: bool, accelerator: Optional[bool]) -> int:
    kind = "frame-level" if frame_features else "video-level"
    gpu = torch.cuda.is_available() if accelerator is None else accelerator
    if gpu:
        workers = max(1, min(cpus - 1, MAX_GPU_READERS))
    else:
        workers = min(cpus // 2, 8) if frame_features and cpus >= 4 else 0
    machine = "a GPU machine" if gpu else "no GPU"
    if workers:
        log.info("reading with %d worker processes: %s, %s, %s data (auto)", workers, _cpus_text(cpus), machine, kind)
    else:
        log.info("reading in-process: %s, %s, %s data (auto)", _cpus_text(cpus), machine, kind)
    return workers


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

"""Where a study's jobs train: `--n_jobs auto` (one job per visible GPU, or per --gpus_per_trial of them; on the CPU,
the measured choice), each job's own GPUs (CUDA_VISIBLE_DEVICES, round-robin) and the devices a trial records."""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

import torch

from yt8m.runtime import available_cpus, resolve_device, visible_gpus

log = logging.getLogger("yt8m.tune")

AUTO = "auto"
# --n_jobs auto without a GPU. Measured (bench/README.md, "Trials an hour by --n_jobs"): on the 2-core VM, 2 jobs of
# one thread each gave 1.15x the trials an hour of 1 job of two threads on the same 8 trials, short of the 1.5x that
# would pay for two studies' worth of memory and a machine's worth of contention.
CPU_JOBS = 1
DEVICES_ATTR = "devices"  # trial user attribute: the GPUs its job was given, the device it trained on


def job_count_problem(value: Any) -> Optional[str]:
    """The check of --n_jobs: 'auto' or a count of at least 1."""
    if str(value) == AUTO or (str(value).isdigit() and int(value) >= 1):
        return None
    return f"must be 'auto' or a number of job processes >= 1, got {value!r}"


def job_count(value: Any, gpus_per_trial: int = 1, announce: bool = False) -> int:
    """--n_jobs as a count: as given, or for 'auto' one job per `gpus_per_trial` visible GPUs, else CPU_JOBS;
    `announce` logs the choice (once, where the study starts)."""
    if job_count_problem(value) is not None:
        return 1  # the tuning file's reading reports it, with the file's other problems
    if str(value) != AUTO:
        return int(value)
    gpus = visible_gpus()
    if gpus:
        jobs = max(1, len(gpus) // gpus_per_trial)
        if announce:
            log.info("--n_jobs auto: %d job(s), %d GPU(s) each, of the visible %s", jobs, gpus_per_trial,
                     ",".join(gpus))
            if not torch.cuda.is_available():
                log.warning("CUDA_VISIBLE_DEVICES names %d GPU(s), but torch sees no CUDA here: the trials train "
                            "on the CPU", len(gpus))
        return jobs
    if announce:
        log.info("--n_jobs auto: %d job on %d CPU(s) without a GPU (the measured choice: bench/README.md, "
                 "\"Trials an hour by --n_jobs\")", CPU_JOBS, available_cpus())
    return CPU_JOBS


def check_gpus_per_trial(gpus_per_trial: int) -> None:
    """A trial of more GPUs than this machine shows cannot be given its own: one line, before the study starts
    (without a GPU, its K processes train on the CPU)."""
    gpus = visible_gpus()
    if gpus and gpus_per_trial > len(gpus):
        raise ValueError(f"--gpus_per_trial {gpus_per_trial}: this machine shows {len(gpus)} GPU(s) "
                         f"({','.join(gpus)}); a trial takes at most that many")


def job_devices(job: int, gpus_per_trial: int, gpus: list[str]) -> Optional[str]:
    """CUDA_VISIBLE_DEVICES of job `job`: the visible GPUs at positions job*K .. job*K+K-1 (round-robin), so that
    jobs up to the GPUs' count never share one; None without a GPU."""
    if not gpus:
        return None
    return ",".join(gpus[(job * gpus_per_trial + index) % len(gpus)] for index in range(gpus_per_trial))


def use_job_devices(devices: Optional[str]) -> None:
    """In a job process, before anything initializes CUDA: see only the job's own GPUs."""
    if devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices


def trial_devices(device: str, processes: int) -> dict[str, Any]:
    """What a trial trains on: the GPUs its job sees, its --device resolved, and its processes (--gpus_per_trial:
    each rank takes cuda:LOCAL_RANK of the job's GPUs)."""
    return {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": str(resolve_device(device)),
            "processes": processes}

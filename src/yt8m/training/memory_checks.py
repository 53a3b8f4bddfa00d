"""Checks of what a training run will hold before it holds it: a RAM cache against the memory available (streaming
where it does not fit), and the checkpoints against the train dir's free disk space."""

from __future__ import annotations

import logging
from typing import Sequence

from yt8m.config import ConfigError
from yt8m.data import memory_budget as machine
from yt8m.data.cache_estimate import CacheEstimate, estimate_cache
from yt8m.data.dataset import YT8MDataset
from yt8m.data.memory_budget import human_bytes, jobs_sharing, memory_budget, processes_on_this_machine
from yt8m.io import storage
from yt8m.io.checkpoints import list_checkpoints
from yt8m.models.model_size import BYTES_PER_VALUE, ModelSize

log = logging.getLogger("yt8m.train")
OPTIMIZER_VALUES_PER_PARAMETER = 2  # Adam's moments


def cache_fits(datasets: Sequence[YT8MDataset], required: bool, what: str = "training data") -> bool:
    """Whether the datasets' RAM caches (--cache_in_memory; of `what`) fit this process's memory budget; where they
    do not, one warning and False (the caller streams), or with `required` (--cache_in_memory_required) one
    ConfigError."""
    estimate = sum((estimate_cache(dataset.paths, dataset.spec, dataset.options.skip_corrupt, dataset.plan.world_size,
                                   dataset.batch_size) for dataset in datasets), CacheEstimate(0, 0))
    budget = memory_budget()
    if budget is None or estimate.nbytes <= budget:
        log.info("caching the %s in RAM: estimate %s, within the %s available%s", what, estimate,
                 "unknown memory" if budget is None else human_bytes(budget), _per_job())
        return True
    problem = (f"the RAM cache of the {what} would take an estimated {estimate}, more than the "
               f"{human_bytes(budget)} available{_per_job()} (memory less a margin for the model and batches)")
    if required:
        raise ConfigError("--cache_in_memory_required", [f"{problem}: leave --cache_in_memory_required off to stream "
                                                          "instead, or set --cache_in_memory false"])
    log.warning("%s: streaming the shards instead (set --cache_in_memory false to skip this check, or "
                "--cache_in_memory_required to stop here instead)", problem)
    return False


def _per_job() -> str:
    jobs, processes = jobs_sharing(), processes_on_this_machine()
    shares = ([f"--n_jobs {jobs}"] if jobs > 1 else []) + ([f"{processes} torchrun processes"] if processes > 1 else [])
    return f" (this process's share: 1/{jobs * processes} for {' x '.join(shares)})" if shares else ""


def checkpoint_bytes(size: ModelSize) -> int:
    """A checkpoint's size, roughly: the model's values (model_size.json's) and the optimizer's state, taken as
    Adam's two values a parameter (the most of torch's usual optimizers), all float32."""
    return (size.buffer_values + size.parameters * (1 + OPTIMIZER_VALUES_PER_PARAMETER)) * BYTES_PER_VALUE


def warn_if_disk_short(train_dir: str, one_checkpoint: int, keep_checkpoints: int) -> None:
    """One warning where the train dir's volume (local only) lacks room for keep_checkpoints + 1 checkpoints (the
    newest is written before the oldest is removed), less those a resumed run has there already."""
    if not storage.is_local(train_dir):
        return
    to_come = max(1, keep_checkpoints + 1 - len(list_checkpoints(train_dir)))
    free, needed = machine.disk_free_bytes(train_dir), one_checkpoint * to_come
    if free is not None and needed > free:
        log.warning("%s has %s free, less than the %s that %d more checkpoints of about %s take (--keep_checkpoints "
                    "%d, and one more while the newest is written): free space or lower --keep_checkpoints", train_dir,
                    human_bytes(free), human_bytes(needed), to_come, human_bytes(one_checkpoint), keep_checkpoints)

"""A study's budget in data (`--resource examples`): each trial's budget in training examples (num_epochs x the
training set's videos, estimated from the listing's sizes) and the rungs of it where trials validate and report.

The rungs are fixed when the study is created and kept in it, so that resumed runs and other machines compare
trials at the same points.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Optional

import optuna

from yt8m.data.format.tfrecord import list_shards
from yt8m.data.reading.cache_estimate import estimate_cache
from yt8m.tuning.space import PruningSettings, TuneSpec

log = logging.getLogger("yt8m.tune")

BUDGET_ATTR = "example_budget"  # study user attribute: the ExampleBudget the study was created with
EXAMPLES = "examples"  # --resource's value for a budget in data


@dataclass(frozen=True)
class ExampleBudget:
    """A trial's budget: `epochs` over a training set of about `videos` examples, validated at `rungs` (increasing
    example counts, the last the whole budget)."""

    videos: int
    epochs: int
    rungs: tuple[int, ...]

    @property
    def total(self) -> int:
        return self.videos * self.epochs

    def describe(self) -> str:
        return (f"{self.total:,} examples a trial ({self.epochs} epoch(s) of about {self.videos:,} videos), rungs at "
                f"{', '.join(f'{rung:,}' for rung in self.rungs)}")


def example_rungs(total: int, pruning: PruningSettings) -> tuple[int, ...]:
    """`pruning.rungs` counts of examples, each exactly `reduction_factor` times the one before (successive halving's
    and Hyperband's rungs are min_resource x factor^k), the last at most `total`: 1/27, 1/9, 1/3 and 1 of it for 4
    rungs of factor 3."""
    factor = pruning.reduction_factor
    first = max(1, total // factor ** (pruning.rungs - 1))
    return tuple(first * factor ** power for power in range(pruning.rungs))


def estimated_training_videos(spec: TuneSpec) -> int:
    """The training set's examples, estimated as the run's RAM-cache estimate does: a few shards' first records
    decoded, and their bytes a record scaled to the listing's bytes (no full read of the data)."""
    data, features = spec.train.data, spec.train.features
    listing = list_shards(data.train_data_pattern)
    known = None if None in listing.values() else sum(size or 0 for size in listing.values())
    estimate = estimate_cache(list(listing), features, data.skip_corrupt, shard_bytes=known, sizes=listing)
    if estimate.records < 1:
        raise ValueError(f"--resource examples: {data.train_data_pattern} holds no training records to size the "
                         "trials' budget with")
    return estimate.records


def study_budget(study: optuna.Study, spec: TuneSpec) -> Optional[ExampleBudget]:
    """The study's budget in examples (None with `--resource epochs`): the one it was created with, else estimated
    now and stored in it. Settings that would give other rungs do not change a study's: that is logged."""
    pruning = spec.settings.pruning
    if pruning.resource != EXAMPLES:
        return None
    saved = study.user_attrs.get(BUDGET_ATTR)
    if saved is not None:
        budget = ExampleBudget(saved["videos"], saved["epochs"], tuple(saved["rungs"]))
        wanted = example_rungs(budget.videos * spec.train.schedule.num_epochs, pruning)
        if wanted != budget.rungs:
            log.warning("the study keeps the rungs it was created with (%s); these settings would give %s: start "
                        "another study (--study_name) to use them", budget.rungs, wanted)
        return budget
    videos = estimated_training_videos(spec)
    epochs = spec.train.schedule.num_epochs
    budget = ExampleBudget(videos, epochs, example_rungs(videos * epochs, pruning))
    study.set_user_attr(BUDGET_ATTR, dataclasses.asdict(budget))
    log.info("--resource examples: %s", budget.describe())
    return budget

"""One `yt8m tune` trial: train the sampled config in its own directory, evaluating on the validation set
at each epoch end (or every N steps) so the pruner can stop it early; NaN losses and errors fail it with a reason.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import optuna
import torch

from yt8m.checkpoint import checkpoint_dir
from yt8m.config import TrainConfig
from yt8m.tune.space import TuneSpec, report_schedule
from yt8m.tune.study import (
    FAIL_REASON_ATTR,
    INTERRUPTED_PREFIX,
    WORKER_ATTR,
    FileLock,
    budget_used,
    record_interruption,
    worker_identity,
)

if TYPE_CHECKING:
    from yt8m.training import TrainEvent

log = logging.getLogger("yt8m.tune")

# Trial user attributes written here and read by the report.
METRICS_ATTR = "metrics"
EPOCHS_ATTR = "epochs"
EXAMPLES_ATTR = "examples"
TRAIN_DIR_ATTR = "train_dir"


class TrialFailure(RuntimeError):
    """A trial that cannot give a score (NaN loss or metric); recorded as FAILED, the study goes on."""


def trial_dir(study_dir: str, number: int) -> str:
    return os.path.join(os.path.abspath(study_dir), "trials", f"trial-{number}")


@dataclass
class ValidationReporter:
    """Trainer hook: evaluates the live model, reports the objective metric to the pruner, asks to stop
    when the pruner says so or the loss is not finite."""

    trial: optuna.Trial
    spec: TuneSpec
    config: TrainConfig
    reports: list[tuple[int, float]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    evaluated_at_step: int = -1
    epochs: int = 0
    examples: int = 0
    pruned_at: Optional[int] = None
    failure: Optional[str] = None
    _batches: Any = None

    def __call__(self, event: "TrainEvent") -> bool:
        self.epochs, self.examples = event.epoch, event.examples
        scheduled = event.kind == ("checkpoint" if self.spec.settings.report_every_steps else "epoch_end")
        last = event.final or self._is_last(event)
        if not (scheduled or last) or self.evaluated_at_step == event.step:
            return False
        value = self._evaluate(event.model, event.step)
        if value is None:
            return True
        if scheduled:
            report_step = event.step if self.spec.settings.report_every_steps else event.epoch
            self.trial.report(value, report_step)
            self.reports.append((report_step, value))
            if not last and self.trial.should_prune():
                self.pruned_at = report_step
                return True
        return False

    def _is_last(self, event: "TrainEvent") -> bool:
        max_steps = self.config.max_steps
        return event.epoch >= self.config.num_epochs or (max_steps is not None and event.step >= max_steps)

    def _evaluate(self, model: torch.nn.Module, step: int) -> Optional[float]:
        from yt8m.evaluate import evaluate_model
        from yt8m.losses import create_loss

        device = next(model.parameters()).device
        self.metrics = evaluate_model(model, self._validation_batches(), create_loss(self.config.label_loss),
                                      self.config.num_classes, device=device)
        self.evaluated_at_step = step
        value = self.metrics[self.spec.metric]
        if not math.isfinite(value):
            self.failure = f"validation {self.spec.metric} is {value} at step {step}"
            return None
        log.info("trial %d, step %d: validation %s %.5f", self.trial.number, step, self.spec.metric, value)
        return value

    def _validation_batches(self):
        """The validation set, decoded once per trial and held in RAM when it is video-level."""
        if self._batches is None:
            from yt8m.data.dataset import FeatureSpec, YT8MDataset

            self._batches = YT8MDataset(self.spec.eval_data_pattern, FeatureSpec.from_config(self.config),
                                        self.config.batch_size, skip_corrupt=self.config.skip_corrupt,
                                        cache_in_memory=not self.config.frame_features)
        return self._batches


@dataclass
class TrialObjective:
    """The Optuna objective: one call trains one trial and returns its final validation metric."""

    spec: TuneSpec
    lock: FileLock  # the budget lock, held when a trial starts: released once the trial is RUNNING

    def __call__(self, trial: optuna.Trial) -> float:
        # Identified before the other jobs of this machine may look for interrupted trials: a RUNNING trial
        # without a worker is one they cannot judge.
        trial.set_user_attr(WORKER_ATTR, worker_identity())
        self.lock.release()
        if self._is_surplus(trial):
            raise TrialFailure("the study reached --n_trials while this trial started (parallel workers)")
        params = self.spec.sample(trial)
        train_dir = trial_dir(self.spec.settings.study_dir, trial.number)
        trial.set_user_attr(TRAIN_DIR_ATTR, train_dir)
        config = self.spec.trial_config(params, train_dir, **report_schedule(self.spec.settings))
        from yt8m.training import train

        reporter = ValidationReporter(trial, self.spec, config)
        log.info("trial %d: %s in %s", trial.number, params, train_dir)
        try:
            summary = train(config, hooks=[reporter])
        except KeyboardInterrupt:
            self._record_progress(trial, reporter, None)
            record_interruption(trial.study, _frozen(trial), "interrupted: stopped by Ctrl+C or SIGTERM")
            raise
        except Exception as err:
            self._record_progress(trial, reporter, None)
            trial.set_user_attr(FAIL_REASON_ATTR, f"{type(err).__name__}: {err}")
            raise
        self._record_progress(trial, reporter, summary)
        if reporter.failure:
            trial.set_user_attr(FAIL_REASON_ATTR, reporter.failure)
            raise TrialFailure(reporter.failure)
        if reporter.pruned_at is not None:
            raise optuna.TrialPruned(f"the pruner stopped it at report step {reporter.pruned_at}, "
                                     f"validation {self.spec.metric} {reporter.reports[-1][1]:.5f}")
        return reporter.metrics[self.spec.metric]

    def _is_surplus(self, trial: optuna.Trial) -> bool:
        """Workers on other machines may start trials at the same moment; the later ones give way."""
        if budget_used(trial.study, before=trial.number) < self.spec.settings.n_trials:
            return False
        trial.study.set_user_attr(f"{INTERRUPTED_PREFIX}{trial.number}",
                                  "surplus: started while the study already had --n_trials trials")
        return True

    @staticmethod
    def _record_progress(trial: optuna.Trial, reporter: ValidationReporter, summary: Optional[dict]) -> None:
        trial.set_user_attr(EPOCHS_ATTR, reporter.epochs)
        trial.set_user_attr(EXAMPLES_ATTR, summary["examples"] if summary else reporter.examples)
        if reporter.metrics:
            trial.set_user_attr(METRICS_ATTR, reporter.metrics)


def _frozen(trial: optuna.Trial) -> optuna.trial.FrozenTrial:
    return next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)


def remove_checkpoints_beyond_best(study: optuna.Study, study_dir: str, keep: Optional[int]) -> None:
    """--keep_best K: delete the checkpoints of every finished trial but the K best complete ones."""
    if keep is None:
        return
    finished = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    complete = [t for t in finished if t.state == optuna.trial.TrialState.COMPLETE]
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    best = {t.number for t in sorted(complete, key=lambda t: t.value, reverse=maximize)[:keep]}
    for trial in finished:
        path = checkpoint_dir(trial_dir(study_dir, trial.number))
        if trial.number not in best and os.path.isdir(path):
            shutil.rmtree(path)
            log.info("--keep_best %d: removed the checkpoints of trial %d", keep, trial.number)

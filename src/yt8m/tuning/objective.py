"""One `yt8m tune` trial: train the sampled config in its own directory, evaluating on the validation set
at each epoch end (or every N steps) so the pruner can stop it early; its value is its best validated epoch's (a
trial stopped by --timeout or --trial_timeout keeps it). NaN losses and errors fail it with a reason, and a model
over --max_model_size_mb is pruned before it trains. Ctrl+C and SIGTERM stop its training between steps, and it is
re-queued.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import optuna

from yt8m.io.checkpoints import EXPORT_DIR, checkpoint_dir, list_exports
from yt8m.io.files import temporary_path
from yt8m.models.model_size import ModelTooLargeError
from yt8m.training import TrainConfig, train
from yt8m.training.stopping import STOPS
from yt8m.tuning.devices import DEVICES_ATTR, trial_devices
from yt8m.tuning.lifetime import TrialStartLock
from yt8m.tuning.limits import STUDY_DEADLINE, RunLimits
from yt8m.tuning.space import TuneSpec, objective_key, report_schedule
from yt8m.tuning.study import (
    FAIL_REASON_ATTR,
    INTERRUPTED_PREFIX,
    WORKER_ATTR,
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
BEST_EPOCH_ATTR = "best_epoch"  # the epoch (and step) the trial's value was validated at
BEST_STEP_ATTR = "best_step"
STOPPED_ATTR = "stopped"  # why a complete trial ended before its budget (--timeout, --trial_timeout)
DUPLICATE_OF_ATTR = "duplicate_of"  # the complete trial whose configuration this one sampled again, not retrained
# What a trial that takes an earlier trial's configuration takes of it: its run, and where its value was measured.
DUPLICATE_ATTRS = (TRAIN_DIR_ATTR, METRICS_ATTR, BEST_EPOCH_ATTR, BEST_STEP_ATTR)
MODEL_PARAM = "model"  # the searched field that names a trial's model family


class TrialFailure(RuntimeError):
    """A trial that cannot give a score (NaN loss or metric); recorded as FAILED, the study goes on."""


class TrialInterrupted(KeyboardInterrupt):
    """The trial's training stopped for Ctrl+C or SIGTERM (or --timeout before its first validation): raised by the
    objective once training has stopped cleanly, so that Optuna ends the trial (re-queued by its record) and the job
    its loop. Optuna ends a trial so for a KeyboardInterrupt only."""


def trial_dir(study_dir: str, number: int) -> str:
    return os.path.join(os.path.abspath(study_dir), "trials", f"trial-{number}")


def trial_train_dir(study_dir: str, trial: optuna.trial.FrozenTrial) -> str:
    """Where the trial trained: the folder it recorded, else its folder in the study dir."""
    return trial.user_attrs.get(TRAIN_DIR_ATTR) or trial_dir(study_dir, trial.number)


def trial_best_model(study_dir: str, trial: optuna.trial.FrozenTrial) -> str:
    """The trial's model as its value measured it: its best export (export/best/<step>, a small train dir), else,
    where its train: section keeps no best export, its run's latest checkpoint."""
    run = trial_train_dir(study_dir, trial)
    exports = list_exports(run, "best")
    return exports[-1][1] if exports else run


@dataclass(frozen=True)
class Validated:
    """One validation of a trial: its objective value, when (the epoch it ended, the step), all its metrics."""

    value: float
    epoch: int
    step: int
    metrics: dict[str, Any]


@dataclass
class ValidationReporter:
    """Trainer hook: reports the trainer's validation of its checkpoints to the pruner (every checkpoint with
    --report_every_steps, else the one each epoch ends with) and asks to stop when the pruner prunes or the metric
    is not finite."""

    trial: optuna.Trial
    spec: TuneSpec
    config: TrainConfig
    reports: list[tuple[int, float]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    epochs: int = 0
    examples: int = 0
    reported_epoch: int = 0
    pruned_at: Optional[int] = None
    failure: Optional[str] = None
    best: Optional[Validated] = None  # the best validation so far: the trial's value
    rungs: tuple[int, ...] = ()  # --resource examples: the example counts it reports at

    @property
    def key(self) -> str:
        return objective_key(self.spec.metric, self.config.tasks)

    def __call__(self, event: "TrainEvent") -> bool:
        self.epochs, self.examples = event.epoch, event.examples
        if event.kind != "checkpoint" or event.metrics is None:
            return False
        self.metrics = event.metrics
        value = event.metrics[self.key]
        if not math.isfinite(value):
            self.failure = f"validation {self.spec.metric} is {value} at step {event.step}"
            return True
        log.info("trial %d, step %d: validation %s %.5f", self.trial.number, event.step, self.spec.metric, value)
        report_step = self._record(event, value)
        # At its budget's last rung a trial has spent its budget: stopping it there saves nothing.
        at_budget = bool(self.rungs) and report_step == self.rungs[-1]
        if report_step is None or self._is_last(event) or at_budget or not self.trial.should_prune():
            return False
        self.pruned_at = report_step
        return True

    def _record(self, event: "TrainEvent", value: float) -> Optional[int]:
        """Report the validation to the pruner and keep it if it is the best so far; the step reported at."""
        report_step = self._report_step(event)
        if report_step is not None:
            self.trial.report(value, report_step)
            self.reports.append((report_step, value))
        if self.best is None or self._better(value, self.best.value):
            self.best = Validated(value, event.epoch, event.step, dict(self.metrics))
        return report_step

    def _better(self, value: float, best: float) -> bool:
        return value > best if self.spec.direction == "maximize" else value < best

    def _report_step(self, event: "TrainEvent") -> Optional[int]:
        """The step the pruner sees: training steps with --report_every_steps, the rungs with --resource examples,
        else epochs (once each)."""
        if self.rungs:
            return self._rung_reached(event)
        if self.spec.settings.pruning.report_every_steps:
            return event.step
        if event.epoch > self.reported_epoch:
            self.reported_epoch = event.epoch
            return event.epoch
        return None

    def _rung_reached(self, event: "TrainEvent") -> Optional[int]:
        """The highest rung this validation is the first to reach, reported at the rung's own count (the same step
        for every trial, whatever its batch size); a trial that trains its whole budget reports the last rung at its
        end should the estimated budget exceed the set's true size. Epoch-end validations between rungs are not
        reported (they may still be the trial's best)."""
        last = self.reports[-1][0] if self.reports else 0  # with rungs, every report is at one
        pending = [rung for rung in self.rungs if rung > last]
        reached = [rung for rung in pending if rung <= event.examples]
        if not reached and pending and event.epoch >= self.config.schedule.num_epochs:
            reached = [pending[-1]]
        return reached[-1] if reached else None

    def _is_last(self, event: "TrainEvent") -> bool:
        schedule = self.config.schedule
        return event.final or event.epoch >= schedule.num_epochs or (
            schedule.max_steps is not None and event.step >= schedule.max_steps)


@dataclass
class TrialObjective:
    """The Optuna objective: one call trains one trial and returns its final validation metric."""

    spec: TuneSpec
    lock: TrialStartLock  # held when a trial starts: released once the trial is RUNNING and stamped
    limits: RunLimits = RunLimits()
    rungs: tuple[int, ...] = ()  # --resource examples: the study's rungs (tuning/budget.py)
    # How a trial trains (trial, reporter, params, the tuner's overrides) -> summary; None: in this process.
    training: Optional[Callable[..., dict[str, Any]]] = None

    def __call__(self, trial: optuna.Trial) -> float:
        """Train the trial; its value is its best validated epoch's. Past --trial_timeout, or at the run's --timeout,
        its training stops at the next step end, and a trial that validated an epoch completes with its best one's
        value (one that has not is pruned, or interrupted and re-queued at --timeout); a Ctrl+C or SIGTERM at any
        point, sampling and set-up included, stops it there and re-queues it; only its own error FAILs it."""
        with self.limits.set_for_trial():
            return self._train(trial)

    def _train(self, trial: optuna.Trial) -> float:
        # Identified before the other jobs of this machine may look for interrupted trials: a RUNNING trial
        # without a worker is one they cannot judge.
        trial.set_user_attr(WORKER_ATTR, worker_identity())
        self.lock.release()
        if self._is_surplus(trial):
            raise TrialFailure("the study reached --n_trials while this trial started (parallel workers)")
        self._interrupt_if_asked(trial, None)
        params = self.spec.sample(trial)
        original = complete_trial_of(trial.study, params)
        if original is not None:
            return take_duplicate(trial, original, self.spec.settings.study.study_dir)
        train_dir = trial_dir(self.spec.settings.study.study_dir, trial.number)
        trial.set_user_attr(TRAIN_DIR_ATTR, train_dir)
        overrides = report_schedule(self.spec.settings.pruning, self.rungs)
        config = self.spec.trial_config(params, train_dir, **overrides)
        reporter = ValidationReporter(trial, self.spec, config, rungs=self.rungs)
        devices = trial_devices(config.runtime.device, self.spec.settings.study.gpus_per_trial)
        trial.set_user_attr(DEVICES_ATTR, devices)
        log.info("trial %d: %s in %s, on %s", trial.number, params, train_dir, devices["device"])
        summary = self._training(trial, reporter, params, overrides)
        self._record_progress(trial, reporter, summary)
        if summary.get("stopped"):
            return self._stopped(trial, reporter, summary)
        if reporter.failure:
            trial.set_user_attr(FAIL_REASON_ATTR, reporter.failure)
            raise TrialFailure(reporter.failure)
        if reporter.pruned_at is not None:
            raise optuna.TrialPruned(f"the pruner stopped it at report step {reporter.pruned_at}, "
                                     f"validation {self.spec.metric} {reporter.reports[-1][1]:.5f}")
        if reporter.best is None:
            raise TrialFailure("the trial ended without a validation result")
        return reporter.best.value

    def _training(self, trial: optuna.Trial, reporter: "ValidationReporter", params: dict[str, Any],
                  overrides: dict[str, Any]) -> dict[str, Any]:
        try:
            if self.training is not None:
                return self.training(trial, reporter, params, overrides)
            return train(reporter.config, hooks=[reporter])
        except ModelTooLargeError as err:
            # Pruned, not failed: TPE ranks a pruned trial without reports below every other, so it learns to
            # avoid the region; a failed trial would be left out of its model and the region sampled again.
            self._record_progress(trial, reporter, None)
            trial.set_user_attr(FAIL_REASON_ATTR, str(err))
            raise optuna.TrialPruned(str(err)) from err
        except Exception as err:
            self._record_progress(trial, reporter, None)
            trial.set_user_attr(FAIL_REASON_ATTR, f"{type(err).__name__}: {err}")
            raise

    def _stopped(self, trial: optuna.Trial, reporter: "ValidationReporter", summary: dict[str, Any]) -> float:
        """A trial whose training a signal or a limit stopped: re-queued for a signal; for a limit, its best
        validated epoch's value, or (none yet) pruned at --trial_timeout and re-queued at --timeout."""
        self._interrupt_if_asked(trial, reporter)
        limit = self.limits.describe(summary["limit"])
        if reporter.best is not None and not reporter.failure:
            trial.set_user_attr(STOPPED_ATTR, f"{limit} after {reporter.epochs} epoch(s): scored by its best epoch")
            return reporter.best.value
        if summary["limit"] == STUDY_DEADLINE:
            record_interruption(trial.study, _frozen(trial), f"interrupted: {limit}", logging.DEBUG)
            raise TrialInterrupted(limit)
        trial.set_user_attr(FAIL_REASON_ATTR, f"{limit} after {reporter.epochs} epoch(s), before its first "
                                              "validation")
        raise optuna.TrialPruned(limit)

    def _interrupt_if_asked(self, trial: optuna.Trial, reporter: Optional["ValidationReporter"]) -> None:
        """Ctrl+C or SIGTERM noted (while the trial started, or its training ran): the trial is recorded as
        interrupted, to be re-queued, and ends."""
        if not STOPS.interrupted:
            return
        record_interruption(trial.study, _frozen(trial), "interrupted: stopped by Ctrl+C or SIGTERM", logging.DEBUG)
        raise TrialInterrupted("stopped by Ctrl+C or SIGTERM")

    def _is_surplus(self, trial: optuna.Trial) -> bool:
        """Workers on other machines may start trials at the same moment; the later ones give way."""
        if budget_used(trial.study, before=trial.number) < self.spec.settings.study.n_trials:
            return False
        trial.study.set_user_attr(f"{INTERRUPTED_PREFIX}{trial.number}",
                                  "surplus: started while the study already had --n_trials trials")
        return True

    @staticmethod
    def _record_progress(trial: optuna.Trial, reporter: Optional[ValidationReporter],
                         summary: Optional[dict]) -> None:
        if reporter is None:  # stopped before it trained
            return
        trial.set_user_attr(EPOCHS_ATTR, reporter.epochs)
        trial.set_user_attr(EXAMPLES_ATTR, summary["examples"] if summary else reporter.examples)
        if reporter.best is not None:  # the metrics of the validation the trial is scored by
            trial.set_user_attr(METRICS_ATTR, reporter.best.metrics)
            trial.set_user_attr(BEST_EPOCH_ATTR, reporter.best.epoch)
            trial.set_user_attr(BEST_STEP_ATTR, reporter.best.step)


def complete_trial_of(study: optuna.Study, params: dict[str, Any]) -> Optional[optuna.trial.FrozenTrial]:
    """The first complete trial of exactly these parameters, if any: a sampler may draw a configuration again
    (integers and choices repeat), and training it again would spend a trial on a known value."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return next((earlier for earlier in complete if earlier.params == params), None)


def take_duplicate(trial: optuna.Trial, original: optuna.trial.FrozenTrial, study_dir: str) -> float:
    """Complete `trial` with the value of `original`, whose configuration it sampled, without training (Optuna's
    documented way); it points at the original's run, so reports and retrains read that."""
    trial.set_user_attr(DUPLICATE_OF_ATTR, original.number)
    for name in DUPLICATE_ATTRS:
        if name in original.user_attrs:
            trial.set_user_attr(name, original.user_attrs[name])
    trial.set_user_attr(TRAIN_DIR_ATTR, trial_train_dir(study_dir, original))
    trial.set_user_attr(EXAMPLES_ATTR, 0)
    log.info("trial %d: the configuration of complete trial %d, not trained again: its value %.5f", trial.number,
             original.number, trial_value(original))
    return trial_value(original)


def distinct_configurations(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """The trials in order, each configuration once (its first trial): two identical models add nothing to an
    ensemble or a refit."""
    seen: set[str] = set()
    kept = []
    for trial in trials:
        key = json.dumps(trial.params, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            kept.append(trial)
    return kept


def _frozen(trial: optuna.Trial) -> optuna.trial.FrozenTrial:
    return next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)


def remove_checkpoints_beyond_best(study: optuna.Study, study_dir: str, keep: Optional[int]) -> None:
    """--keep_best K: delete the checkpoints (and the exports, which share their files) of every finished trial but
    the K best complete ones and the best of each model among them (what `tune-report --diverse` takes)."""
    if keep is None:
        return
    best = {t.number for t in [*best_trials(study, keep), *best_trials(study, keep, diverse=True)]}
    for trial in study.get_trials(deepcopy=False):
        folder = trial_dir(study_dir, trial.number)
        if trial.state.is_finished() and trial.number not in best:
            removed = [_remove_unless_gone(path) for path in (checkpoint_dir(folder), os.path.join(folder, EXPORT_DIR))]
            if any(removed):
                log.info("--keep_best %d: removed the checkpoints and exports of trial %d", keep, trial.number)


def best_trials(study: optuna.Study, count: int, diverse: bool = False) -> list[optuna.trial.FrozenTrial]:
    """The `count` best complete trials (ties: the earlier first), each configuration once. Diverse: the best trial
    of each searched `model` first, best first, then the rest by value; an ensemble gains more from members that
    differ than from the near-copies a converged search leaves at its top."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
    ranked = distinct_configurations(sorted(complete, key=lambda trial: (sign * trial_value(trial), trial.number)))
    if diverse:
        leaders: dict[Any, optuna.trial.FrozenTrial] = {}
        for trial in ranked:
            leaders.setdefault(trial.params.get(MODEL_PARAM), trial)
        firsts = {trial.number for trial in leaders.values()}
        ranked = [*leaders.values(), *(trial for trial in ranked if trial.number not in firsts)]
    return ranked[:count]


def _remove_unless_gone(folder: str) -> bool:
    """Remove a folder another job may be removing at the same moment (each job prunes after its trials): renamed
    first, which only one of them can do; False when it is gone already."""
    claimed = temporary_path(folder)
    try:
        os.rename(folder, claimed)
    except FileNotFoundError:
        return False
    shutil.rmtree(claimed)
    return True


def trial_value(trial: optuna.trial.FrozenTrial) -> float:
    """A complete trial's objective value."""
    if trial.value is None:
        raise ValueError(f"trial {trial.number} has no value: it is not complete")
    return trial.value

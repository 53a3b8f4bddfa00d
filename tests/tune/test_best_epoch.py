"""A trial is scored by its best validated epoch: its value, its recorded metrics, the epoch a retrain stops at, and
the value a trial stopped by --trial_timeout or --timeout keeps."""

from __future__ import annotations

import time

import optuna
import pytest

from tune_fixtures import shards, tune_file  # noqa: F401  (a fixture)
from workflow_fixtures import tiny_data, tiny_train_config  # noqa: F401  (a fixture)
from yt8m.training import TrainEvent
from yt8m.tuning import objective as objective_module
from yt8m.tuning.lifetime import TrialStartLock
from yt8m.tuning.limits import STUDY_DEADLINE, TRIAL_TIME_LIMIT, RunLimits
from yt8m.tuning.objective import BEST_EPOCH_ATTR, STOPPED_ATTR, TrialInterrupted, TrialObjective
from yt8m.tuning.report import best_train_config, leaderboard
from yt8m.tuning.space import load_tune_spec
from yt8m.tuning.study import interrupted_trials, open_storage, open_study


def scripted_training(gaps: list[float], limit: str = ""):
    """A stand-in for yt8m.training.train: one validated checkpoint per epoch with these GAPs, then the summary; with
    `limit` (--trial_timeout, --timeout), training stopped by that deadline after them, as the loop reports it."""

    def train(config, hooks=()):
        for epoch, gap in enumerate(gaps, start=1):
            event = TrainEvent("checkpoint", None, None, config, step=10 * epoch, epoch=epoch, examples=100 * epoch,
                               loss=1.0, metrics={"gap": gap, "hit_at_one": gap / 2}, final=epoch == len(gaps))
            if any(hook(event) for hook in hooks):
                break
        stopped = {"stopped": f"{limit} reached", "interrupted": False, "limit": limit} if limit else {}
        return {"examples": 100 * len(gaps), **stopped}

    return train


@pytest.fixture
def study_and_spec(tmp_path, shards):  # noqa: F811
    path = tune_file(tmp_path / "tune.yaml", shards, tune={"pruner": "none", "sampler": "random"}, num_epochs=4)
    spec = load_tune_spec(path)
    (tmp_path / "study").mkdir()
    return open_study(spec, open_storage(spec.settings.study)), spec, tmp_path


LIMITS = RunLimits(timeout=600, deadline=time.time() + 600, trial_timeout=60)


def run_trial(study, spec, tmp_path, monkeypatch, gaps, limit=""):
    monkeypatch.setattr(objective_module, "train", scripted_training(gaps, limit))
    trial = study.ask()
    with TrialStartLock(str(tmp_path / ".budget.lock")).held() as lock:
        value = TrialObjective(spec, lock, LIMITS)(trial)
    study.tell(trial, value)
    return study.trials[trial.number]


def test_a_trial_is_worth_its_best_epoch_and_a_retrain_stops_there(study_and_spec, monkeypatch):
    study, spec, tmp_path = study_and_spec
    trial = run_trial(study, spec, tmp_path, monkeypatch, [0.50, 0.72, 0.61, 0.58])
    assert trial.value == 0.72 and trial.user_attrs[BEST_EPOCH_ATTR] == 2
    assert trial.user_attrs["metrics"] == {"gap": 0.72, "hit_at_one": 0.36}
    assert best_train_config(spec, trial).schedule.num_epochs == 2
    row = leaderboard(study)[0]
    assert (row["value"], row["best_epoch"], row["epochs"]) == (0.72, 2, 4)


@pytest.mark.parametrize("limit, said", [(TRIAL_TIME_LIMIT, "ran past --trial_timeout 60 s"),
                                         (STUDY_DEADLINE, "--timeout 600 s reached")], ids=["trial_timeout", "timeout"])
def test_a_trial_stopped_by_a_limit_keeps_its_best_completed_epoch(study_and_spec, monkeypatch, limit, said):
    study, spec, tmp_path = study_and_spec
    trial = run_trial(study, spec, tmp_path, monkeypatch, [0.40, 0.66], limit=limit)
    assert trial.state == optuna.trial.TrialState.COMPLETE and trial.value == 0.66
    assert trial.user_attrs[STOPPED_ATTR] == f"{said} after 2 epoch(s): scored by its best epoch"
    assert best_train_config(spec, trial).schedule.num_epochs == 2


def test_a_limit_before_the_first_validation_prunes_or_requeues(study_and_spec, monkeypatch):
    study, spec, tmp_path = study_and_spec
    monkeypatch.setattr(objective_module, "train", scripted_training([], TRIAL_TIME_LIMIT))
    trial = study.ask()
    with TrialStartLock(str(tmp_path / ".budget.lock")).held() as lock, pytest.raises(optuna.TrialPruned):
        TrialObjective(spec, lock, LIMITS)(trial)
    monkeypatch.setattr(objective_module, "train", scripted_training([], STUDY_DEADLINE))
    trial = study.ask()
    with TrialStartLock(str(tmp_path / ".budget.lock")).held() as lock, pytest.raises(TrialInterrupted):
        TrialObjective(spec, lock, LIMITS)(trial)
    assert trial.number in interrupted_trials(study)


def test_a_trial_validates_only_where_it_reports(study_and_spec, monkeypatch):
    """Each epoch's end and no step count: a validation the pruner does not see could become the trial's value (one
    a retrain to its best epoch would not reproduce) and would count in early stopping's patience."""
    study, spec, tmp_path = study_and_spec
    configs = []
    scripted = scripted_training([0.5, 0.6])

    def train(config, hooks=()):
        configs.append(config)
        return scripted(config, hooks)

    monkeypatch.setattr(objective_module, "train", train)
    trial = study.ask()
    with TrialStartLock(str(tmp_path / ".budget.lock")).held() as lock:
        TrialObjective(spec, lock)(trial)
    checkpoints = configs[0].checkpoints
    assert checkpoints.checkpoint_every_epoch and checkpoints.export_model_steps == 0


def test_a_limit_passing_stops_training_at_the_next_step_end_not_inside_one(tiny_data, tmp_path):
    """--trial_timeout's deadline, passed while a step (here: its checkpoint's hooks, where a validation is
    recorded) runs, stops the run where the step ended: the step completes, and no later step is taken."""
    from yt8m.training import train
    from yt8m.training.stopping import STOPS

    steps = []

    def slow_record(event):
        steps.append(event.step)
        if len(steps) == 1:
            STOPS.deadlines[TRIAL_TIME_LIMIT] = time.monotonic() + 0.05
            time.sleep(0.3)  # the deadline passes here
            steps.append("recorded")

    config = tiny_train_config(tiny_data, tmp_path / "run", export_model_steps=2, num_epochs=3)
    try:
        summary = train(config, hooks=[slow_record])
    finally:
        STOPS.deadlines.pop(TRIAL_TIME_LIMIT, None)
    assert summary["stopped"] == f"{TRIAL_TIME_LIMIT} reached" and summary["limit"] == TRIAL_TIME_LIMIT
    assert not summary["interrupted"] and summary["global_step"] == 2 and steps == [2, "recorded"]

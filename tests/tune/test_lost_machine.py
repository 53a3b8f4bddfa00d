"""A machine of a shared study lost mid-trial (no pid to look up on another host): its trial is taken as interrupted
once its heartbeats stop, and a survivor whose --n_trials that trial filled waits for it and runs it again. The test
plays the lost machine through Optuna's storage, writing only what such a machine would write (from the helper's
shared-study branch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tune_fixtures import SEARCH, shards, tune_file  # noqa: F401  (a fixture)
from yt8m.tuning.space import load_tune_spec
from yt8m.tuning.study import WORKER_ATTR, interrupted_trials, open_storage, open_study, state_counts

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
LEARNING_RATE = {"base_learning_rate": SEARCH["base_learning_rate"]}
COMPLETE = optuna.trial.TrialState.COMPLETE
WAIT_SECONDS = 240  # for a state a process reaches on its own; generous, the suite shares 2 cores
def tune_process(log: Path, *argv: str) -> subprocess.Popen:
    """`yt8m tune ARGV`, its log in a file (a pipe nobody reads while it runs would fill and stall it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as err:
        return subprocess.Popen([sys.executable, "-m", "yt8m", "tune", *argv], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=err)


def finished(process: subprocess.Popen, log: Path) -> dict:
    out, _ = process.communicate(timeout=WAIT_SECONDS)
    assert process.returncode == 0, log.read_text()[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def wait_until(condition, what: str, *processes: subprocess.Popen):
    """Poll `condition` until it gives something true; fail when a process ends first or after WAIT_SECONDS."""
    deadline = time.time() + WAIT_SECONDS
    while time.time() < deadline:
        found = condition()
        if found:
            return found
        ended = [process.args for process in processes if process.poll() is not None]
        assert not ended, f"{ended} ended before {what}"
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {WAIT_SECONDS} s")


def assert_study_finished(study: optuna.Study, n_trials: int) -> None:
    """Exactly `n_trials` complete, none running or waiting, no configuration trained to completion twice."""
    counts = state_counts(study)
    assert counts["complete"] == n_trials and counts["running"] == counts["waiting"] == 0, counts
    params = [json.dumps(trial.params, sort_keys=True) for trial in study.trials if trial.state == COMPLETE]
    assert len(set(params)) == len(params), params


def assert_requeued(study: optuna.Study, killed: int, reason: str) -> None:
    """The killed trial FAILED as interrupted, and a later trial ran its parameters to completion."""
    trials = study.trials
    assert trials[killed].state == optuna.trial.TrialState.FAIL
    assert reason in interrupted_trials(study)[killed]
    retries = [trial for trial in trials if trial.user_attrs.get("retry_of") == killed]
    assert [(retry.state, retry.params) for retry in retries] == [(COMPLETE, trials[killed].params)]


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_trial_of_a_lost_machine_is_run_again_once_its_heartbeats_stop(tmp_path, shards):
    """A process on another machine cannot be looked up by pid: its trial is taken as interrupted once 4 heartbeats
    have passed without one. This test is that machine: it claims a trial and beats until the survivor has found the
    trial running, then falls silent (lost). The survivor, whose --n_trials that running trial filled, used to end
    at once ("no trial completed", the study one trial short for good); it now waits for the running trial, then
    runs its parameters again."""
    path = tune_file(tmp_path / "tune.yaml", shards, LEARNING_RATE, model="LogisticModel", num_epochs=1,
                     tune={"storage": f"sqlite:///{tmp_path}/shared.db", "heartbeat_seconds": 1, "pruner": "none"})
    spec = load_tune_spec(path)
    storage = open_storage(spec.settings.study)
    study = open_study(spec, storage)
    lost = study.ask()
    spec.sample(lost)
    lost.set_user_attr(WORKER_ATTR, {"host": "lost-machine", "pid": 4242, "start": 1})
    log = tmp_path / "survivor.log"
    survivor = tune_process(log, "--config", path, "--n_trials", "1")

    def beating_until_the_survivor_waits() -> bool:
        storage.record_heartbeat(lost._trial_id)  # the lost machine, alive until then
        return "waiting for trial(s) 0, running in other processes" in log.read_text()

    wait_until(beating_until_the_survivor_waits, "the survivor waiting for the running trial", survivor)
    summary = finished(survivor, log)
    assert summary["n_trials"]["interrupted"] == 1, summary
    assert_study_finished(study, 1)
    assert_requeued(study, lost.number, "no heartbeat on lost-machine:4242")

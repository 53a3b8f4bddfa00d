"""`yt8m tune --n_jobs 2` when things go wrong between jobs: two jobs pruning the same trial's checkpoints at once
(--keep_best), and a job killed outright (as the OOM killer does): the command must not end as if all went well."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from cli_outcome import CLEAN_ERROR, Outcome, record, yt8m_env

from tune_fixtures import SEARCH, shards, tune_file  # noqa: F401  (a fixture)

pytestmark = pytest.mark.hostile

def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def test_a_job_killed_mid_study_fails_the_command(tmp_path, shards, request):
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": SEARCH["base_learning_rate"]},
                     tune={"pruner": "none", "keep_best": 1}, model="LogisticModel", num_epochs=1)
    process = subprocess.Popen([sys.executable, "-m", "yt8m", "tune", "--config", path, "--n_trials", "3",
                                "--n_jobs", "2"], env=yt8m_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "study").glob("trials/trial-*")):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    jobs = [pid for pid in children(process.pid) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(jobs) == 2
    os.kill(jobs[0], signal.SIGKILL)
    out, err = process.communicate(timeout=120)
    outcome = record(request.node.nodeid, Outcome("tune", process.returncode, out, err))
    assert outcome.kind == CLEAN_ERROR, outcome.err[-3000:]
    outcome.assert_clean_error("tune-job-0", "SIGKILL")


def test_two_jobs_pruning_the_same_trial_at_once_both_go_on(tmp_path, monkeypatch):
    """--keep_best 1 after two trials: the other job removes trial 0's checkpoints while this one is about to."""
    from yt8m.tuning import objective

    study = optuna.create_study(direction="maximize")
    for number, value in enumerate((0.1, 0.9)):
        study.add_trial(optuna.trial.create_trial(value=value, params={}, distributions={}))
        (Path(objective.trial_dir(str(tmp_path), number)) / "checkpoints").mkdir(parents=True)
    real_rmtree, interleaved = shutil.rmtree, []

    def the_other_job_first(path, *args, **kwargs):
        if not interleaved:
            interleaved.append(path)
            objective.remove_checkpoints_beyond_best(study, str(tmp_path), keep=1)
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", the_other_job_first)
    objective.remove_checkpoints_beyond_best(study, str(tmp_path), keep=1)
    assert interleaved
    assert os.listdir(objective.trial_dir(str(tmp_path), 0)) == []
    assert os.listdir(objective.trial_dir(str(tmp_path), 1)) == ["checkpoints"]

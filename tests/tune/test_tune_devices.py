"""Where a study's jobs train: `--n_jobs auto` takes one job per visible GPU, each job its own GPU by
CUDA_VISIBLE_DEVICES, and every trial records what it trained on. The GPUs here are the environment the CUDA runtime
reads (CUDA_VISIBLE_DEVICES=0,1) on a machine without CUDA: the jobs see them, and train on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tune_fixtures import shards, tune_file  # noqa: F401  (a fixture)
from yt8m import cli
from yt8m.tuning.devices import CPU_JOBS, job_count, job_devices

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_jobs_take_the_visible_gpus_round_robin(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert job_count("auto") == 4 and job_count("auto", gpus_per_trial=2) == 2 and job_count("3") == 3
    assert [job_devices(job, 1, ["0", "1", "2", "3"]) for job in range(5)] == ["0", "1", "2", "3", "0"]
    assert [job_devices(job, 2, ["0", "1", "2", "3"]) for job in range(2)] == ["0,1", "2,3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa,-1,2")  # the runtime stops at the first invalid entry
    assert job_count("auto") == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert job_count("auto") == CPU_JOBS and job_devices(0, 1, []) is None


@pytest.mark.skipif(os.environ.get("CUDA_VISIBLE_DEVICES") is not None, reason="the test sets CUDA_VISIBLE_DEVICES")
def test_n_jobs_auto_gives_each_of_two_gpus_its_own_job(tmp_path, shards):
    path = tune_file(tmp_path / "tune.yaml", shards, tune={"pruner": "none"}, num_epochs=3)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1",
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "yt8m", "tune", "--config", path, "--n_trials", "4", "--n_jobs",
                           "auto"], env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--n_jobs auto: 2 job(s), 1 GPU(s) each, of the visible 0,1" in done.stderr
    assert "torch sees no CUDA here: the trials train on the CPU" in done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["n_trials"]["complete"] == 4
    trials = optuna.load_study(study_name="tune", storage=f"sqlite:///{tmp_path}/study/study.db").trials
    by_job: dict[int, set] = {}
    for trial in trials:
        assert trial.user_attrs["devices"]["device"] == "cpu"
        by_job.setdefault(trial.user_attrs["worker"]["pid"], set()).add(
            trial.user_attrs["devices"]["cuda_visible_devices"])
    # Two jobs, each on its own GPU for all its trials: trials that run at once never share one.
    assert sorted(map(sorted, by_job.values())) == [["0"], ["1"]]


def test_gpus_per_trial_trains_each_trial_as_a_two_process_job_that_reports_and_is_pruned(tmp_path, shards):
    """On this machine without GPUs, `--gpus_per_trial 2` runs each trial as 2 gloo processes under torchrun; rank 0
    reports each epoch to the study and its pruner stops the hopeless second trial at its first report."""
    search = {"base_learning_rate": {"type": "float", "low": 1e-7, "high": 0.5, "log": True}}
    enqueue = [{"base_learning_rate": 0.1}, {"base_learning_rate": 1e-7}]
    path = tune_file(tmp_path / "tune.yaml", shards, search, model="LogisticModel", num_epochs=3,
                     tune={"enqueue": enqueue})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "yt8m", "tune", "--config", path, "--n_trials", "2",
                           "--gpus_per_trial", "2"], env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    complete, pruned = optuna.load_study(study_name="tune", storage=f"sqlite:///{tmp_path}/study/study.db").trials
    assert complete.state.name == "COMPLETE" and pruned.state.name == "PRUNED"
    assert list(complete.intermediate_values) == [1, 2, 3] and list(pruned.intermediate_values) == [1]
    assert complete.value == max(complete.intermediate_values.values())
    for trial in (complete, pruned):
        assert trial.user_attrs["devices"]["processes"] == 2
        outcome = json.loads((Path(trial.user_attrs["train_dir"]) / "trial_process.json").read_text())
        assert outcome["summary"]["processes"] == 2  # the training ran as 2 processes
    assert complete.user_attrs["best_epoch"] == max(complete.intermediate_values,
                                                    key=complete.intermediate_values.get)


def test_a_two_process_trial_past_trial_timeout_keeps_its_best_validation(tmp_path, shards):
    """The job's limits reach its rank 0, which stops every rank at the same step end: the trial completes with its
    best epoch's value, stopped by --trial_timeout, not interrupted."""
    search = {"base_learning_rate": {"type": "float", "low": 0.01, "high": 0.5, "log": True}}
    path = tune_file(tmp_path / "tune.yaml", shards, search, model="LogisticModel", num_epochs=100000,
                     tune={"pruner": "none"})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "yt8m", "tune", "--config", path, "--n_trials", "1",
                           "--gpus_per_trial", "2", "--trial_timeout", "25"], env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (trial,) = optuna.load_study(study_name="tune", storage=f"sqlite:///{tmp_path}/study/study.db").trials
    assert trial.state.name == "COMPLETE" and "ran past --trial_timeout 25 s" in trial.user_attrs["stopped"]
    assert trial.value == max(trial.intermediate_values.values())


def test_a_trial_of_more_gpus_than_the_machine_shows_is_one_line(tmp_path, shards, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    path = tune_file(tmp_path / "tune.yaml", shards)
    assert cli.main(["tune", "--config", path, "--gpus_per_trial", "3"]) == 1
    err = capsys.readouterr().err
    assert "--gpus_per_trial 3: this machine shows 2 GPU(s) (0,1); a trial takes at most that many" in err
    assert "Traceback" not in err and not (tmp_path / "study").exists()

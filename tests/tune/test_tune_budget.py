"""`yt8m tune` within a budget: --timeout and --trial_timeout stop the running trial, which keeps the value of its best
validated epoch, and the report is written; Ctrl+C is one line; the data patterns are flags too; tune-report says how
the best trial compares with the baseline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from tune_fixtures import shards, tune_file  # noqa: F401  (a fixture)
from yt8m import cli

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
# The first trial is quick, the second would train for minutes.
QUICK_THEN_SLOW = {"search": {"num_epochs": {"type": "int", "low": 1, "high": 5000}},
                   "enqueue": [{"num_epochs": 1}, {"num_epochs": 5000}]}


def slow_second_trial(tmp_path: Path, shards: Path, **tune) -> str:
    return tune_file(tmp_path / "tune.yaml", shards, QUICK_THEN_SLOW["search"], model="LogisticModel",
                     tune={"enqueue": QUICK_THEN_SLOW["enqueue"], "pruner": "none", **tune})


def trials_of(summary: dict) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="tune", storage=f"sqlite:///{summary['study_dir']}/study.db").trials


def scored_by_its_best_epoch(trial: optuna.trial.FrozenTrial) -> None:
    reports = trial.intermediate_values
    assert trial.state == optuna.trial.TrialState.COMPLETE and len(reports) > 1  # it validated epochs before
    assert trial.value == max(reports.values())
    assert trial.user_attrs["best_epoch"] == max(reports, key=reports.get)


def test_timeout_stops_the_running_trial_with_its_best_epoch_and_writes_the_report(tmp_path, shards, capsys, caplog):
    path = slow_second_trial(tmp_path, shards)
    started = time.monotonic()
    assert cli.main(["tune", "--config", path, "--n_trials", "2", "--timeout", "6"]) == 0
    assert time.monotonic() - started < 60  # not the minutes the second trial would take
    summary = json.loads(capsys.readouterr().out)
    assert summary["timed_out"] and not summary["interrupted"]
    assert summary["n_trials"] == {"complete": 2, "pruned": 0, "fail": 0, "interrupted": 0, "running": 0,
                                   "waiting": 0}
    assert "--timeout 6 s reached: trials still running were stopped, each scored by its best validated" in caplog.text
    first, stopped = trials_of(summary)
    scored_by_its_best_epoch(stopped)
    board = (Path(summary["study_dir"]) / "leaderboard.txt").read_text()
    assert "--timeout 6 s reached after" in board and "scored by its best epoch" in board


@pytest.mark.parametrize("where", ["flag", "file"])
def test_trial_timeout_stops_a_slow_trial_with_its_best_epoch(tmp_path, shards, capsys, where):
    in_file = {"trial_timeout": 3} if where == "file" else {}
    path = slow_second_trial(tmp_path, shards, **in_file)
    flag = ["--trial_timeout", "3"] if where == "flag" else []
    assert cli.main(["tune", "--config", path, "--n_trials", "2", *flag]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_trials"]["complete"] == 2
    quick, slow = trials_of(summary)
    scored_by_its_best_epoch(slow)
    assert slow.duration.total_seconds() < 30
    board = (Path(summary["study_dir"]) / "leaderboard.txt").read_text()
    assert "ran past --trial_timeout 3 s after" in board and "scored by its best epoch" in board


def test_ctrl_c_is_one_line(tmp_path, shards):
    path = slow_second_trial(tmp_path, shards)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "yt8m", "tune", "--config", path, "--n_trials", "2"], env=env,
                               text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    study = tmp_path / "study"
    deadline = time.time() + 120
    while time.time() < deadline:  # until the slow trial is under way
        trials = optuna.load_study(study_name="tune", storage=f"sqlite:///{study}/study.db").trials \
            if (study / "trials").exists() else []
        if len(trials) == 2 and trials[1].intermediate_values:
            break
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130
    said = [line for line in err.splitlines() if " INFO " not in line and not line.startswith("[I ")]
    assert len(said) == 1 and said[0].endswith("WARNING yt8m.tune: interrupted: the running trials were marked "
                                               "interrupted and their parameters re-queued; run the same command "
                                               "again to resume the study"), err[-3000:]
    assert json.loads(out)["interrupted"]


def test_data_patterns_from_the_flags_are_the_studys(tmp_path, shards, capsys):
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": {"type": "float", "low": 1e-3,
                                                                              "high": 0.3, "log": True}},
                     model="LogisticModel", num_epochs=1, train_data_pattern="elsewhere/train-*",
                     eval_data_pattern="elsewhere/validate-*", tune={"pruner": "none"})
    flags = ["--train_data_pattern", str(shards / "train-*"), "--eval_data_pattern", str(shards / "validate-*")]
    assert cli.main(["tune", "--config", path, "--n_trials", "1", *flags]) == 0
    summary = json.loads(capsys.readouterr().out)
    saved = yaml.safe_load((Path(summary["study_dir"]) / "tune.yaml").read_text())["train"]
    assert (saved["train_data_pattern"], saved["eval_data_pattern"]) == (flags[1], flags[3])
    # The file's own patterns are another study's data: resuming this one with them is refused.
    assert cli.main(["tune", "--config", path, "--n_trials", "2"]) == 1
    assert "elsewhere/train-*" in capsys.readouterr().err


def test_tune_report_compares_the_best_with_the_baseline(tmp_path, shards, capsys):
    search = {"base_learning_rate": {"type": "float", "low": 1e-7, "high": 0.5, "log": True}}
    path = tune_file(tmp_path / "tune.yaml", shards, search, model="LogisticModel", num_epochs=1,
                     tune={"pruner": "none", "enqueue": [{"base_learning_rate": 0.1}, {"base_learning_rate": 1e-7}]})
    assert cli.main(["tune", "--config", path, "--n_trials", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["baseline_trial"] == summary["best_trial"] == 0
    assert cli.main(["tune-report", summary["study_dir"]]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["baseline_value"] == summary["best_value"]
    assert "for the baseline, trial 0 (tune.enqueue's first settings) (+0.0000): the search has not beaten it yet. " \
           "2 complete trial(s) are too few" in err

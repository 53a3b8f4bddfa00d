"""A configuration a study has already trained is not trained again: the trial takes the earlier trial's value
and run, and `tune-report --ensemble_top` never takes two identical configurations."""

from __future__ import annotations

import json

import optuna
import pytest

from tune_fixtures import shards, tune_file  # noqa: F401  (a fixture)
from yt8m import cli

pytestmark = pytest.mark.integration


def test_a_repeated_configuration_is_trained_once_and_never_ensembled_twice(tmp_path, shards, capsys):
    # Two choices and four trials: trial 2 is queued with trial 0's configuration, trial 3 samples one of the two.
    search = {"base_learning_rate": {"type": "categorical", "choices": [0.1, 0.02]}}
    enqueue = [{"base_learning_rate": 0.1}, {"base_learning_rate": 0.02}, {"base_learning_rate": 0.1}]
    path = tune_file(tmp_path / "tune.yaml", shards, search, model="LogisticModel",
                     tune={"enqueue": enqueue, "pruner": "none", "sampler": "random"})
    assert cli.main(["tune", "--config", path, "--n_trials", "4"]) == 0, capsys.readouterr().err[-3000:]
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    study_dir = summary["study_dir"]
    trials = optuna.load_study(study_name="tune", storage=f"sqlite:///{study_dir}/study.db").trials
    assert [trial.state.name for trial in trials] == ["COMPLETE"] * 4
    first, second, repeat, sampled = trials
    assert "duplicate_of" not in first.user_attrs and "duplicate_of" not in second.user_attrs
    original = first if sampled.params == first.params else second
    for duplicate, of in ((repeat, first), (sampled, original)):
        assert duplicate.user_attrs["duplicate_of"] == of.number and duplicate.value == of.value
        assert duplicate.user_attrs["train_dir"] == of.user_attrs["train_dir"]
        assert duplicate.user_attrs["best_step"] == of.user_attrs["best_step"]
        assert duplicate.user_attrs["examples"] == 0
    # Only the two configurations trained: two trial folders.
    assert sorted(folder.name for folder in (tmp_path / "study" / "trials").iterdir()) == ["trial-0", "trial-1"]
    leaderboard = (tmp_path / "study" / "leaderboard.txt").read_text()
    assert f"the configuration of trial {first.number}: its value, not trained again" in leaderboard

    assert cli.main(["tune-report", study_dir, "--ensemble_top", "2"]) == 0
    ensemble = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ensemble"]
    assert sorted(ensemble["trials"]) == [0, 1]
    assert cli.main(["tune-report", study_dir, "--ensemble_top", "3"]) == 1
    assert "has 2 complete trials of distinct configurations" in capsys.readouterr().err

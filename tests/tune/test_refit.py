"""tune-report --refit_top K --crossfit_folds F --holdout PATTERN: the best configurations trained again on every
labelled shard but the held-out ones, at their best epochs; cross-fitted fold by fold, their out-of-fold predictions
fitting the weights; the ensembles scored on the held-out shards; the printed command predicting with the chosen one."""

from __future__ import annotations

import json
import logging
import shlex
import subprocess

import optuna
import pytest
import yaml

from conftest import venv_environment
from tune_fixtures import shards, tune_file  # noqa: F401  (a fixture)
from yt8m import cli

pytestmark = pytest.mark.integration


def test_refit_and_crossfit_score_on_held_out_shards_and_print_a_working_command(tmp_path, shards, capsys):  # noqa: F811
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": {"type": "float", "low": 0.01,
                                                                              "high": 0.3, "log": True}},
                     tune={"n_trials": 2, "pruner": "none", "sampler": "random"}, model="LogisticModel", num_epochs=3)
    assert cli.main(["tune", "--config", path]) == 0
    capsys.readouterr()
    holdout = str(shards / "validate-00001-of-00002.tfrecord")
    assert cli.main(["tune-report", str(tmp_path / "study"), "--refit_top", "2", "--crossfit_folds", "2",
                     "--holdout", holdout]) == 0
    summary = json.loads(capsys.readouterr().out)["refit"]
    labelled = sorted(str(p) for p in shards.glob("*.tfrecord") if str(p) != holdout)
    assert summary["labelled_shards"] == 3 and len(summary["weights"]) == 2
    assert sum(summary["weights"]) == pytest.approx(1.0, abs=1e-5)
    for runs in summary["fold_dirs"]:
        trained = [set(yaml.safe_load(open(f"{run}/config.yaml"))["data"]["train_data_pattern"].split(","))
                   for run in runs]
        assert [sorted(set(labelled) - shards_) for shards_ in trained] == [labelled[0::2], labelled[1::2]]
        assert all(holdout not in shards_ for shards_ in trained)
    for oof in summary["out_of_fold"]:  # every labelled video once, predicted by the fold model that did not see it
        ids = [json.loads(line)["video_id"] for line in open(oof)]
        assert len(ids) == len(set(ids)) == 240 + 60
    assert set(summary["holdout_scores"]) == {"refits", "folds", "best_single_refit"}
    assert summary["chosen"] == max(("refits", "folds"), key=lambda name: summary["holdout_scores"][name]["gap"])
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    for number, run in zip(summary["trials"], summary["refits"]):
        config = yaml.safe_load(open(f"{run}/config.yaml"))
        assert set(config["data"]["train_data_pattern"].split(",")) == set(labelled)
        assert config["schedule"]["num_epochs"] == study.trials[number].user_attrs["best_epoch"]
    command = shlex.split(summary["predict"].replace("TEST_PATTERN", holdout).replace(
        "predictions.csv", str(tmp_path / "p.csv")))
    assert command[:2] == ["yt8m", "ensemble"] and cli.main(command[1:]) == 0
    assert len(open(tmp_path / "p.csv").read().splitlines()) == 60 + 1


def test_refit_without_folds_fits_its_weights_on_the_validation_shards_not_held_out(tmp_path, shards, capsys,  # noqa: F811
                                                                                   caplog):
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": {"type": "float", "low": 0.01,
                                                                              "high": 0.3, "log": True}},
                     tune={"n_trials": 2, "pruner": "none", "sampler": "random"}, model="LogisticModel",
                     early_stopping_patience=1)  # the trials' early stopping is off in a refit, which validates none
    assert cli.main(["tune", "--config", path]) == 0
    capsys.readouterr()
    validation = sorted(str(p) for p in shards.glob("validate-*.tfrecord"))
    assert cli.main(["tune-report", str(tmp_path / "study"), "--refit_top", "1", "--holdout", validation[1]]) == 0
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="yt8m.tune"):
        assert cli.main(["tune-report", str(tmp_path / "study"), "--refit_top", "2", "--holdout", validation[1]]) == 0
    summary = json.loads(capsys.readouterr().out)["refit"]
    # The best trial's refit, finished by the run before, is only resumed: the time left waits for one that trains.
    progress = [message.split("refit: ", 1)[1] for message in caplog.messages if "models done in" in message]
    assert len(progress) == 2
    assert progress[0].startswith("1/2") and progress[0].endswith(
        "(1 found finished by an earlier run), the time left is known once one trains")
    assert progress[1].startswith("2/2") and "(1 found finished by an earlier run), about 0 s left" in progress[1]
    assert summary["fit_videos"] == 60  # the first validation shard's videos; the held-out shard's 60 are not seen
    assert set(summary["holdout_scores"]) == {"refits", "best_single_refit"}
    # The written script predicts the held-out shard with the chosen ensemble, as the printed command does.
    done = subprocess.run(["sh", summary["predict_script"], validation[1], str(tmp_path / "held.csv")],
                          env=venv_environment(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(open(tmp_path / "held.csv").read().splitlines()) == 60 + 1
    # Holding out every validation shard leaves nothing to fit the weights on: one line, not a biased fit.
    assert cli.main(["tune-report", str(tmp_path / "study"), "--refit_top", "2", "--holdout",
                     ",".join(validation)]) != 0
    stderr = capsys.readouterr().err  # the leaderboard, then the one line
    assert "Traceback" not in stderr and "holds out every validation shard" in stderr.strip().splitlines()[-1]
    # A study that does not search the model has no models to take the best of.
    assert cli.main(["tune-report", str(tmp_path / "study"), "--refit_top", "2", "--diverse"]) != 0
    assert "does not search `model`" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_refit_that_needs_a_removed_trial_model_says_so_before_training(tmp_path, shards, capsys):  # noqa: F811
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": {"type": "float", "low": 0.01,
                                                                              "high": 0.3, "log": True}},
                     tune={"n_trials": 2, "pruner": "none", "sampler": "random", "keep_best": 1},
                     model="LogisticModel", num_epochs=1)
    assert cli.main(["tune", "--config", path]) == 0
    capsys.readouterr()
    # Without folds the weights are fitted on the trials' own models, and keep_best 1 removed the second one's.
    validation = sorted(str(p) for p in shards.glob("validate-*.tfrecord"))
    assert cli.main(["tune-report", str(tmp_path / "study"), "--refit_top", "2", "--holdout", validation[1]]) != 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "kept no checkpoints" in last and "keep_best is 1" in last
    assert not (tmp_path / "study" / "refit").exists()  # nothing trained first

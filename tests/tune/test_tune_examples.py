"""`yt8m tune --resource examples`: a trial's budget in training examples (num_epochs of the training set, sized
from its shards), validated and reported at rungs of it, where successive halving and Hyperband promote the best."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml

from tune_fixtures import shards, tune_file  # noqa: F401  (a fixture)
from yt8m import cli
from yt8m.config import config_values, load_config
from yt8m.training import TrainConfig
from yt8m.tuning.budget import BUDGET_ATTR, example_rungs
from yt8m.tuning.space import PruningSettings, load_tune_spec
from yt8m.tuning.study import create_pruner

pytestmark = pytest.mark.integration

LEARNING_RATE = {"base_learning_rate": {"type": "float", "low": 1e-7, "high": 0.5, "log": True}}


def test_rungs_are_geometric_and_end_within_the_budget():
    assert example_rungs(720, PruningSettings()) == (26, 78, 234, 702)
    assert example_rungs(3_900_000, PruningSettings(rungs=3, reduction_factor=4)) == (243_750, 975_000, 3_900_000)
    assert example_rungs(10, PruningSettings(rungs=4)) == (1, 3, 9, 27)  # at least one example a rung


def test_the_pruners_take_the_rungs_as_their_resource():
    rungs = (26, 78, 234, 702)
    halving = create_pruner(PruningSettings(pruner="successive_halving"), 3, rungs)
    assert (halving._min_resource, halving._reduction_factor) == (26, 3)
    hyperband = create_pruner(PruningSettings(pruner="hyperband", reduction_factor=3), 3, rungs)
    assert (hyperband._min_resource, hyperband._max_resource, hyperband._reduction_factor) == (26, 702, 3)
    # The median pruner's warm-up counts rungs: never at the first two.
    assert create_pruner(PruningSettings(n_warmup_steps=2), 3, rungs)._n_warmup_steps == 234
    assert create_pruner(PruningSettings(n_warmup_steps=9), 3, rungs)._n_warmup_steps == 703


def test_a_trial_reports_at_the_rungs_and_successive_halving_stops_the_poor_one_at_the_first(tmp_path, shards,
                                                                                                capsys):
    """240 training videos, 3 epochs: a budget of 720 examples, rungs at 26, 78, 234 and 702; batches of 30."""
    enqueue = [{"base_learning_rate": 0.1}, {"base_learning_rate": 1e-7}]
    path = tune_file(tmp_path / "tune.yaml", shards, LEARNING_RATE, model="LogisticModel", num_epochs=3,
                     tune={"enqueue": enqueue, "resource": "examples", "pruner": "successive_halving"})
    assert cli.main(["tune", "--config", path, "--n_trials", "2"]) == 0, capsys.readouterr().err[-3000:]
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{summary['study_dir']}/study.db")
    budget = study.user_attrs[BUDGET_ATTR]
    assert budget == {"videos": 240, "epochs": 3, "rungs": [26, 78, 234, 702]}
    complete, pruned = study.trials
    assert complete.state.name == "COMPLETE" and pruned.state.name == "PRUNED"
    assert list(complete.intermediate_values) == [26, 78, 234, 702]
    assert complete.user_attrs["examples"] == 720 and complete.value == max(complete.intermediate_values.values())
    # Stopped at the step that reached the first rung (30 examples), judged against the first trial there.
    assert list(pruned.intermediate_values) == [26] and pruned.user_attrs["examples"] == 30
    saved = yaml.safe_load((Path(complete.user_attrs["train_dir"]) / "config.yaml").read_text())
    assert saved["checkpoints"]["checkpoint_at_examples"] == [26, 78, 234, 702]
    # Validated at the rungs (steps 1, 3, 8, 24) and at each epoch's end (8, 16, 24), each step once.
    evaluated = sorted(int(path.stem[len("metrics-"):])
                       for path in (Path(complete.user_attrs["train_dir"]) / "eval").glob("metrics-*.json"))
    assert evaluated == [1, 3, 8, 16, 24]
    # A retrain sees the examples the trial's value was measured at: its best validation's step, at its batch size.
    best = config_values(load_config(TrainConfig, str(Path(summary["study_dir"]) / "best.yaml")))
    assert best["max_steps"] == complete.user_attrs["best_step"] and best["batch_size"] == 30


@pytest.mark.parametrize("tune, search, expected", [
    ({"report_every_steps": 4}, {}, "tune.resource examples reports at rungs of the example budget; remove "
                                    "tune.report_every_steps"),
    ({}, {"num_epochs": {"type": "int", "low": 1, "high": 3}},
     "every trial's budget is train.num_epochs of the training set; remove num_epochs from search:"),
])
def test_a_budget_in_examples_refuses_what_would_make_trials_budgets_differ(tmp_path, shards, tune, search,
                                                                           expected):
    path = tune_file(tmp_path / "tune.yaml", shards, {**LEARNING_RATE, **search}, tune={"resource": "examples", **tune})
    with pytest.raises(ValueError, match="problem") as raised:
        load_tune_spec(path)
    assert expected in str(raised.value)

"""The measured recipes of configs/recipes/: each states what it reaches (GAP, time, machine); a training recipe
trains, validates and exports through `yt8m train --config` as written, and a command sequence (.sh) runs whole, on
synthetic shards of the real data's shape."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, venv_environment
from yt8m.config import config_values, load_config
from yt8m.data.making.synthetic import write_synthetic
from yt8m.training import TrainConfig

RECIPES = sorted((REPO_ROOT / "configs" / "recipes").glob("*.yaml"))
SEQUENCES = sorted((REPO_ROOT / "configs" / "recipes").glob("*.sh"))


def test_there_are_recipes_and_each_states_its_measured_figures():
    assert len(RECIPES) >= 2 and SEQUENCES
    for path in RECIPES + SEQUENCES:
        header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
        assert re.search(r"Expected \(measured.*\): GAP 0\.\d{3}", header, re.S), path.name
        assert re.search(r"\d+ (minutes?|seconds)", header) and "cores" in header, path.name


@pytest.fixture(scope="module")
def real_shaped_shards(tmp_path_factory) -> Path:
    """Video-level shards with the 2018 release's features and classes (1024 + 128 values, 3,862 classes)."""
    root = tmp_path_factory.mktemp("recipes")
    write_synthetic(str(root), kind="video", num_classes=3862, train_videos=96, validate_videos=32, test_videos=8,
                    shards=2, seed=5)
    return root / "video"


@pytest.mark.parametrize("path", RECIPES, ids=lambda path: path.stem)
def test_a_recipe_trains_validates_and_exports_as_written(tmp_path, real_shaped_shards, path):
    train_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "yt8m", "train", "--config", str(path), "--train_dir", str(train_dir),
                           "--train_data_pattern", str(real_shaped_shards / "train-*"),
                           "--eval_data_pattern", str(real_shaped_shards / "validate-*"), "--num_epochs", "2"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    recipe = yaml.safe_load(path.read_text())
    saved = config_values(load_config(TrainConfig, str(train_dir / "config.yaml")))
    overridden = {"num_epochs", "feature_names", "feature_sizes"}  # the flag above; lists are saved in another form
    assert {name: str(saved[name]) for name in recipe if name not in overridden} == \
        {name: str(value) for name, value in recipe.items() if name not in overridden}
    assert len(list((train_dir / "eval").glob("metrics-*.json"))) == 2  # validated after each epoch
    assert list((train_dir / "export" / "best").iterdir())


def test_the_tune_refit_ensemble_sequence_runs_whole_and_scores_its_held_out_shard(tmp_path, real_shaped_shards):
    """Tune (2 trials), refit the best 2 without the held-out shard, predict it with the ensemble and score it, then
    predict the test shards: what the recipe's header promises, at the size of a test."""
    tune = {"train": {"feature_names": "mean_rgb,mean_audio", "feature_sizes": "1024,128", "num_classes": 3862,
                      "batch_size": 32, "num_epochs": 2, "num_readers": 0,
                      "train_data_pattern": "set by the recipe", "eval_data_pattern": "set by the recipe"},
            "search": {"model": {"type": "categorical", "choices": ["LogisticModel", "MoeModel"]},
                       "base_learning_rate": {"type": "float", "low": 0.01, "high": 0.1, "log": True}},
            "objective": {"metric": "gap", "direction": "maximize"},
            "tune": {"sampler": "random", "pruner": "none"}}
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(tune))
    validation = sorted(str(path) for path in real_shaped_shards.glob("validate-*"))
    settings = {"CONFIG": str(tmp_path / "tune.yaml"), "TRAIN": str(real_shaped_shards / "train-*"),
                "VAL": ",".join(validation), "HOLDOUT": validation[1], "TEST": str(real_shaped_shards / "test-*"),
                "STUDY": str(tmp_path / "study"), "TIMEOUT": "600", "TRIALS": "2", "TOP": "2"}
    done = subprocess.run(["sh", str(REPO_ROOT / "configs" / "recipes" / "tune_refit_ensemble.sh")], cwd=tmp_path,
                          env={**venv_environment(), **settings},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    refit = json.loads((tmp_path / "study" / "refit.json").read_text())["refit"]
    assert len(refit["refits"]) == 2 and refit["fit_videos"] == 16  # the validation shard not held out
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    score = next(line for line in lines if "num_videos" in line)  # `yt8m score`'s line for the held-out shard
    assert score["num_videos"] == 16
    assert score["gap"] == pytest.approx(refit["holdout_scores"][refit["chosen"]]["gap"], abs=1e-4)
    with open(tmp_path / "predictions.csv") as rows:
        table = list(csv.reader(rows))
    assert table[0] == ["VideoId", "LabelConfidencePairs"] and len(table) == 8 + 1  # the test shards' videos

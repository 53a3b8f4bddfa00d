"""The measured recipes of configs/recipes/: each states what it reaches (GAP, time, machine) and trains, validates
and exports through `yt8m train --config` as written, on synthetic shards of the real data's shape."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT
from yt8m.config import config_values, load_config
from yt8m.data.synthetic import write_synthetic
from yt8m.training import TrainConfig

RECIPES = sorted((REPO_ROOT / "configs" / "recipes").glob("*.yaml"))


def test_there_are_recipes_and_each_states_its_measured_figures():
    assert len(RECIPES) >= 2
    for path in RECIPES:
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

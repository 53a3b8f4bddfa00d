"""Each component's hyper-parameters under its own name, from the command line as a user runs it: a model of one's
own whose `moe_num_mixtures` is a string trains, evaluates and tunes beside MoeModel by `--model.moe_num_mixtures`;
MoeModel's starter-kit flag `--moe_num_mixtures` still works; the flat name given to the model of one's own is one
line naming both; `--help` shows the chosen component's own fields and defaults. And a config only describes: a module
of one's own that fails on import is imported when the run is built, and its error comes before the train dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, tiny_data  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

WORDY = '''
"""A user's mixture whose number of experts is a word: the same name as MoeModel's hyper-parameter, another type."""

from torch import nn

EXPERTS = {"one": 1, "two": 2, "three": 3}


class WordyMoe(nn.Module):
    def __init__(self, feature_size: int, num_classes: int, moe_num_mixtures: str = "two"):
        super().__init__()
        self.experts, self.num_classes = EXPERTS[moe_num_mixtures], num_classes
        self.linear = nn.Linear(feature_size, num_classes * self.experts)

    def forward(self, features):
        return self.linear(features).view(len(features), self.experts, self.num_classes).mean(dim=1)
'''
BROKEN = '''
"""A user's module that fails on import, leaving a mark that it ran."""

import pathlib

pathlib.Path(__file__).with_name("imported.txt").write_text("imported")
raise RuntimeError("broken on purpose")
'''


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    (tmp_path / "wordy.py").write_text(WORDY)
    (tmp_path / "broken.py").write_text(BROKEN)
    return tmp_path


def yt8m(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "yt8m", *map(str, args)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)


def features() -> list[str]:
    return ["--feature_names", "mean_rgb,mean_audio", "--feature_sizes", ",".join(map(str, FEATURE_SIZES)),
            "--num_classes", str(NUM_CLASSES), "--batch_size", "64", "--num_epochs", "1", "--num_readers", "0"]


def test_a_hyper_parameter_of_its_own_type_beside_moe_models_trains_evaluates_and_tunes(user_dir, tiny_data):
    trained = yt8m(user_dir, "train", "--model", "wordy:WordyMoe", "--model.moe_num_mixtures", "three",
                   "--train_data_pattern", tiny_data["train_pattern"], "--train_dir", "wordy", *features())
    assert trained.returncode == 0, trained.stderr
    stored = yaml.safe_load((user_dir / "wordy" / "config.yaml").read_text())["model"]
    assert stored == {"name": "wordy:WordyMoe", "hparams": {"l2_penalty": 1e-8, "moe_num_mixtures": "three"},
                      "trunk_hidden_sizes": [], "input_l2_normalize": True}
    evaluated = yt8m(user_dir, "eval", "--train_dir", "wordy", "--eval_data_pattern", tiny_data["validate_pattern"],
                     "--run_once")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout.splitlines()[-1])["num_videos"] == 64

    moe = yt8m(user_dir, "train", "--model", "MoeModel", "--moe_num_mixtures", "3", "--train_data_pattern",
               tiny_data["train_pattern"], "--train_dir", "moe", *features())
    assert moe.returncode == 0, moe.stderr
    assert yaml.safe_load((user_dir / "moe" / "config.yaml").read_text())["model"]["hparams"]["moe_num_mixtures"] == 3

    tuning = {"train": {"train_data_pattern": tiny_data["train_pattern"], "eval_data_pattern":
                        tiny_data["validate_pattern"], "feature_names": "mean_rgb,mean_audio",
                        "feature_sizes": ",".join(map(str, FEATURE_SIZES)), "num_classes": NUM_CLASSES,
                        "batch_size": 64, "num_epochs": 1, "num_readers": 0},
              "search": {"model": {"type": "categorical", "choices": ["MoeModel", "wordy:WordyMoe"]},
                         "model.moe_num_mixtures": {"type": "categorical", "choices": ["one", "three"],
                                                    "when": {"model": "wordy:WordyMoe"}}},
              "tune": {"study_dir": "study", "n_trials": 3, "pruner": "none",
                       "enqueue": [{"model": "MoeModel"}, {"model": "wordy:WordyMoe", "model.moe_num_mixtures": "one"},
                                   {"model": "wordy:WordyMoe", "model.moe_num_mixtures": "three"}]}}
    (user_dir / "tune.yaml").write_text(yaml.safe_dump(tuning))
    tuned = yt8m(user_dir, "tune", "--config", "tune.yaml")
    assert tuned.returncode == 0, tuned.stderr
    assert json.loads(tuned.stdout.splitlines()[-1])["n_trials"]["complete"] == 3
    trained_with = [yaml.safe_load((folder / "config.yaml").read_text())["model"]
                    for folder in sorted((user_dir / "study" / "trials").iterdir())]
    assert [(model["name"], model["hparams"]["moe_num_mixtures"]) for model in trained_with] == [
        ("MoeModel", 2), ("wordy:WordyMoe", "one"), ("wordy:WordyMoe", "three")]


def test_the_flat_name_two_components_declare_is_one_line_naming_both(user_dir, tiny_data):
    result = yt8m(user_dir, "train", "--model", "wordy:WordyMoe", "--moe_num_mixtures", "three",
                  "--train_data_pattern", tiny_data["train_pattern"], "--train_dir", "run", *features())
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "--moe_num_mixtures is a hyper-parameter of both wordy:WordyMoe and DbofModel, DeepClassifierModel, " \
           "GatedDbofModel, ...: give it as --model.moe_num_mixtures" in result.stderr
    assert not (user_dir / "run").exists()


def test_a_misspelt_dotted_name_is_named_with_the_nearest_the_component_has(user_dir, tiny_data):
    result = yt8m(user_dir, "train", "--model", "MoeModel", "--model.moe_num_mixture", "3",
                  "--train_data_pattern", tiny_data["train_pattern"], "--train_dir", "run", *features())
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "--model.moe_num_mixture: MoeModel has no hyper-parameter 'moe_num_mixture'; did you mean " \
           "'moe_num_mixtures'?" in result.stderr


def test_help_shows_the_chosen_components_own_fields_and_defaults(user_dir):
    wordy = yt8m(user_dir, "train", "--model", "wordy:WordyMoe", "--help").stdout
    assert "model wordy:WordyMoe's hyper-parameters" in wordy and "MoeModel's" not in wordy
    own = wordy.split("model wordy:WordyMoe's hyper-parameters", 1)[1]
    assert "--model.moe_num_mixtures STR" in own and "(default: two)" in own
    moe = yt8m(user_dir, "train", "--model", "MoeModel", "--help").stdout.split("model MoeModel's hyper-parameters")[1]
    assert "--model.moe_num_mixtures INT" in moe and "(default: 2; also --moe_num_mixtures)" in moe


def test_a_module_that_fails_on_import_is_imported_only_when_the_run_is_built(user_dir, tiny_data):
    """Reading and checking the config imports nothing (no mark); building the run imports the module, and its error
    is one line before the train dir exists."""
    script = (f"import sys, yt8m\nfrom yt8m.config import config_from_dict\n"
              f"from yt8m.models.config import ModelConfig\nfrom yt8m.tasks.losses import LossConfig\n"
              f"config = config_from_dict(yt8m.TrainConfig, {{'model': 'broken:Model', 'model.width': 3, "
              f"'label_loss': 'broken:loss', 'train_data_pattern': {tiny_data['train_pattern']!r}, "
              f"'train_dir': 'run'}})\n"
              f"yt8m.TrainConfig(model=ModelConfig('broken:Model', {{'width': 3}}), loss=LossConfig('broken:loss'))\n"
              f"import pathlib\nassert not pathlib.Path('imported.txt').exists()\n"
              f"try:\n    yt8m.train(config)\nexcept ValueError as err:\n    print(err)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=user_dir, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "--model broken:Model: cannot import module 'broken' (RuntimeError: broken on purpose)" in result.stdout
    assert (user_dir / "imported.txt").exists() and not (user_dir / "run").exists()
    (user_dir / "imported.txt").unlink()
    command = yt8m(user_dir, "train", "--model", "broken:Model", "--train_data_pattern", tiny_data["train_pattern"],
                   "--train_dir", "run")
    assert command.returncode == 1 and command.stderr.count("\n") == 1, command.stderr
    assert "cannot import module 'broken' (RuntimeError: broken on purpose), raised at" in command.stderr
    assert not (user_dir / "run").exists()

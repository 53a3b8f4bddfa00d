"""Adding a model is its file and nothing else: a copy of the package with one new file in models/ trains the new
model through `yt8m train`, its hyper-parameter a flag, config field and checkpoint field like the starter kit's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, tiny_data  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

EXAMPLE_MODEL = '''
"""An example model added in its own file: a hidden layer of `example_width` units, then logistic regression."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

import pytest

from yt8m.fields import setting
from yt8m.models.base import ClassifierHParams, BaseModel, starter_linear
from yt8m.models.registry import register_model


@dataclass(frozen=True)
class ExampleHParams(ClassifierHParams):
    example_width: int = setting(8, "ExampleModel: units of the hidden layer.", at_least=1)


@register_model(ExampleHParams)
class ExampleModel(BaseModel):
    def __init__(self, feature_size: int, num_classes: int, hparams: ExampleHParams = ExampleHParams()):
        super().__init__(feature_size, num_classes, hparams)
        self.hidden = starter_linear(feature_size, hparams.example_width)
        self.out = starter_linear(hparams.example_width, num_classes)

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(features)))

    def penalized_weights(self) -> list[torch.Tensor]:
        return [self.out.weight]
'''


def test_a_new_model_file_is_all_it_takes(tiny_data, tmp_path):
    source = Path(__file__).resolve().parents[2] / "src" / "yt8m"
    package = tmp_path / "src" / "yt8m"
    shutil.copytree(source, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "models" / "example.py").write_text(EXAMPLE_MODEL)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    train_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "yt8m", "train", "--model", "ExampleModel", "--example_width", "5",
         "--train_data_pattern", tiny_data["train_pattern"], "--train_dir", str(train_dir),
         "--feature_names", "mean_rgb,mean_audio", "--feature_sizes", ",".join(map(str, FEATURE_SIZES)),
         "--num_classes", str(NUM_CLASSES), "--batch_size", "64", "--num_epochs", "1", "--num_readers", "0"],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["global_step"] == 4
    assert yaml.safe_load((train_dir / "config.yaml").read_text())["model"]["hparams"]["example_width"] == 5
    refused = subprocess.run([sys.executable, "-m", "yt8m", "train", "--model", "ExampleModel", "--example_width", "0",
                              "--train_data_pattern", "x"], capture_output=True, text=True, env=env, timeout=300)
    assert "--example_width must be at least 1, got 0" in refused.stderr

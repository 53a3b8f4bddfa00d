"""--ema_decay: the weight average follows the live weights with TensorFlow's warm-up decay, and it is the model a run
evaluates and checkpoints as its model (which `yt8m eval`, predict and export load), beside the live weights."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from workflow_fixtures import as_flags, tiny_data, tiny_train_config  # noqa: F401  (fixture)
from yt8m.config import config_values
from yt8m.data.reading.dataset import YT8MDataset
from yt8m.eval.evaluate import evaluate_model
from yt8m.io.checkpoints import final_checkpoint, load_checkpoint
from yt8m.models.checkpoints import build_model_from_payload
from yt8m.tasks.video import features_task
from yt8m.training.weight_average import WeightAverage


def test_the_average_follows_the_live_weights_with_the_warm_up_decay():
    live = nn.Linear(3, 2)
    average = WeightAverage(live, decay=0.5)
    expected = live.weight.detach().clone()
    for step in range(1, 6):
        with torch.no_grad():
            live.weight.add_(1.0)
        average.update(live)
        decay = min(0.5, (1 + step) / (10 + step))  # 2/11, 3/12, 4/13, then 0.5
        expected = decay * expected + (1 - decay) * live.weight.detach()
        torch.testing.assert_close(average.model.weight, expected)
    assert not any(p.requires_grad for p in average.model.parameters())
    with pytest.raises(ValueError, match="ema_decay"):
        WeightAverage(live, decay=1.0)


def yt8m(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yt8m", *map(str, args)], capture_output=True, text=True, timeout=300)


def test_a_run_with_ema_decay_evaluates_checkpoints_and_predicts_with_the_average(tiny_data, tmp_path):
    train_dir = tmp_path / "run"
    config = tiny_train_config(tiny_data, train_dir, ema_decay=0.8, eval_data_pattern=tiny_data["validate_pattern"])
    trained = yt8m("train", *as_flags(config_values(config)))
    assert trained.returncode == 0, trained.stderr[-3000:]
    checkpoint = load_checkpoint(final_checkpoint(str(train_dir)))
    averaged, live = checkpoint.model, checkpoint.trained_weights
    assert averaged.keys() == live.keys()
    assert any(not torch.equal(averaged[name], live[name]) for name in averaged)
    in_training = json.loads((train_dir / "eval" / f"metrics-{checkpoint.step:08d}.json").read_text())
    evaluated = yt8m("eval", "--train_dir", train_dir, "--run_once", "--eval_data_pattern",
                     tiny_data["validate_pattern"])
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout)["gap"] == pytest.approx(in_training["gap"], abs=1e-9)
    # Its live weights score differently: the evaluation above was of the average.
    trained = build_model_from_payload(dataclasses.replace(checkpoint, model=live), "live weights")
    dataset = YT8MDataset(tiny_data["validate_pattern"], trained.features, 64)
    on_live = evaluate_model(trained.network, dataset, features_task(trained.features, "CrossEntropyLoss"))
    assert on_live["gap"] != pytest.approx(in_training["gap"], abs=1e-6)

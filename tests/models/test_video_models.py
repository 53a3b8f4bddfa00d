"""The video-level models of the winning entries as a user runs them, both in one: DeepClassifierModel on
GatedMoeModel. `yt8m train` eager, --compile (the eager losses) and --mixed_precision, `yt8m export` then
`yt8m predict --model` (the checkpoint's predictions), and 2 processes under torchrun. (Each model alone: the
contract, learning and ONNX parity tests over every registered model.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from workflow_fixtures import NUM_CLASSES, as_flags, tiny_data, tiny_train_config  # noqa: F401  (fixtures)
from yt8m.cli import main as cli_main
from yt8m.config import config_values
from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset
from yt8m.eval.score import read_predictions_csv
from yt8m.models.config import build_model
from yt8m.tasks.taskset import one_task_set
from yt8m.training import fit
from yt8m.training.checks import checked_train_config
from yt8m.training.optim import OptimizerConfig, build_optimizer

pytestmark = pytest.mark.integration

# No dropout: compiled code draws its dropout masks from another generator than eager PyTorch, so the compiled
# run's losses would differ from the eager run's by more than float tolerance.
MODEL = dict(model="DeepClassifierModel", deep_hidden_size=32, deep_dropout=0.0,
             video_level_classifier_model="GatedMoeModel")


def flags(data: dict, train_dir, **overrides) -> list[str]:
    return as_flags(config_values(tiny_train_config(data, train_dir, num_epochs=2, **{**MODEL, **overrides})))


def run_yt8m(*argv: str, launcher: tuple[str, ...] = ()) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, *launcher, "-m", "yt8m", *argv], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def eager_run(tiny_data, tmp_path_factory) -> tuple[object, dict]:
    train_dir = tmp_path_factory.mktemp("deep") / "eager"
    return train_dir, run_yt8m("train", *flags(tiny_data, train_dir))


def test_compiled_training_matches_eager_training(eager_run, tiny_data, tmp_path):
    _, eager = eager_run
    compiled = run_yt8m("train", *flags(tiny_data, tmp_path / "compiled"), "--compile")
    assert compiled["global_step"] == eager["global_step"] == 8
    assert compiled["loss"] == pytest.approx(eager["loss"], rel=1e-4)


def test_mixed_precision_trains(eager_run, tiny_data, tmp_path):
    _, eager = eager_run
    mixed = run_yt8m("train", *flags(tiny_data, tmp_path / "mixed", deep_dropout=0.3), "--mixed_precision")
    assert mixed["global_step"] == 8 and np.isfinite(mixed["loss"])
    # autocast ran: the step's matmuls computed in bfloat16 (float32 without --mixed_precision)
    assert linear_output_dtypes(tiny_data, tmp_path / "dtypes", mixed_precision=True) == {torch.bfloat16}
    assert linear_output_dtypes(tiny_data, tmp_path / "dtypes", mixed_precision=False) == {torch.float32}


def linear_output_dtypes(data: dict, train_dir, mixed_precision: bool) -> set:
    """The dtypes the model's linear layers give in one training step of the loop (`fit`)."""
    config = tiny_train_config(data, train_dir, max_steps=1, mixed_precision=mixed_precision, start_new_model=True,
                               **MODEL)
    checked_train_config(config)
    model = build_model(config.model, config.features)
    seen = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda module, inputs, output: seen.add(output.dtype))
    dataset = YT8MDataset(config.data.train_data_pattern, config.features, config.schedule.batch_size)
    tasks = one_task_set(config.main_task(), config.validation.top_n)
    fit(model, build_optimizer(config.optimizer, model.parameters()), tasks, lambda epoch: dataset, config)
    return seen


def test_the_onnx_export_predicts_as_the_checkpoint(eager_run, tiny_data, tmp_path, capsys):
    train_dir, _ = eager_run
    assert cli_main(["export", "--train_dir", str(train_dir), "--output", str(tmp_path / "onnx")]) == 0
    common = ["predict", "--input_data_pattern", tiny_data["validate_pattern"], "--num_readers", "0"]
    assert cli_main([*common, "--model", str(tmp_path / "onnx"), "--output_file", str(tmp_path / "onnx.csv")]) == 0
    assert cli_main([*common, "--train_dir", str(train_dir), "--output_file", str(tmp_path / "torch.csv")]) == 0
    by_onnx, by_torch = (read_predictions_csv(str(tmp_path / name), NUM_CLASSES) for name in ("onnx.csv", "torch.csv"))
    assert list(by_onnx) == list(by_torch) and len(by_torch) == 64
    for video_id, (classes, confidences) in by_torch.items():
        np.testing.assert_array_equal(by_onnx[video_id][0], classes)
        np.testing.assert_allclose(by_onnx[video_id][1], confidences, atol=1e-5)


def test_two_processes_under_torchrun(tiny_data, tmp_path):
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
    summary = run_yt8m("train", *flags(tiny_data, tmp_path / "run", batch_size=32, deep_dropout=0.3),
                       launcher=torchrun)
    assert summary["processes"] == 2 and summary["global_step"] == 8 and summary["examples"] == 2 * 240
    assert np.isfinite(summary["loss"])

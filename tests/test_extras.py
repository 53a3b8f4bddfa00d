"""Without the optional extras (onnx, plots, tensorboard) the base install still trains, evaluates and tunes; what
needs a missing extra says which one, in one line. Each test hides the extras' modules from a fresh `yt8m`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, as_flags, tiny_data, tiny_train_config  # noqa: F401
from yt8m.config import config_values

pytestmark = pytest.mark.integration

# Runs the yt8m command with the modules named first made unimportable, as where their extra is not installed.
WITHOUT = "import sys; [sys.modules.__setitem__(m, None) for m in sys.argv[1].split(',')]; " \
          "from yt8m.cli import main; sys.exit(main(sys.argv[2:]))"
ALL_EXTRAS = "tensorboard,matplotlib,onnx,onnxscript,onnxruntime"


def yt8m_without(modules: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT, modules, *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_training_and_evaluation_run_without_tensorboard(tiny_data, tmp_path):
    values = {**config_values(tiny_train_config(tiny_data, tmp_path / "run", num_epochs=1)),
              "eval_data_pattern": tiny_data["validate_pattern"]}
    result = yt8m_without(ALL_EXTRAS, "train", *as_flags(values))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["evaluations"] == 1
    assert "TensorBoard curves are not written: the tensorboard extra is not installed" in result.stderr
    assert not list((tmp_path / "run").rglob("events.out.tfevents.*"))
    evaluated = yt8m_without(ALL_EXTRAS, "eval", "--train_dir", tmp_path / "run", "--run_once",
                             "--eval_data_pattern", tiny_data["validate_pattern"])
    assert evaluated.returncode == 0, evaluated.stderr


def test_onnx_export_names_the_extra_it_needs(tiny_data, tmp_path):
    trained = yt8m_without(ALL_EXTRAS, "train", *as_flags(config_values(tiny_train_config(tiny_data, tmp_path / "run",
                                                                             num_epochs=1))))
    assert trained.returncode == 0, trained.stderr
    result = yt8m_without(ALL_EXTRAS, "export", "--train_dir", tmp_path / "run", "--output", tmp_path / "serving")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == ("yt8m export: error: ONNX export needs the onnx extra: "
                                                      "pip install 'yt8m[onnx]' (missing: onnx, onnxscript, onnxruntime)")


def test_a_study_is_tuned_and_reported_without_plots(tiny_data, tmp_path):
    study = tmp_path / "study"
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump({
        "train": {"train_data_pattern": tiny_data["train_pattern"], "eval_data_pattern": tiny_data["validate_pattern"],
                  "feature_names": "mean_rgb,mean_audio", "feature_sizes": ",".join(map(str, FEATURE_SIZES)),
                  "num_classes": NUM_CLASSES, "batch_size": 64, "num_epochs": 1, "num_readers": 0},
        "search": {"base_learning_rate": {"type": "float", "low": 0.01, "high": 0.1, "log": True}},
        "tune": {"study_dir": str(study), "n_trials": 1}}))
    result = yt8m_without(ALL_EXTRAS, "tune", "--config", tmp_path / "tune.yaml")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["best_value"] is not None
    assert "the study's plots are not drawn: the plots extra is not installed" in result.stderr
    assert (study / "best.yaml").exists() and not list(study.glob("*.png"))

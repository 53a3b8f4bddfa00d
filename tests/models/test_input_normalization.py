"""--input_l2_normalize: video-level features reach the model L2-normalized (the starter kit's) or, with it false, as
stored, in training, eval, predict and the ONNX export alike, the run's config.yaml keeping the choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import yaml
from torch import nn

import yt8m
from workflow_fixtures import NUM_CLASSES, tiny_data  # noqa: F401  (fixture)
from yt8m.cli import main as cli_main
from yt8m.io.checkpoints import load_checkpoint
from yt8m.models.registry import registered_model

SIZE = 16  # mean_rgb's, the first of the tiny data's features


class Recorder(nn.Module):
    """A logistic regression that keeps the L2 norm of every feature vector it is given."""

    norms: list[float] = []

    def __init__(self, feature_size: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(feature_size, num_classes)

    def forward(self, features):
        Recorder.norms.extend(features.detach().norm(dim=1).tolist())
        return self.linear(features)


def stored_norms(pattern: str) -> np.ndarray:
    """The norms of mean_rgb as the shards store it, sorted."""
    batches = yt8m.read_videos(pattern, feature_names="mean_rgb", feature_sizes=SIZE, num_classes=NUM_CLASSES)
    return np.sort(np.concatenate([batch.features.norm(dim=1).numpy() for batch in batches]))


def seen_by(call) -> np.ndarray:
    Recorder.norms.clear()
    call()
    return np.sort(np.asarray(Recorder.norms))


def train(data: dict, run: Path, **values) -> None:
    yt8m.train(train_data_pattern=data["train_pattern"], train_dir=str(run), feature_names="mean_rgb",
               feature_sizes=SIZE, num_classes=NUM_CLASSES, batch_size=64, num_epochs=1, num_readers=0,
               base_learning_rate=0.05, **values)


@pytest.mark.parametrize("normalize", [True, False])
def test_the_model_reads_the_features_normalized_or_as_stored_in_train_eval_and_predict(tiny_data, tmp_path,
                                                                                          normalize):
    run = tmp_path / "run"
    validate = tiny_data["validate_pattern"]
    with registered_model(Recorder):
        trained = seen_by(lambda: train(tiny_data, run, model="Recorder", input_l2_normalize=normalize))
        evaluated = seen_by(lambda: yt8m.evaluate(train_dir=str(run), eval_data_pattern=validate))
        predicted = seen_by(lambda: yt8m.predict(train_dir=str(run), input_data_pattern=validate, num_readers=0,
                                                 output_file=str(tmp_path / "predictions.csv")))
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["input_l2_normalize"] is normalize
    stored = stored_norms(validate)
    assert not np.allclose(stored, 1, atol=0.05)  # else the test could not tell the two apart
    for seen in (evaluated, predicted):
        np.testing.assert_allclose(seen, np.ones_like(stored) if normalize else stored, rtol=1e-5)
    train_norms = stored_norms(tiny_data["train_pattern"])
    assert len(trained) == len(train_norms)
    np.testing.assert_allclose(trained, np.ones_like(train_norms) if normalize else train_norms, rtol=1e-5)


@pytest.fixture
def unnormalized_run(tiny_data, tmp_path) -> Path:
    run = tmp_path / "logistic"
    train(tiny_data, run, model="LogisticModel", input_l2_normalize=False)
    return run


def test_the_onnx_export_of_a_run_without_it_computes_on_the_features_as_stored(tiny_data, unnormalized_run,
                                                                                  tmp_path):
    output = tmp_path / "exported"
    assert cli_main(["export", "--train_dir", str(unnormalized_run), "--output", str(output)]) == 0
    batch = next(iter(yt8m.read_videos(tiny_data["validate_pattern"], feature_names="mean_rgb", feature_sizes=SIZE,
                                       num_classes=NUM_CLASSES)))
    raw = batch.features.numpy()
    session = onnxruntime.InferenceSession(str(output / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {"features": raw})[0]
    weights = load_checkpoint(str(sorted((unnormalized_run / "checkpoints").glob("ckpt-*.pt"))[-1])).model
    expected = raw.astype(np.float64) @ weights["linear.weight"].double().numpy().T + \
        weights["linear.bias"].double().numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


def test_eval_refuses_another_choice_than_the_runs(tiny_data, unnormalized_run, capsys):
    code = cli_main(["eval", "--train_dir", str(unnormalized_run), "--eval_data_pattern",
                     tiny_data["validate_pattern"], "--run_once", "--input_l2_normalize", "true"])
    err = capsys.readouterr().err
    assert code != 0
    assert "--input_l2_normalize: given True" in err and "has False" in err


def test_frame_level_models_always_normalize_each_frame(tmp_path, capsys):
    code = cli_main(["train", "--train_data_pattern", str(tmp_path / "none-*"), "--train_dir", str(tmp_path / "r"),
                     "--frame_features", "--model", "FrameLevelLogisticModel", "--feature_names", "rgb",
                     "--feature_sizes", "1024", "--input_l2_normalize", "false"])
    assert code != 0
    assert "--input_l2_normalize false is for video-level features: FrameLevelLogisticModel reads frames" in \
        capsys.readouterr().err


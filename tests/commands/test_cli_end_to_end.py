"""The whole workflow through the `yt8m` command line on tiny data: synth, train, watching eval, predict, score.

Plus the frame-level path (DbofModel) through the same public functions.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workflow_fixtures import NUM_CLASSES, predict_config, train_config
from yt8m.data.making.synthetic import write_synthetic
from yt8m.eval.evaluate import evaluate_run
from yt8m.inference.predict import run_predict
from yt8m.training import train

pytestmark = pytest.mark.integration


def yt8m(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yt8m", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_synth_train_eval_predict_score(tmp_path):
    data = tmp_path / "data"
    synth = yt8m("synth", "--output_dir", data, "--num_classes", NUM_CLASSES, "--train_videos", 200,
                 "--validate_videos", 60, "--test_videos", 40, "--shards", 2, "--feature_sizes", "16,8")
    assert synth.returncode == 0, synth.stderr
    train_dir = tmp_path / "run"
    # The evaluator starts first, as beside a real job: it waits for the run, then for each checkpoint.
    watcher = subprocess.Popen([sys.executable, "-m", "yt8m", "eval", "--eval_data_pattern",
                                f"{data}/video/validate-*", "--train_dir", str(train_dir), "--num_readers", "0",
                                "--poll_interval_secs", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    (tmp_path / "train.yaml").write_text(
        f"train_data_pattern: {data}/video/train-*\nmodel: MoeModel\nfeature_names: mean_rgb,mean_audio\n"
        f"feature_sizes: 16,8\nnum_classes: {NUM_CLASSES}\nbatch_size: 50\nbase_learning_rate: 0.05\n")
    trained = yt8m("train", "--config", tmp_path / "train.yaml", "--train_dir", train_dir, "--num_epochs", 3,
                   "--export_model_steps", 4, "--num_readers", 0)
    assert trained.returncode == 0, trained.stderr
    summary = json.loads(trained.stdout)  # exactly one line: all logs went to stderr
    assert summary["global_step"] == 12 and summary["examples"] == 600
    assert "step 10" in trained.stderr and "gap" in trained.stderr

    out, err = watcher.communicate(timeout=120)
    assert watcher.returncode == 0, err
    watched = json_lines(out)
    assert watched[-1]["global_step"] == 12
    assert [r["global_step"] for r in watched] == sorted({r["global_step"] for r in watched})

    evaluated = yt8m("eval", "--eval_data_pattern", f"{data}/video/validate-*", "--train_dir", train_dir,
                     "--run_once", "--num_readers", 0)
    assert evaluated.returncode == 0, evaluated.stderr
    assert json_lines(evaluated.stdout) == [watched[-1]]

    predictions = tmp_path / "predictions.csv"
    predicted = yt8m("predict", "--input_data_pattern", f"{data}/video/test-*", "--train_dir", train_dir,
                     "--output_file", predictions, "--num_readers", 0)
    assert predicted.returncode == 0, predicted.stderr
    assert json.loads(predicted.stdout)["videos"] == 40

    scored = yt8m("score", "--predictions", predictions, "--labels", data / "video" / "test_labels.csv",
                  "--num_classes", NUM_CLASSES)
    assert scored.returncode == 0, scored.stderr
    assert json.loads(scored.stdout)["gap"] > 0.3

    refused = yt8m("train", "--config", tmp_path / "train.yaml", "--train_dir", train_dir, "--model", "LogisticModel")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "--model: checkpoint has 'MoeModel', this run asks for 'LogisticModel'" in refused.stderr


def test_frame_level_model_trains_evaluates_and_predicts(tmp_path):
    written = write_synthetic(str(tmp_path / "data"), kind="frame", num_classes=NUM_CLASSES, train_videos=48,
                              validate_videos=16, test_videos=16, shards=2, feature_sizes=(16, 8),
                              min_frames=5, max_frames=20)
    pattern = str(tmp_path / "data" / "frame" / "{}-*.tfrecord")
    train_dir = str(tmp_path / "run")
    summary = train(train_config(
        train_data_pattern=pattern.format("train"), train_dir=train_dir, model="DbofModel", frame_features=True,
        feature_names="rgb,audio", feature_sizes="16,8", num_classes=NUM_CLASSES, batch_size=16, num_epochs=2,
        num_readers=0, iterations=4, dbof_cluster_size=32, dbof_hidden_size=16, metrics_every_steps=2))
    assert summary["global_step"] == 6
    metrics = next(evaluate_run(dict(eval_data_pattern=pattern.format("validate"),
                                     train_dir=train_dir, run_once=True, num_readers=0)))
    assert metrics["global_step"] == 6 and metrics["num_videos"] == 16
    result = run_predict(predict_config(input_data_pattern=pattern.format("test"), train_dir=train_dir,
                                       output_file=str(tmp_path / "p.csv"), num_readers=0))
    assert result["videos"] == 16
    assert len(written["test"]) == 2

"""The 2019 segment task end to end on tiny synthetic segment shards: a video-level frame model fine-tuned on rated
segments (`yt8m train --segment_labels --init_from`), `yt8m eval --segment_labels` JSON and files, --best_metric
segment_map, the task's config checks, every frame model on 5-frame segments, and the tuning objective."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from workflow_fixtures import as_flags, train_config
from yt8m.cli import main
from yt8m.config import ConfigError, config_from_dict
from yt8m.data.making.synthetic import write_synthetic
from yt8m.data.reading.dataset import YT8MDataset
from yt8m.data.reading.spec import FeatureSpec
from yt8m.io.checkpoints import list_exports, read_export_metrics
from yt8m.models.config import build_model
from yt8m.tasks.segment import SEGMENT_METRICS, SegmentTask
from yt8m.tasks.video import features_task
from yt8m.training import TrainConfig, train
from yt8m.training.checks import train_config_problems
from yt8m.tuning.space import load_tune_spec

NUM_CLASSES = 12
FEATURE_SIZES = (16, 8)


@pytest.fixture(scope="module")
def segment_data(tmp_path_factory) -> dict:
    """Segment-rated frame-level shards: train 160, validate 60 videos of 20-40 frames, 2 shards each."""
    root = tmp_path_factory.mktemp("segment_data")
    write_synthetic(str(root), kind="segment", num_classes=NUM_CLASSES, train_videos=160, validate_videos=60,
                    test_videos=0, shards=2, feature_sizes=FEATURE_SIZES, min_frames=20, max_frames=40, seed=5)
    return {split: str(root / "segment" / f"{split}-*.tfrecord") for split in ("train", "validate")}


def frame_values(data: dict, train_dir: Path, **overrides) -> dict:
    """A fast FrameLevelLogisticModel run on the frame-level shards (video labels unless overridden)."""
    return {"train_data_pattern": data["train"], "train_dir": str(train_dir), "model": "FrameLevelLogisticModel",
            "frame_features": True, "feature_names": "rgb,audio", "feature_sizes": ",".join(map(str, FEATURE_SIZES)),
            "num_classes": NUM_CLASSES, "batch_size": 32, "num_epochs": 2, "num_readers": 0,
            "base_learning_rate": 0.05, "log_every_steps": 100, "metrics_every_steps": 5, "seed": 1, **overrides}


@pytest.fixture(scope="module")
def video_run(segment_data, tmp_path_factory) -> Path:
    """The frame model trained on video labels: what the segment runs start from."""
    train_dir = tmp_path_factory.mktemp("video_run") / "run"
    train(train_config(**frame_values(segment_data, train_dir)))
    return train_dir


def run_train(values: dict) -> subprocess.CompletedProcess:
    """`yt8m train` in a process of its own: training commands change process-wide settings (denormals flushed)
    that would reach the tests run after it."""
    return subprocess.run([sys.executable, "-m", "yt8m", "train", *as_flags(values)], capture_output=True,
                          text=True, timeout=300)


def eval_json(capsys, data: dict, train_dir: Path, *extra: str) -> dict:
    assert main(["eval", "--eval_data_pattern", data["validate"], "--train_dir", str(train_dir), "--run_once",
                 "--num_readers", "0", *extra]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_fine_tuning_on_segments_through_the_cli_raises_the_segment_map(segment_data, video_run, tmp_path,
                                                                        capsys):
    before = eval_json(capsys, segment_data, video_run, "--segment_labels")
    assert list(before) == ["global_step", *SEGMENT_METRICS]

    trained = run_train(frame_values(segment_data, tmp_path / "segments", segment_labels=True,
                                     init_from=str(video_run), num_epochs=4))
    assert trained.returncode == 0, trained.stderr[-2000:]
    summary = json.loads(trained.stdout.strip().splitlines()[-1])
    after = eval_json(capsys, segment_data, tmp_path / "segments")  # --segment_labels comes from the train dir
    assert list(after) == ["global_step", *SEGMENT_METRICS] and after["global_step"] == summary["global_step"]
    with open(tmp_path / "segments" / "eval" / f"metrics-{after['global_step']:08d}.json") as fh:
        assert json.load(fh) == after
    # Every rated start of the validation shards, each pair counted once.
    assert after["num_segments"] == before["num_segments"] == count_segments(segment_data["validate"])
    assert after["num_rated_pairs"] == before["num_rated_pairs"] > after["num_segments"] > 0
    assert summary["examples"] == 4 * count_segments(segment_data["train"])  # the examples are segments
    assert after["segment_map"] > before["segment_map"] + 0.02
    assert after["loss"] < before["loss"]


def count_segments(pattern: str) -> int:
    spec = FeatureSpec(["rgb", "audio"], list(FEATURE_SIZES), True, num_classes=NUM_CLASSES, segment_labels=True)
    return sum(len(batch.video_ids) for batch in YT8MDataset(pattern, spec, 64))


def test_best_metric_segment_map_picks_the_best_export(segment_data, video_run, tmp_path):
    config = train_config(**frame_values(segment_data, tmp_path, segment_labels=True, init_from=str(video_run),
                                        eval_data_pattern=segment_data["validate"], best_metric="segment_map",
                                        export_model_steps=3, keep_checkpoints=20))
    summary = train(config)
    evaluated = {}
    for path in glob.glob(str(tmp_path / "eval" / "metrics-*.json")):
        with open(path) as fh:
            result = json.load(fh)
        assert list(result) == ["global_step", *SEGMENT_METRICS]
        evaluated[result["global_step"]] = result["segment_map"]
    assert summary["best_metric"] == "segment_map" and summary["evaluations"] == len(evaluated) > 2
    assert summary["best_value"] == max(evaluated.values())
    assert summary["best_step"] == min(step for step, value in evaluated.items() if value == summary["best_value"])
    [(best_step, folder)] = list_exports(str(tmp_path), "best")
    assert best_step == summary["best_step"] and read_export_metrics(folder)["segment_map"] == summary["best_value"]


@pytest.mark.parametrize("values,message", [
    ({"segment_labels": True, "best_metric": "map"}, "--best_metric map is not a segment metric: use one of "
                                                     "segment_map, gap, loss"),
    ({"best_metric": "segment_map"}, "--best_metric segment_map is not a video-level (no --segment_labels) metric"),
    ({"segment_labels": True, "label_loss": "SoftmaxLoss"}, "--label_loss SoftmaxLoss cannot weight the rated "
                                                            "classes of --segment_labels: use a loss that takes "
                                                            "label_weights (CrossEntropyLoss, HingeLoss, FocalLoss)"),
    ({"segment_labels": True, "metrics": ["micro_f1"]}, "--metrics 'micro_f1' is not a metric"),
    ({"segment_labels": True, "frame_features": False, "model": "LogisticModel"},
     "--segment_labels reads the segments of frame-level data: set --frame_features"),
])
def test_what_the_task_cannot_do_is_a_config_error(segment_data, tmp_path, values, message):
    with pytest.raises(ConfigError) as error:
        config_from_dict(TrainConfig, frame_values(segment_data, tmp_path, **values), checks=train_config_problems)
    assert any(problem.startswith(message) for problem in error.value.problems), error.value.problems


def test_a_metric_the_task_lacks_is_a_one_line_cli_error(segment_data, tmp_path):
    failed = run_train(frame_values(segment_data, tmp_path, segment_labels=True, best_metric="hit_at_one"))
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines()[-1] == (
        "yt8m train: error: invalid config (flags): --best_metric hit_at_one is not a segment metric: use one of "
        "segment_map, gap, loss")
    assert not os.path.exists(tmp_path / "config.yaml")


@pytest.mark.parametrize("model,hparams", [
    ("FrameLevelLogisticModel", {}),
    ("DbofModel", {"iterations": 30, "dbof_cluster_size": 32, "dbof_hidden_size": 16}),
    ("DbofModel", {"iterations": 8, "dbof_cluster_size": 32, "dbof_hidden_size": 16, "sample_random_frames": False}),
    ("LstmModel", {"lstm_cells": 16, "lstm_layers": 2}),
])
def test_every_frame_model_trains_and_evaluates_on_five_frame_segments(segment_data, tmp_path, model, hparams):
    config = train_config(**frame_values(segment_data, tmp_path, segment_labels=True, model=model, **hparams))
    batch = next(iter(YT8MDataset(segment_data["train"], config.features, 16)))
    assert batch.features.shape == (16, 5, sum(FEATURE_SIZES))
    torch.manual_seed(0)
    network = build_model(config.model, config.features)
    task = features_task(config.features, config.loss.name)
    assert isinstance(task, SegmentTask)
    loss = task.loss(network(batch.features, batch.num_frames), batch)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in network.parameters()
                                        if p.grad is not None)
    network.eval()
    with torch.no_grad():
        first = network(batch.features, batch.num_frames)["predictions"]
        assert first.shape == (16, NUM_CLASSES)
        assert torch.equal(first, network(batch.features, batch.num_frames)["predictions"])


def tune_file(path: Path, data: dict, metric: str, **train_values) -> str:
    train_section = {key: value for key, value in frame_values(data, path.parent / "unused", **train_values).items()
                     if key != "train_dir"}
    document = {"train": {**train_section, "eval_data_pattern": data["validate"]},
                "search": {"base_learning_rate": {"type": "float", "low": 1e-3, "high": 0.3, "log": True}},
                "objective": {"metric": metric},
                "tune": {"study_dir": str(path.parent / "study")}}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def test_the_tuning_objective_must_be_a_metric_of_the_trials_task(segment_data, tmp_path):
    spec = load_tune_spec(tune_file(tmp_path / "segments.yaml", segment_data, "segment_map", segment_labels=True))
    assert (spec.metric, spec.direction) == ("segment_map", "maximize")
    with pytest.raises(ValueError, match=r"objective.metric 'segment_map' is not a video-level metric \(use one of: "
                                         r"gap, map, map_all_classes, hit_at_one, perr, loss\)"):
        load_tune_spec(tune_file(tmp_path / "videos.yaml", segment_data, "segment_map"))
    with pytest.raises(ValueError, match=r"objective.metric 'map' is not a segment \(train: segment_labels\) metric"):
        load_tune_spec(tune_file(tmp_path / "map.yaml", segment_data, "map", segment_labels=True))
    # A task on the main data reads its segment ratings under segment_labels, as training resolves it.
    rated = load_tune_spec(tune_file(tmp_path / "task.yaml", segment_data, "rated/segment_map", segment_labels=True,
                                     tasks=[{"name": "rated"}]))
    assert (rated.metric, rated.direction) == ("rated/segment_map", "maximize")
    with pytest.raises(ValueError, match=r"objective.metric 'rated/map' is not a segment \(task rated reads segment "
                                         r"ratings\) metric"):
        load_tune_spec(tune_file(tmp_path / "task_map.yaml", segment_data, "rated/map", segment_labels=True,
                                 tasks=[{"name": "rated"}]))

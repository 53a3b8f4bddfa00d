"""`yt8m eval`: the JSON line and metrics files of a checkpoint, flag agreement, errors, and watch mode."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import yt8m.eval.metrics as metrics_module
from workflow_fixtures import tiny_data, tiny_train_config, train_config, trained_copy, trained_dir  # noqa: F401  (fixtures)
from yt8m.commands.eval import main
from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset
from yt8m.eval.evaluate import evaluate_model, evaluate_run
from yt8m.io.checkpoints import final_checkpoint
from yt8m.models.checkpoints import build_model_from_checkpoint
from yt8m.tasks.video import VIDEO_METRICS, features_task
from yt8m.training import train


def eval_flags(data: dict, train_dir, *extra: str) -> list[str]:
    return ["--eval_data_pattern", data["validate_pattern"], "--train_dir", str(train_dir), "--num_readers", "0",
            *extra]


def test_run_once_prints_json_and_writes_metrics(tiny_data, trained_copy, capsys):
    assert main(eval_flags(tiny_data, trained_copy, "--run_once")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert list(result) == ["global_step", *VIDEO_METRICS]
    assert result["global_step"] == 12 and result["num_videos"] == 64
    with open(trained_copy / "eval" / "metrics-00000012.json") as fh:
        assert json.load(fh) == result
    assert any(name.startswith("events.out.tfevents.") for name in os.listdir(trained_copy / "eval"))


def test_metrics_are_those_of_the_checkpoint(tiny_data, trained_copy):
    result = next(evaluate_run(dict(eval_data_pattern=tiny_data["validate_pattern"],
                                                  train_dir=str(trained_copy), run_once=True, batch_size=16)))
    trained = build_model_from_checkpoint(final_checkpoint(str(trained_copy)))
    model = trained.network.train()
    dataset = YT8MDataset(tiny_data["validate_pattern"], trained.features, 64)
    expected = evaluate_model(model, dataset, features_task(trained.features, "CrossEntropyLoss"))
    assert model.training  # evaluate_model gives the model back in the mode it found it
    for name in VIDEO_METRICS:
        assert result[name] == pytest.approx(expected[name], rel=1e-5), name
    assert result["gap"] > 0.3  # the tiny run learned something


def test_flags_must_agree_with_the_train_dir(tiny_data, trained_copy, capsys):
    with pytest.raises(ValueError) as error:
        main(eval_flags(tiny_data, trained_copy, "--run_once", "--model", "LogisticModel",
                        "--feature_sizes", "16,9", "--frame_features"))
    message = str(error.value)
    assert "--model: given 'LogisticModel'" in message and "has 'MoeModel'" in message
    assert "--feature_sizes: given '16,9'" in message and "--frame_features: given True" in message
    assert main(eval_flags(tiny_data, trained_copy, "--run_once", "--model", "MoeModel",
                           "--feature_sizes", "16, 8")) == 0
    assert json.loads(capsys.readouterr().out)["global_step"] == 12


def test_missing_train_dir_or_checkpoint_names_the_dir(tiny_data, trained_copy, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'nowhere'} is not a yt8m train dir"):
        main(eval_flags(tiny_data, tmp_path / "nowhere", "--run_once"))
    for name in os.listdir(trained_copy / "checkpoints"):
        os.remove(trained_copy / "checkpoints" / name)
    with pytest.raises(FileNotFoundError, match=f"no checkpoint in {trained_copy}"):
        main(eval_flags(tiny_data, trained_copy, "--run_once"))


class Stop(RuntimeError):
    pass


def run_stopped_at_step_4(data: dict, train_dir) -> dict:
    """A run stopped after its checkpoint of step 4 (as if killed), and a watching eval's config for it."""
    def stop_at_step_4(event):
        if event.kind == "checkpoint" and event.step == 4:
            raise Stop

    with pytest.raises(Stop):
        train(tiny_train_config(data, train_dir), hooks=[stop_at_step_4])
    return dict(eval_data_pattern=data["validate_pattern"], train_dir=str(train_dir), num_readers=0,
                      poll_interval_secs=0.05)


def test_watch_mode_evaluates_new_checkpoints_until_the_final_one(tiny_data, tmp_path):
    watcher = run_stopped_at_step_4(tiny_data, tmp_path)
    steps: queue.Queue = queue.Queue()
    thread = threading.Thread(target=lambda: [steps.put(r["global_step"]) for r in evaluate_run(watcher)],
                              daemon=True)
    thread.start()
    assert steps.get(timeout=60) == 4
    train(tiny_train_config(tiny_data, tmp_path))  # resumes: checkpoints at 8 and 12, the final one
    thread.join(timeout=60)
    assert not thread.is_alive(), "the watcher did not exit after the final checkpoint"
    seen = [4, *steps.queue]
    assert seen == sorted(set(seen)) and seen[-1] == 12
    assert sorted(os.listdir(tmp_path / "eval"))[-1] == "metrics-00000012.json"


def test_an_unreadable_newest_checkpoint_is_passed_over_with_a_warning(tiny_data, trained_copy, capsys, caplog):
    newest = trained_copy / "checkpoints" / "ckpt-00000012.pt"
    newest.write_bytes(b"")  # a power loss before the data reached the disk
    assert main(eval_flags(tiny_data, trained_copy, "--run_once")) == 0
    assert json.loads(capsys.readouterr().out)["global_step"] == 8
    assert f"passing over an unreadable checkpoint: {newest}" in caplog.text


def test_watching_a_stopped_run_says_what_it_waits_for(tiny_data, tmp_path, caplog):
    results = evaluate_run(run_stopped_at_step_4(tiny_data, tmp_path))
    with caplog.at_level("INFO", logger="yt8m.eval"):
        assert next(results)["global_step"] == 4
        thread = threading.Thread(target=lambda: next(results, None), daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while "no trainer runs there now" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "waiting until one resumes it" in caplog.text and "checkpoints/final" in caplog.text


def run_eval_cli(pattern: str, train_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yt8m", "eval", "--eval_data_pattern", pattern, "--train_dir",
                           str(train_dir), "--run_once", "--num_readers", "0"], capture_output=True, text=True,
                          timeout=300)


def test_eval_on_shards_without_labels_or_videos_is_an_error_through_the_cli(tiny_data, trained_copy, tmp_path):
    result = run_eval_cli(tiny_data["test_pattern"], trained_copy)  # test shards carry no labels
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"yt8m eval: error: no labels in {tiny_data['test_pattern']}: evaluation needs labelled shards "
        "(test shards have none; `yt8m predict` takes them)")
    assert result.stdout == ""
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    result = run_eval_cli(str(empty), trained_copy)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"yt8m eval: error: no videos in {empty}: nothing to evaluate"
    assert not os.path.exists(trained_copy / "eval" / "metrics-00000012.json")


def model_and_data(tiny_data, trained_dir):
    trained = build_model_from_checkpoint(final_checkpoint(str(trained_dir)))
    dataset = YT8MDataset(tiny_data["validate_pattern"], trained.features, 8)
    return trained.network, dataset, features_task(trained.features, "CrossEntropyLoss")


def test_a_spilled_pool_gives_the_same_metrics(tiny_data, trained_dir, monkeypatch, tmp_path):
    model, dataset, task = model_and_data(tiny_data, trained_dir)
    in_memory = evaluate_model(model, dataset, task)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(metrics_module, "POOL_BUDGET", 50)  # a run every few batches
    assert evaluate_model(model, dataset, task) == in_memory
    assert os.listdir(tmp_path) == []


def test_a_failed_evaluation_removes_its_spilled_runs_and_restores_the_mode(tiny_data, trained_dir, monkeypatch,
                                                                          tmp_path):
    model, dataset, task = model_and_data(tiny_data, trained_dir)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(metrics_module, "POOL_BUDGET", 50)
    forward, calls = model.forward, []

    def fail_on_the_fifth_batch(*args):
        calls.append(os.listdir(tmp_path))
        if len(calls) == 5:
            raise RuntimeError("out of memory")
        return forward(*args)

    monkeypatch.setattr(model, "forward", fail_on_the_fifth_batch)
    model.train()
    with pytest.raises(RuntimeError, match="out of memory"):
        evaluate_model(model, dataset, task)
    assert calls[-1] != []  # runs had been written
    assert os.listdir(tmp_path) == []
    assert model.training

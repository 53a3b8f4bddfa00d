"""`yt8m train` as a user meets its failures: a failed start leaves the train dir as it was, a diverging run stops
with its last good checkpoint, and a run with nothing to train on is an error, never a success at step 0."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from workflow_fixtures import (  # noqa: F401
    NUM_CLASSES,
    as_flags,
    one_task,
    tiny_data,
    tiny_train_config,
    train_config,
    trained_copy,
    trained_dir,
)
from yt8m.config import config_values
from yt8m.data.format.encode import encode_video_example
from yt8m.data.format.tfrecord import TFRecordWriter
from yt8m.data.reading.batch import Batch
from yt8m.io.checkpoints import final_checkpoint, list_checkpoints, load_checkpoint
from yt8m.models import create_model
from yt8m.tasks.losses import create_loss
from yt8m.training import NonFiniteLossError, TrainConfig, fit, train
from yt8m.training.optim import build_optimizer


def train_flags(data: dict, train_dir: Path, **overrides) -> list[str]:
    values = config_values(tiny_train_config(data, train_dir, **overrides))
    defaults = config_values(TrainConfig())
    return as_flags({name: value for name, value in values.items()
                     if name not in defaults or value != defaults[name] or name in overrides})


def yt8m_train(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yt8m", "train", *flags], capture_output=True, text=True,
                          timeout=300)


def snapshot(train_dir: Path) -> dict[str, bytes]:
    return {str(path.relative_to(train_dir)): path.read_bytes() for path in sorted(train_dir.rglob("*"))
            if path.is_file()}


@pytest.mark.parametrize("flags, expected", [
    (["--optimizer", "FooOpt"], "--optimizer 'FooOpt' is not a torch.optim class"),
    (["--start_new_model", "--optimizer", "FooOpt"], "--optimizer 'FooOpt' is not a torch.optim class"),
    (["--start_new_model", "--base_learning_rate", "nan"], "--base_learning_rate must be a finite number"),
    (["--start_new_model", "--feature_sizes", "16,9"], "feature 'mean_audio': expected float_list of 9 values"),
    (["--start_new_model", "--model", "DbofModel"], "is a frame-level model but --frame_features is False"),
    (["--moe_num_mixtures", "3"], "was trained with other hyper-parameters (--moe_num_mixtures: checkpoint has 2, "
                                  "this run asks for 3)"),
    (["--label_smoothing", "0.1"], "(--label_smoothing: checkpoint has 0.0, this run asks for 0.1)"),
    (["--model", "LogisticModel"], "was trained with different model settings (--model: checkpoint has 'MoeModel'"),
])
def test_a_failed_start_leaves_a_finished_run_as_it_was(tiny_data, trained_copy, flags, expected):
    before = snapshot(trained_copy)
    result = yt8m_train(*train_flags(tiny_data, trained_copy), *flags)
    assert result.returncode == 1
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("yt8m train: error: ")  # one line says it all
    assert expected in result.stderr.strip().splitlines()[-1]
    assert snapshot(trained_copy) == before
    assert final_checkpoint(str(trained_copy)) is not None


def test_a_nan_loss_stops_training_before_the_update_and_the_next_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = create_model("LogisticModel", 4, 3)
    batches = [Batch(video_ids=[f"v{step}-{i}" for i in range(8)], features=torch.randn(8, 4),
                     labels=torch.rand(8, 3) > 0.5) for step in range(4)]
    batches[2].features[5, 1] = float("nan")
    config = train_config(train_data_pattern="unused", train_dir=str(tmp_path), model="LogisticModel",
                         feature_sizes="4", num_classes=3, export_model_steps=1, num_epochs=1)
    with pytest.raises(NonFiniteLossError, match=r"step 3: the training loss is nan .* videos v2-0, v2-1, v2-2"):
        fit(model, build_optimizer(config.optimizer, model.parameters()),
            one_task(config, create_loss("CrossEntropyLoss")), lambda epoch: batches, config)
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [1, 2]
    assert all(bool(parameter.isfinite().all()) for parameter in model.parameters())


def test_a_diverging_run_stops_before_its_update_and_keeps_the_last_good_checkpoint(tiny_data, tmp_path):
    train_dir = tmp_path / "run"
    # Plain SGD at a huge rate with no clipping: the first update throws the weights far off, the next loss is inf.
    result = yt8m_train(*train_flags(tiny_data, train_dir, optimizer="SGD", base_learning_rate=1e30,
                                     clip_gradient_norm=0, export_model_steps=1))
    assert result.returncode == 1, result.stderr
    assert "weights hold NaN or infinite values" in result.stderr and "Traceback" not in result.stderr
    steps = [step for step, _ in list_checkpoints(str(train_dir))]
    assert steps and final_checkpoint(str(train_dir)) is None
    last = load_checkpoint(list_checkpoints(str(train_dir))[-1][1])
    assert f"ckpt-{steps[-1]:08d}.pt" in result.stderr
    assert all(bool(tensor.isfinite().all()) for tensor in last.model.values())


def test_training_on_an_empty_file_is_an_error(tiny_data, tmp_path):
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    result = yt8m_train(*train_flags(tiny_data, tmp_path / "run", train_data_pattern=str(empty)))
    assert result.returncode == 1
    assert "has no training examples" in result.stderr and "nothing was trained" in result.stderr
    assert list_checkpoints(str(tmp_path / "run")) == []


def test_a_second_trainer_on_a_train_dir_fails_at_once_naming_the_first(tiny_data, tmp_path):
    from yt8m.io.lock import train_dir_holder

    train_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "yt8m", "train",
                              *train_flags(tiny_data, train_dir, num_epochs=10000)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while train_dir_holder(str(train_dir)) is None:
            assert first.poll() is None and time.monotonic() < deadline, "the first trainer did not start"
            time.sleep(0.1)
        second = yt8m_train(*train_flags(tiny_data, train_dir))
        assert second.returncode == 1
        assert f"is in use by another `yt8m train` (host {socket.gethostname()}, pid {first.pid}, since " in \
            second.stderr
    finally:
        first.kill()
        first.wait()
    assert train_dir_holder(str(train_dir)) is None  # the OS released the killed trainer's lock


def test_a_truncated_newest_checkpoint_is_passed_over_with_a_warning(tiny_data, trained_copy):
    newest = list_checkpoints(str(trained_copy))[-1][1]
    Path(newest).write_bytes(Path(newest).read_bytes()[:1000])  # a power loss in the middle of the write
    resumed = yt8m_train(*train_flags(tiny_data, trained_copy, num_epochs=4))
    assert resumed.returncode == 0, resumed.stderr
    assert "passing over an unreadable checkpoint" in resumed.stderr and newest in resumed.stderr
    assert "resuming from" in resumed.stderr and "ckpt-00000008.pt" in resumed.stderr
    assert json.loads(resumed.stdout)["global_step"] == 16


def write_shard(path: Path, first: int, count: int, nan_at: int | None = None) -> None:
    from yt8m.data.format.encode import encode_video_example
    from yt8m.data.format.tfrecord import TFRecordWriter

    rng = np.random.default_rng(first)
    with TFRecordWriter(str(path)) as writer:
        for index in range(first, first + count):
            rgb = rng.normal(size=16).astype(np.float32)
            if index == nan_at:
                rgb[3] = np.nan
            writer.write(encode_video_example(f"v{index}", [index % NUM_CLASSES],
                                              {"mean_rgb": rgb, "mean_audio": rng.normal(size=8)}))


def test_skip_corrupt_runs_report_what_they_skipped(tiny_data, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "a.tfrecord", 0, 40, nan_at=7)
    write_shard(data / "b.tfrecord", 40, 40)
    whole = (data / "b.tfrecord").read_bytes()
    (data / "b.tfrecord").write_bytes(whole[:len(whole) // 2 + 5])  # 20 whole records, then a cut one
    flags = train_flags(tiny_data, tmp_path / "run", train_data_pattern=f"{data}/*.tfrecord", num_epochs=1,
                        batch_size=8)
    failed = yt8m_train(*flags)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "expected finite values, found nan at index 3" in failed.stderr or "truncated record" in failed.stderr
    trained = yt8m_train(*flags, "--skip_corrupt")
    assert trained.returncode == 0, trained.stderr
    summary = json.loads(trained.stdout)
    assert (summary["skipped_files"], summary["skipped_records"], summary["examples"]) == (1, 1, 59)
    evaluated = subprocess.run([sys.executable, "-m", "yt8m", "eval", "--train_dir", tmp_path / "run", "--run_once",
                                "--eval_data_pattern", f"{data}/*.tfrecord", "--skip_corrupt"],
                               capture_output=True, text=True)
    assert evaluated.returncode == 0, evaluated.stderr
    result = json.loads(evaluated.stdout)
    assert (result["skipped_files"], result["skipped_records"]) == (1, 1)
    assert result["num_videos"] == 59


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_train_dir(tiny_data, tmp_path):
    """A label beyond --num_classes in a later record fails the run mid-epoch: the train dir it made goes."""
    shard = tmp_path / "data" / "train-00000-of-00001.tfrecord"
    shard.parent.mkdir()
    with TFRecordWriter(str(shard)) as writer:
        for index in range(40):
            label = 50 if index == 30 else index % NUM_CLASSES
            writer.write(encode_video_example(f"v{index}", [label], {"mean_rgb": np.ones(16, np.float32),
                                                                      "mean_audio": np.ones(8, np.float32)}))
    result = yt8m_train(*train_flags(tiny_data, tmp_path / "run", train_data_pattern=str(shard), batch_size=8,
                                     export_model_steps=100))
    assert result.returncode == 1 and "label" in result.stderr.splitlines()[-1]
    assert not (tmp_path / "run").exists()


def test_training_warns_when_it_writes_to_the_starter_kits_default_train_dir(caplog):
    config = train_config(train_data_pattern="no-such-*.tfrecord")
    with caplog.at_level(logging.WARNING, logger="yt8m.train"), pytest.raises(ValueError):
        train(config)
    assert "the starter kit's default" in caplog.text and "/tmp/yt8m_model" in caplog.text

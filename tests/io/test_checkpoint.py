"""Checkpoint files: atomic and durable writes, a full disk, pruning, the final marker, safe loading with a
fall back to the newest intact checkpoint, RNG round trips; and the runs written before configs had sections, which
still evaluate, predict and resume as they did."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from faults import file_size_limit, files_under, fill_disk_after
from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, tiny_data, train_config  # noqa: F401  (fixtures)
from yt8m.config import config_from_dict, config_values, differing
from yt8m.data.making.synthetic import write_synthetic
from yt8m.io.checkpoints import (
    Checkpoint,
    checkpoint_path,
    clear_final_marker,
    final_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
)
from yt8m.io.files import WriteError
from yt8m.training import TrainConfig
from yt8m.training.randomness import capture_rng_state, restore_rng_state

OLD_RUNS = Path(__file__).resolve().parent / "runs_before_sections"


def payload(value: float) -> Checkpoint:
    return Checkpoint(model={"w": torch.full((2,), value)}, progress={"step": int(value)})


def test_keeps_the_newest_and_marks_the_final(tmp_path):
    train_dir = str(tmp_path)
    for step in (10, 20, 30):
        save_checkpoint(train_dir, payload(step), keep=2)
    assert [step for step, _ in list_checkpoints(train_dir)] == [20, 30]
    assert latest_checkpoint(train_dir).endswith("ckpt-00000030.pt")
    assert final_checkpoint(train_dir) is None
    path = save_checkpoint(train_dir, payload(40), keep=2, final=True)
    assert final_checkpoint(train_dir) == path
    clear_final_marker(train_dir)
    assert final_checkpoint(train_dir) is None


def test_loads_with_weights_only(tmp_path):
    checkpoint = payload(3)
    checkpoint.rng = capture_rng_state()
    path = save_checkpoint(str(tmp_path), checkpoint, keep=1)
    assert torch.equal(torch.load(path, weights_only=True)["model"]["w"], torch.full((2,), 3.0))
    assert load_checkpoint(path).step == 3


def test_no_checkpoint_is_none_and_foreign_files_are_refused(tmp_path):
    assert latest_checkpoint(str(tmp_path)) is None
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(1)}, foreign)
    with pytest.raises(ValueError, match="not a yt8m checkpoint"):
        load_checkpoint(str(foreign))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="garbage.pt"):
        load_checkpoint(str(garbage))
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load_checkpoint(str(tmp_path / "missing.pt"))
    incomplete = tmp_path / "incomplete.pt"
    torch.save({"format": "yt8m-checkpoint-1", "model": {}}, incomplete)
    with pytest.raises(ValueError, match="incomplete.pt: not a complete yt8m checkpoint .it has no progress."):
        load_checkpoint(str(incomplete))


def test_rng_state_round_trips_through_a_checkpoint(tmp_path):
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    path = save_checkpoint(str(tmp_path), Checkpoint(model={}, progress={"step": 1}, rng=capture_rng_state()), keep=1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(2), random.seed(2), np.random.seed(2)
    restore_rng_state(load_checkpoint(path).rng)
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1]
    assert np.random.rand() == expected[2]


def test_differing_settings_compare_feature_lists_not_spelling():
    names = ["feature_names", "feature_sizes", "model"]
    old = config_values(train_config(feature_names="mean_rgb,mean_audio", feature_sizes="1024,128"))
    same = config_values(train_config(feature_names="mean_rgb, mean_audio", feature_sizes="1024, 128"))
    assert differing(old, same, names) == []
    other = config_values(train_config(feature_names="mean_rgb", feature_sizes="1024", model="MoeModel"))
    assert [name for name, _, _ in differing(old, other, names)] == names


def test_configs_stored_before_the_typed_feature_lists_still_load():
    """Checkpoints and config.yaml files of earlier versions hold the comma strings, and no newer field."""
    stored = {name: value for name, value in config_values(train_config(train_data_pattern="x")).items()
              if name != "checkpoint_every_epoch"}
    stored.update(feature_names="mean_rgb,mean_audio", feature_sizes="1024,128", num_readers=8, keep_checkpoints=0)
    config = config_from_dict(TrainConfig, stored, "ckpt-00000001.pt (config)", check_values=False)
    assert (config.features.feature_names, config.features.feature_sizes) == (["mean_rgb", "mean_audio"], [1024, 128])
    assert config.data.num_readers == "8" and config.checkpoints.checkpoint_every_epoch is False


@pytest.fixture(scope="module")
def old_runs_data(tmp_path_factory) -> Path:
    """The shards the runs of before the sections were trained on (their README's `yt8m synth` command)."""
    root = tmp_path_factory.mktemp("old_runs_data")
    for kind in ("video", "frame"):
        write_synthetic(str(root), kind=kind, num_classes=10, train_videos=200, validate_videos=60, test_videos=20,
                        shards=2, feature_sizes=(16, 8), min_frames=3, max_frames=8, seed=3)
    return root


def assert_equal_but_for_rounding(actual: dict, expected: dict) -> None:
    """The same keys and values, floats to 1e-6 relative: the old runs were written on another CPU (an AMD EPYC), and
    another CPU's float kernels (MKL's, an Intel Xeon's) round some sums differently in the 7th digit."""
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert actual[key] == (pytest.approx(value, rel=1e-6) if isinstance(value, float) else value), key


def yt8m(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yt8m", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("run, kind", [("video_moe_ema", "video"), ("frame_dbof", "frame")])
def test_a_run_written_before_the_sections_evaluates_as_it_did(run, kind, old_runs_data, tmp_path):
    shutil.copytree(OLD_RUNS / run, tmp_path / run)
    result = yt8m("eval", "--train_dir", tmp_path / run, "--eval_data_pattern", old_runs_data / kind / "validate-*",
                  "--run_once")
    assert result.returncode == 0, result.stderr
    expected = json.loads((OLD_RUNS / "expected.json").read_text())[run]
    assert_equal_but_for_rounding(json.loads(result.stdout), expected)


def test_a_multitask_run_written_before_the_sections_predicts_as_it_did(old_runs_data, tmp_path):
    shutil.copytree(OLD_RUNS / "multitask", tmp_path / "multitask")
    output = tmp_path / "vertical.csv"
    result = yt8m("predict", "--train_dir", tmp_path / "multitask", "--input_data_pattern",
                  old_runs_data / "video" / "validate-*", "--output_file", output, "--task", "vertical")
    assert result.returncode == 0, result.stderr
    assert output.read_text() == (OLD_RUNS / "multitask_vertical_predictions.csv").read_text()


@pytest.mark.integration
def test_a_checkpoint_written_before_the_sections_resumes_exactly(old_runs_data, tmp_path):
    """The old run stopped at step 10; resumed to 14, it ends where a new run of 14 steps from scratch ends."""
    shutil.copytree(OLD_RUNS / "video_moe_ema", tmp_path / "old")
    flags = ["--train_data_pattern", old_runs_data / "video" / "train-*", "--eval_data_pattern",
             old_runs_data / "video" / "validate-*", "--feature_names", "mean_rgb,mean_audio", "--feature_sizes",
             "16,8", "--num_classes", "10", "--model", "MoeModel", "--moe_num_mixtures", "3", "--ema_decay", "0.9",
             "--batch_size", "32", "--export_model_steps", "4", "--max_steps", "14", "--num_epochs", "5",
             "--lr_halving_patience", "1", "--base_learning_rate", "0.05", "--num_readers", "0"]
    resumed = yt8m("train", "--train_dir", tmp_path / "old", *flags)
    fresh = yt8m("train", "--train_dir", tmp_path / "new", *flags)
    assert resumed.returncode == 0 and fresh.returncode == 0, resumed.stderr + fresh.stderr
    assert "resuming from" in resumed.stderr and "ckpt-00000010.pt" in resumed.stderr
    # Timings differ, and so does the count of evaluations: the old run's last, of its final step 10, is one more.
    skip = ("seconds", "examples_per_sec", "input_wait_fraction", "evaluations")
    # The old run's first 10 steps were computed on another CPU: equal up to its rounding (exact resumption on one
    # machine is test_trainer's).
    assert_equal_but_for_rounding({k: v for k, v in json.loads(resumed.stdout).items() if k not in skip},
                                  {k: v for k, v in json.loads(fresh.stdout).items() if k not in skip})
    torch.testing.assert_close(load_checkpoint(latest_checkpoint(str(tmp_path / "old"))).model["experts.weight"],
                               load_checkpoint(latest_checkpoint(str(tmp_path / "new"))).model["experts.weight"],
                               rtol=1e-5, atol=1e-6)


def steps(train_dir) -> list[int]:
    return [step for step, _ in list_checkpoints(str(train_dir))]


def test_a_checkpoint_is_synced_before_its_rename(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    path = save_checkpoint(str(tmp_path), payload(1), keep=1)
    assert os.path.basename(synced[0]).startswith(".ckpt-00000001.pt.tmp-")
    assert synced[1] == os.path.dirname(path)


def test_another_writers_temporary_file_is_left_alone(tmp_path):
    """Two writers of one step never share a temporary file (the fixed `ckpt-N.pt.tmp` of before)."""
    theirs = tmp_path / "checkpoints" / "ckpt-00000001.pt.tmp"
    theirs.parent.mkdir()
    theirs.write_bytes(b"another writer, mid-write")
    save_checkpoint(str(tmp_path), payload(1), keep=1)
    assert theirs.read_bytes() == b"another writer, mid-write"
    assert load_checkpoint(checkpoint_path(str(tmp_path), 1)).step == 1


@pytest.mark.parametrize("final", [False, True])
def test_a_full_disk_keeps_the_earlier_checkpoint_and_leaves_no_temporary_file(tmp_path, monkeypatch, final):
    save_checkpoint(str(tmp_path), payload(1), keep=1, final=final)
    before = files_under(tmp_path)
    fill_disk_after(monkeypatch, tmp_path, budget=100)
    big = Checkpoint(model={"w": torch.zeros(1 << 20)}, progress={"step": 2})
    with pytest.raises(WriteError, match=r"could not write .*ckpt-00000002\.pt: No space left on device") as caught:
        save_checkpoint(str(tmp_path), big, keep=1, final=final)
    assert caught.value.errno == errno.ENOSPC
    assert files_under(tmp_path) == before
    assert load_checkpoint(checkpoint_path(str(tmp_path), 1)).step == 1
    assert final_checkpoint(str(tmp_path)) == (checkpoint_path(str(tmp_path), 1) if final else None)


def test_pruning_after_a_resume_from_an_older_checkpoint_keeps_the_new_one(tmp_path):
    """A run resumed from step 10 (step 20 unreadable) writes 15: pruning never removes the checkpoint just
    written, and leaves the newer unreadable one alone."""
    for step in (10, 20):
        save_checkpoint(str(tmp_path), payload(step), keep=2)
    open(checkpoint_path(str(tmp_path), 20), "wb").close()
    save_checkpoint(str(tmp_path), payload(15), keep=1)
    assert steps(tmp_path) == [15, 20]
    assert load_latest_checkpoint(str(tmp_path))[1].step == 15


def truncate(path: str, fraction: float) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(int(os.path.getsize(path) * fraction))


def test_load_latest_falls_back_to_the_newest_intact_checkpoint_naming_each_it_passed_over(tmp_path, caplog):
    for step in (10, 20, 30):
        save_checkpoint(str(tmp_path), payload(step), keep=3)
    truncate(checkpoint_path(str(tmp_path), 30), 0.5)  # a power loss mid-write
    truncate(checkpoint_path(str(tmp_path), 20), 0)
    with caplog.at_level(logging.WARNING, logger="yt8m.io.checkpoints"):
        path, loaded = load_latest_checkpoint(str(tmp_path))
    assert path == checkpoint_path(str(tmp_path), 10) and loaded.step == 10
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warned) == 2
    assert "ckpt-00000030.pt" in warned[0] and "ckpt-00000020.pt" in warned[1]


def test_load_latest_is_none_without_checkpoints_and_an_error_when_none_loads(tmp_path):
    assert load_latest_checkpoint(str(tmp_path)) is None
    for step in (10, 20):
        save_checkpoint(str(tmp_path), payload(step), keep=2)
        truncate(checkpoint_path(str(tmp_path), step), 0.3)
    with pytest.raises(ValueError, match=r"no readable checkpoint in .*checkpoints: .*ckpt-00000020\.pt.*; "
                                         r".*ckpt-00000010\.pt"):
        load_latest_checkpoint(str(tmp_path))


def cli_train(data: dict, train_dir, epochs: int, **run):
    sizes = ",".join(map(str, FEATURE_SIZES))
    return subprocess.run([sys.executable, "-m", "yt8m", "train", "--train_data_pattern", data["train_pattern"],
                           "--train_dir", str(train_dir), "--model", "MoeModel", "--feature_names", "mean_rgb,mean_audio",
                           "--feature_sizes", sizes, "--num_classes", str(NUM_CLASSES), "--batch_size", "64",
                           "--num_epochs", str(epochs), "--num_readers", "0"], capture_output=True, text=True, **run)


def test_cli_a_full_disk_while_checkpointing_exits_1_naming_the_checkpoint_and_keeps_the_earlier_one(tiny_data, tmp_path):
    train_dir = tmp_path / "run"
    assert cli_train(tiny_data, train_dir, epochs=1).returncode == 0
    (step, earlier), = list_checkpoints(str(train_dir))
    limit = os.path.getsize(earlier) // 2  # room for the config and the event files, not for a checkpoint
    result = cli_train(tiny_data, train_dir, epochs=2, preexec_fn=file_size_limit(limit),
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == [f"yt8m train: error: could not write {checkpoint_path(str(train_dir), 2 * step)}: File too large"]
    assert list_checkpoints(str(train_dir)) == [(step, earlier)]
    assert load_checkpoint(earlier).step == step
    assert not [name for name in files_under(train_dir) if ".tmp" in name]

"""Fixtures for the train/eval/predict/demo tests: tiny synthetic shards and a trained train dir, once per session.

Test modules import what they use (`from workflow_fixtures import ...`); pytest then treats them as fixtures.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from yt8m.config import config_from_dict
from yt8m.data.making.synthetic import write_synthetic
from yt8m.inference.config import PredictConfig
from yt8m.tasks.taskset import TaskSet, one_task_set
from yt8m.training import TrainConfig, TrainEvent

NUM_CLASSES = 12
FEATURE_SIZES = (16, 8)
VERTICALS = 3


@pytest.fixture(scope="session")
def vocabulary(tmp_path_factory) -> str:
    """A vocabulary CSV whose Vertical1 maps the 12 classes to 3 verticals (v0, v1, v2), rows out of order."""
    path = tmp_path_factory.mktemp("vocabulary") / "vocabulary.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["Index", "Name", "Vertical1"])
        for index in reversed(range(NUM_CLASSES)):
            writer.writerow([index, f"class, {index}", f"v{index % VERTICALS}"])
    return str(path)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> dict:
    """Video-level shards (train 240, validate 64, test 48 videos; 2 shards each) with small features."""
    root = tmp_path_factory.mktemp("tiny_data")
    written = write_synthetic(str(root), kind="video", num_classes=NUM_CLASSES, train_videos=240,
                              validate_videos=64, test_videos=48, shards=2, feature_sizes=FEATURE_SIZES, seed=3)
    folder = root / "video"
    return {**written, **{f"{split}_pattern": str(folder / f"{split}-*.tfrecord")
                          for split in ("train", "validate", "test")}}


def train_config(**values) -> TrainConfig:
    """A TrainConfig of flag values (flat, or nested by section), typed but not checked: `train` checks it."""
    return config_from_dict(TrainConfig, values, source="test", check_values=False)


def one_task(config: TrainConfig, loss_fn) -> TaskSet:
    """The task set of a model and loss of one's own: the config's one task, learning `loss_fn`."""
    return one_task_set(config.main_task(), config.validation.top_n, loss_fn)


def predict_config(**values) -> PredictConfig:
    """A PredictConfig of flag values, checked as `yt8m predict` checks its flags."""
    return config_from_dict(PredictConfig, values, source="test")


def tiny_train_config(data: dict, train_dir: Path, **overrides) -> TrainConfig:
    """A fast, deterministic MoeModel run: 4 steps per epoch, in-process reading."""
    values = dict(train_data_pattern=data["train_pattern"], train_dir=str(train_dir), model="MoeModel",
                  feature_names="mean_rgb,mean_audio", feature_sizes=",".join(map(str, FEATURE_SIZES)),
                  num_classes=NUM_CLASSES, batch_size=64, num_epochs=3, export_model_steps=4, num_readers=0,
                  base_learning_rate=0.05, log_every_steps=4, metrics_every_steps=4, seed=7)
    return train_config(**{**values, **overrides})


def as_flags(values: dict) -> list[str]:
    """`yt8m` flags of flat config values (config_values; None: not given), lists in their comma form."""
    return [part for name, value in values.items() if value is not None
            for part in (f"--{name}", ",".join(map(str, value)) if isinstance(value, list) else str(value))]


@pytest.fixture(scope="session")
def trained_dir(tiny_data, tmp_path_factory) -> Path:
    """A finished run of 12 steps (checkpoints at 4, 8 and the final 12); copy it before changing anything in it."""
    from yt8m.training import train

    train_dir = tmp_path_factory.mktemp("trained") / "run"
    train(tiny_train_config(tiny_data, train_dir))
    return train_dir


@pytest.fixture
def trained_copy(trained_dir, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained_dir, copy)
    return copy


class Crash(RuntimeError):
    """What crash_after_checkpoint raises: a run killed right after a checkpoint was written."""


def crash_after_checkpoint(step: int):
    """A training hook that stops the run with Crash once the checkpoint of `step` is written."""
    def hook(event: TrainEvent):
        if event.kind == "checkpoint" and event.step == step:
            raise Crash(step)
    return hook

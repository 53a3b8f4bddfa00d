"""Fixtures for the `yt8m tune` tests: tiny synthetic shards and a tuning file over them.

Test modules import what they use (`from tune_fixtures import shards, tune_file`); pytest then treats `shards` as a
fixture.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

NUM_CLASSES = 8
FEATURE_SIZES = (16, 8)
SEARCH = {
    "model": {"type": "categorical", "choices": ["LogisticModel", "MoeModel"]},
    "base_learning_rate": {"type": "float", "low": 1e-3, "high": 0.3, "log": True},
    "moe_num_mixtures": {"type": "int", "low": 1, "high": 3, "when": {"model": "MoeModel"}},
}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    from yt8m.data.making.synthetic import write_synthetic

    root = tmp_path_factory.mktemp("synthetic")
    write_synthetic(str(root), kind="video", num_classes=NUM_CLASSES, train_videos=240, validate_videos=120,
                    test_videos=0, shards=2, feature_sizes=FEATURE_SIZES, seed=3)
    return root / "video"


def tune_file(path: Path, shards: Path, search: dict = SEARCH, tune: dict | None = None, **train) -> str:
    document = {
        "train": {"train_data_pattern": str(shards / "train-*.tfrecord"),
                  "eval_data_pattern": str(shards / "validate-*.tfrecord"),
                  "feature_names": "mean_rgb,mean_audio", "feature_sizes": ",".join(map(str, FEATURE_SIZES)),
                  "num_classes": NUM_CLASSES, "batch_size": 30, "num_epochs": 2, "num_readers": 0,
                  "log_every_steps": 100, **train},
        "search": search,
        "objective": {"metric": "gap", "direction": "maximize"},
        "tune": {"study_dir": str(path.parent / "study"), "n_startup_trials": 1, **(tune or {})},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)

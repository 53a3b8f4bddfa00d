"""Checkpoint files: atomic writes, pruning, the final marker, safe loading and RNG round trips."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from yt8m.checkpoint import (
    capture_rng_state,
    clear_final_marker,
    differing_fields,
    final_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from yt8m.config import TrainConfig


def payload(value: float) -> dict:
    return {"model": {"w": torch.full((2,), value)}, "step": int(value)}


def test_keeps_the_newest_and_marks_the_final(tmp_path):
    train_dir = str(tmp_path)
    for step in (10, 20, 30):
        save_checkpoint(train_dir, payload(step), step, keep=2)
    assert [step for step, _ in list_checkpoints(train_dir)] == [20, 30]
    assert latest_checkpoint(train_dir).endswith("ckpt-00000030.pt")
    assert final_checkpoint(train_dir) is None
    path = save_checkpoint(train_dir, payload(40), 40, keep=2, final=True)
    assert final_checkpoint(train_dir) == path
    clear_final_marker(train_dir)
    assert final_checkpoint(train_dir) is None


def test_loads_with_weights_only(tmp_path):
    path = save_checkpoint(str(tmp_path), {**payload(3), "rng": capture_rng_state()}, 3, keep=1)
    assert torch.equal(torch.load(path, weights_only=True)["model"]["w"], torch.full((2,), 3.0))
    assert load_checkpoint(path)["step"] == 3


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


def test_rng_state_round_trips_through_a_checkpoint(tmp_path):
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    path = save_checkpoint(str(tmp_path), {"rng": capture_rng_state()}, 1, keep=1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(2), random.seed(2), np.random.seed(2)
    restore_rng_state(load_checkpoint(path)["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1]
    assert np.random.rand() == expected[2]


def test_differing_fields_compare_feature_lists_not_spelling():
    old = TrainConfig(feature_names="mean_rgb,mean_audio", feature_sizes="1024,128")
    same = TrainConfig(feature_names="mean_rgb, mean_audio", feature_sizes="1024, 128")
    assert differing_fields(old, same, ["feature_names", "feature_sizes", "model"]) == []
    other = TrainConfig(feature_names="mean_rgb", feature_sizes="1024", model="MoeModel")
    assert [name for name, _, _ in differing_fields(old, other, ["feature_names", "feature_sizes", "model"])] == \
        ["feature_names", "feature_sizes", "model"]

"""Helpers shared by the model tests: tiny hyper-parameters (fast tests), random padded input, and `yt8m train` on
eight-frame synthetic videos in a process of its own (--compile, torchrun), then export and predict."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import torch

from yt8m.models import BaseModel, create_model, hparam_fields, is_frame_level

# Small sizes for every model's hyper-parameters (each model takes its own, TrainConfig routes them to its model).
TINY = dict(dbof_cluster_size=64, dbof_hidden_size=32, iterations=8, lstm_cells=32, netvlad_cluster_size=4,
            fv_cluster_size=4, softdbof_cluster_size=16, gateddbof_cluster_size=16, willow_hidden_size=16,
            nextvlad_cluster_size=4, nextvlad_hidden_size=16, nextvlad_groups=2, deep_hidden_size=32,
            transformer_hidden_size=16, transformer_heads=2, transformer_max_frames=6)
assert set(TINY) <= {field.name for field, _ in hparam_fields()}


def tiny_model(name: str, feature_size: int, num_classes: int, **overrides) -> BaseModel:
    return create_model(name, feature_size, num_classes, **{**TINY, **overrides})


def random_input(name: str, batch: int, feature_size: int, frames: int = 9, seed: int = 0):
    """Features (zero-padded for frame-level models) and num_frames (None for video-level ones)."""
    generator = torch.Generator().manual_seed(seed)
    if not is_frame_level(name):
        return torch.randn(batch, feature_size, generator=generator), None
    num_frames = torch.randint(1, frames + 1, (batch,), generator=generator)
    features = torch.randn(batch, frames, feature_size, generator=generator)
    features[torch.arange(frames) >= num_frames[:, None]] = 0
    return features, num_frames


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """One torch thread: tiny models train faster without thread hand-offs, above all on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# Frame-level runs on write_eight_frame_data's videos: 16 + 8 features, 10 classes, 16 videos a batch.
FRAME_RUN_FLAGS = ["--frame_features", "--feature_names", "rgb,audio", "--feature_sizes", "16,8", "--num_classes",
                   "10", "--batch_size", "16", "--num_readers", "0", "--export_model_steps", "1000", "--seed", "3"]


def write_eight_frame_data(root: Path) -> dict:
    """64 training and 16 validation videos of exactly 8 frames (one shape to compile): their patterns."""
    from yt8m.data.making.synthetic import write_synthetic

    write_synthetic(str(root), kind="frame", num_classes=10, train_videos=64, validate_videos=16, test_videos=0,
                    shards=2, feature_sizes=(16, 8), min_frames=8, max_frames=8, seed=4)
    return {split: str(root / "frame" / f"{split}-*.tfrecord") for split in ("train", "validate")}


def train_frames(*flags: str, torchrun: bool = False) -> dict:
    """`yt8m train FRAME_RUN_FLAGS FLAGS` in a new process (under torchrun: 2 processes); its summary."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"] if torchrun \
        else [sys.executable]
    result = subprocess.run([*launcher, "-m", "yt8m", "train", *FRAME_RUN_FLAGS, *flags], capture_output=True,
                            text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def export_then_predict(train_dir: Path, pattern: str, out_dir: Path, capsys) -> list[str]:
    """Export the run to ONNX, predict `pattern` with the export: the CSV's lines."""
    from yt8m.cli import main as cli_main

    assert cli_main(["export", "--train_dir", str(train_dir), "--output", str(out_dir / "export")]) == 0
    capsys.readouterr()
    output = out_dir / "predictions.csv"
    assert cli_main(["predict", "--model", str(out_dir / "export"), "--input_data_pattern", pattern,
                     "--output_file", str(output)]) == 0
    return output.read_text().splitlines()

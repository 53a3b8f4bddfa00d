"""The cost of durable checkpoints: `save_checkpoint` (temporary name, fsync of the file, rename, fsync of the
folder) against the same write without the fsyncs, and against torch.save to a path + rename (before fsync).

Run on demand: `.venv/bin/python bench/bench_checkpoint.py [--dir /path/on/the/train/disk] [--repeats 5]`.
The payload is a trainer's checkpoint of a MoeModel on the config's default features (1024 features, 3862 classes,
2 mixtures: 237 MB with its Adam state; `--mixtures 1 --model_only`: 47 MB). The three ways take turns in each round;
prints one JSON line per way: file bytes and the seconds of each round, sorted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from typing import Callable
from unittest import mock

import torch

from yt8m.data.reading.spec import FeatureSpec
from yt8m.io.checkpoints import Checkpoint, checkpoint_path, save_checkpoint
from yt8m.models.config import ModelConfig, build_model


def moe_payload(mixtures: int, with_optimizer: bool) -> Checkpoint:
    model = build_model(ModelConfig("MoeModel", {"moe_num_mixtures": mixtures}), FeatureSpec())
    if not with_optimizer:
        return Checkpoint(model.state_dict(), progress={"step": 1})
    optimizer = torch.optim.Adam(model.parameters())
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()  # Adam's state: two tensors per weight
    return Checkpoint(model.state_dict(), optimizer.state_dict(), progress={"step": 1})


def at_step(checkpoint: Checkpoint, step: int) -> Checkpoint:
    """The same tensors (not copied) as the checkpoint of `step`."""
    return dataclasses.replace(checkpoint, progress={**checkpoint.progress, "step": step})


def save_before_fsync(train_dir: str, checkpoint: Checkpoint, step: int) -> str:
    """What save_checkpoint did before: torch.save to `<path>.tmp`, then rename."""
    path = checkpoint_path(train_dir, step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(at_step(checkpoint, step).payload(), f"{path}.tmp")
    os.replace(f"{path}.tmp", path)
    return path


def save_without_fsync(train_dir: str, checkpoint: Checkpoint, step: int) -> str:
    with mock.patch("os.fsync"):
        return save_checkpoint(train_dir, at_step(checkpoint, step), keep=1)


def save_durably(train_dir: str, checkpoint: Checkpoint, step: int) -> str:
    return save_checkpoint(train_dir, at_step(checkpoint, step), keep=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="Where to write (default: a temp dir); the disk of your train dirs.")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mixtures", type=int, default=2)
    parser.add_argument("--model_only", action="store_true", help="Leave out the Adam state (a third of the size).")
    args = parser.parse_args()
    payload = moe_payload(args.mixtures, not args.model_only)
    ways: dict[str, Callable[[str, Checkpoint, int], str]] = {
        "torch.save to a path + rename (before)": save_before_fsync,
        "save_checkpoint without fsync": save_without_fsync,
        "save_checkpoint (fsync file and folder)": save_durably}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        for round_number in range(args.repeats):
            for index, (name, save) in enumerate(ways.items()):
                train_dir = os.path.join(root, f"run{index}")
                os.sync()  # each way starts without the others' dirty pages to write back
                started = time.perf_counter()
                path = save(train_dir, payload, round_number + 1)
                seconds[name].append(time.perf_counter() - started)
                sizes[name] = os.path.getsize(path)
                os.remove(path)
    for name in ways:
        print(json.dumps({"way": name, "bytes": sizes[name], "seconds": sorted(round(s, 3) for s in seconds[name])}))


if __name__ == "__main__":
    main()

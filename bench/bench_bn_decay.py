"""Validation GAP of NeXtVLADModel and NetVLADModel by --pooling_batch_norm_decay on bench_pooling.py's synthetic
frame data and schedule (8 epochs of 47 steps): how short a run slim's decay (0.999) needs the statistics settled.

Usage: .venv/bin/python bench/bench_bn_decay.py [--decays 0.999,0.99,0.9] [--epochs 8] [--models NeXtVLADModel]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile

import torch
from bench_pooling import RUNS, run

from yt8m.data.making.synthetic import write_synthetic
from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset


def synthetic_data(args: argparse.Namespace, sizes: tuple) -> dict:
    """bench_pooling.py's data: its seed, 20-60 frames, 400 validation videos, one batch per split."""
    with tempfile.TemporaryDirectory() as folder:
        written = write_synthetic(folder, kind="frame", num_classes=args.num_classes, train_videos=args.train_videos,
                                  validate_videos=400, test_videos=0, shards=1, feature_sizes=sizes, min_frames=20,
                                  max_frames=60, seed=1)
        spec = FeatureSpec(["rgb", "audio"], list(sizes), True, num_classes=args.num_classes)
        return {split: next(iter(YT8MDataset(written[split][0], spec, 100_000))) for split in ("train", "validate")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--decays", default="0.999,0.99,0.9")
    parser.add_argument("--models", default="NeXtVLADModel,NetVLADModel")
    parser.add_argument("--num_classes", type=int, default=20)
    parser.add_argument("--train_videos", type=int, default=1500)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.004)
    args = parser.parse_args()
    sizes = (32, 16)
    torch.set_num_threads(1)
    data = synthetic_data(args, sizes)
    steps = args.epochs * math.ceil(args.train_videos / 32)
    for name, on_average, hparams in RUNS:
        for decay in (float(text) for text in args.decays.split(",") if name in args.models.split(",")):
            result = run(name, on_average, {**hparams, "pooling_batch_norm_decay": decay}, data, sizes, args)
            # the share of a running statistic that is still its initial value after the run
            print(json.dumps({**result, "steps": steps, "initial_share": round(decay ** steps, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Validation GAP of the learnable-pooling frame models against DbofModel and averaged frames on `yt8m synth` frame
data (half the labels' evidence in a window of frames), each trained the same epochs with Adam in one process.

Usage: .venv/bin/python bench/bench_pooling.py [--num_classes 20] [--train_videos 1500] [--epochs 8] [--lr 0.004]
       .venv/bin/python bench/bench_pooling.py --models DbofModel,NeXtVLADModel --set NeXtVLADModel.nextvlad_cluster_size=64
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from yt8m.data.making.synthetic import write_synthetic
from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset
from yt8m.eval.metrics import calculate_gap
from yt8m.models import create_model
from yt8m.tasks.losses import create_loss

# (name, on averaged frames, hyper-parameters): small sizes, so that a CPU trains them in about a minute each
RUNS = [("MoeModel", True, {}), ("FrameLevelLogisticModel", False, {}),
        ("DbofModel", False, dict(dbof_cluster_size=256, dbof_hidden_size=64, iterations=30)),
        ("NeXtVLADModel", False, dict(nextvlad_cluster_size=16, nextvlad_hidden_size=64, nextvlad_groups=4)),
        ("NetVLADModel", False, dict(netvlad_cluster_size=16, willow_hidden_size=64))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num_classes", type=int, default=20)
    parser.add_argument("--feature_sizes", default="32,16")
    parser.add_argument("--train_videos", type=int, default=1500)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.004)
    parser.add_argument("--models", default=",".join(name for name, _, _ in RUNS), help="Which of the runs to train.")
    parser.add_argument("--set", action="append", default=[], metavar="MODEL.PARAM=VALUE",
                        help="Change a run's hyper-parameter (an integer), e.g. NeXtVLADModel.nextvlad_groups=8.")
    args = parser.parse_args()
    changes: dict[str, dict] = {}
    for item in args.set:
        target, _, value = item.partition("=")
        model, _, param = target.partition(".")
        changes.setdefault(model, {})[param] = int(value)
    sizes = tuple(int(size) for size in args.feature_sizes.split(","))
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        written = write_synthetic(folder, kind="frame", num_classes=args.num_classes, train_videos=args.train_videos,
                                  validate_videos=400, test_videos=0, shards=1, feature_sizes=sizes, min_frames=20,
                                  max_frames=60, seed=1)
        spec = FeatureSpec(["rgb", "audio"], list(sizes), True, num_classes=args.num_classes)
        data = {split: next(iter(YT8MDataset(written[split][0], spec, 100_000))) for split in ("train", "validate")}
    for name, on_average, hparams in RUNS:
        if name in args.models.split(","):
            print(json.dumps(run(name, on_average, {**hparams, **changes.get(name, {})}, data, sizes, args)),
                  flush=True)
    return 0


def inputs(batch: dict, rows, on_average: bool) -> tuple:
    features, num_frames = batch.features[rows], batch.num_frames[rows]
    return (features.sum(dim=1) / num_frames[:, None], None) if on_average else (features, num_frames)


def run(name: str, on_average: bool, hparams: dict, data: dict, sizes: tuple, args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    model = create_model(name, sum(sizes), args.num_classes, modality_sizes=sizes, **hparams)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = create_loss("CrossEntropyLoss")
    train, order, start = data["train"], torch.Generator().manual_seed(0), time.perf_counter()
    labels = train.labels.float()
    for _ in range(args.epochs):
        model.train()
        for rows in torch.randperm(len(labels), generator=order).split(32):
            loss = loss_fn(model(*inputs(train, rows, on_average)), labels[rows]) + model.regularization_loss()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    validate = data["validate"]
    with torch.no_grad():
        predictions = model(*inputs(validate, slice(None), on_average))["predictions"].numpy()
    return {"model": name, "input": "averaged frames" if on_average else "frames", **hparams,
            "gap": round(calculate_gap(predictions, validate.labels.float().numpy()), 4),
            "train_seconds": round(time.perf_counter() - start, 1)}


if __name__ == "__main__":
    raise SystemExit(main())

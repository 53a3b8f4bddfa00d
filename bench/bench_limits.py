"""The RAM cache's estimate (what `yt8m train --cache_in_memory` checks against the memory available) against the
growth of this process's RSS from before the cache is filled to after the first epoch served from it.

Run on demand, one kind per process (a fresh RSS):
  .venv/bin/python bench/bench_limits.py --pattern '../shared/realdata/yt8m_2018_video_validate/*.tfrecord'
  .venv/bin/python bench/bench_limits.py --frame --synthetic_videos 1000 --data_dir /tmp/yt8m_limits
`--train` measures whole `yt8m train` runs instead (LogisticModel, SGD, 2 epochs; video level): the RSS growth from
the start of reading to the start of epoch 2 with the cache, and without it (what training itself takes).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from yt8m.data.making.synthetic import write_synthetic
from yt8m.data.reading.cache_estimate import estimate_cache
from yt8m.data.reading.dataset import YT8MDataset, make_loader
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.data.reading.spec import FeatureSpec


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def synthetic_frames(data_dir: str, videos: int) -> str:
    """Frame-level shards of `videos` videos (100-300 frames of 1024 + 128 values), written once."""
    folder = os.path.join(data_dir, "frame")
    if not os.path.isdir(folder):
        write_synthetic(data_dir, kind="frame", num_classes=3862, train_videos=videos, validate_videos=0,
                        test_videos=0, shards=8, min_frames=100, max_frames=300, seed=0)
    return os.path.join(folder, "train-*.tfrecord")


def measure(pattern: str, spec: FeatureSpec, batch_size: int) -> dict:
    dataset = YT8MDataset(pattern, spec, batch_size, ReadOptions(shuffle=True, cache_in_memory=True))
    start = time.perf_counter()
    estimate = estimate_cache(dataset.paths, spec, batch_size=batch_size)
    estimate_seconds = time.perf_counter() - start
    before = rss_bytes()
    loader = make_loader(dataset, 0)  # fills the cache
    filled = rss_bytes()
    served = sum(len(batch) for batch in loader)  # the first epoch, from RAM
    after = rss_bytes()
    assert dataset.cache is not None
    growth = after - before
    return {"files": len(dataset.paths), "videos": len(dataset.cache), "estimated_videos": estimate.records,
            "estimate_mb": round(estimate.nbytes / 2**20, 1), "estimate_seconds": round(estimate_seconds, 3),
            "cache_arrays_mb": round(dataset.cache.videos.nbytes / 2**20, 1),
            "rss_growth_after_fill_mb": round((filled - before) / 2**20, 1),
            "rss_growth_after_epoch_mb": round(growth / 2**20, 1), "served": served,
            "estimate_vs_rss_growth": round(estimate.nbytes / growth - 1, 3)}


def training_growth(pattern: str, spec: FeatureSpec, batch_size: int, cache: bool) -> list[int]:
    """RSS growth of a `yt8m train` run through the API from the start of reading (where a RAM cache is filled) to
    the start of epoch 1 (the fill done) and of epoch 2."""
    from yt8m.training import train
    from yt8m.training.data import TrainingData

    rss: dict[str, int] = {}
    start_reading, epoch_batches = TrainingData.open, TrainingData.epoch_batches

    def opened(self: TrainingData, device: Any) -> None:
        rss["before_fill"] = rss_bytes()
        start_reading(self, device)

    def epochs(self: TrainingData, epoch: int) -> Any:
        rss[f"epoch_{epoch + 1}"] = rss_bytes()
        return epoch_batches(self, epoch)

    TrainingData.open, TrainingData.epoch_batches = opened, epochs  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as train_dir:
        train(train_config(pattern, spec, batch_size, os.path.join(train_dir, "run"), cache))
    return [rss["epoch_1"] - rss["before_fill"], rss["epoch_2"] - rss["before_fill"]]


def measure_training(pattern: str, spec: FeatureSpec, batch_size: int) -> dict:
    """The estimate against the RSS growth of a cached run, and a streamed run's growth beside it (what training
    itself takes there: gradients, batches, the shuffle buffer), each run in a process of its own."""
    growth: dict[str, list[int]] = {}
    for mode in ("cache", "stream"):
        child = subprocess.run([sys.executable, __file__, "--pattern", pattern, "--batch_size", str(batch_size),
                                "--train_one", mode], capture_output=True, text=True, check=True)
        growth[mode] = json.loads(child.stdout.strip().splitlines()[-1])
    estimate = estimate_cache(sorted(glob.glob(pattern)), spec, batch_size=batch_size)
    return {"estimate_mb": round(estimate.nbytes / 2**20, 1),
            "rss_growth_cached_mb": [round(value / 2**20, 1) for value in growth["cache"]],
            "rss_growth_streamed_mb": [round(value / 2**20, 1) for value in growth["stream"]],
            "estimate_vs_growth_after_fill": round(estimate.nbytes / growth["cache"][0] - 1, 3),
            "estimate_vs_growth_after_epoch_1": round(estimate.nbytes / growth["cache"][1] - 1, 3)}


def train_config(pattern: str, spec: FeatureSpec, batch_size: int, train_dir: str, cache: bool) -> Any:
    from yt8m.config import config_from_dict
    from yt8m.training import TrainConfig

    return config_from_dict(TrainConfig, {
        "train_data_pattern": pattern, "train_dir": train_dir, "start_new_model": True, "model": "LogisticModel",
        "feature_names": ",".join(spec.feature_names), "feature_sizes": ",".join(map(str, spec.feature_sizes)),
        "num_classes": spec.num_classes, "batch_size": batch_size, "num_epochs": 2, "optimizer": "SGD",
        "num_readers": 0, "cache_in_memory": cache, "log_every_steps": 1000}, source="bench_limits")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pattern", default="../shared/realdata/yt8m_2018_video_validate/*.tfrecord")
    parser.add_argument("--frame", action="store_true", help="frame-level (rgb,audio) instead of video-level")
    parser.add_argument("--synthetic_videos", type=int, default=0, help="frame level: write this many videos")
    parser.add_argument("--data_dir", default="/tmp/yt8m_bench_limits")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--train", action="store_true", help="video level: whole `yt8m train` runs (see above)")
    parser.add_argument("--train_one", choices=["cache", "stream"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    pattern = synthetic_frames(args.data_dir, args.synthetic_videos) if args.synthetic_videos else args.pattern
    names = ["rgb", "audio"] if args.frame else ["mean_rgb", "mean_audio"]
    spec = FeatureSpec(feature_names=names, feature_sizes=[1024, 128], frame_features=args.frame, num_classes=3862)
    if args.train_one:
        print(json.dumps(training_growth(pattern, spec, args.batch_size, args.train_one == "cache")))
        return
    if args.train:
        figures = measure_training(pattern, spec, args.batch_size)
    else:
        figures = measure(pattern, spec, args.batch_size)
    print(json.dumps({"pattern": pattern, "frame": args.frame, "train": args.train, **figures}))


if __name__ == "__main__":
    main()

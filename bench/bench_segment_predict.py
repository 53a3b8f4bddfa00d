"""Throughput and peak memory of `yt8m predict --segment_labels` (2019 segments) over synthetic test videos.

Writes `--segments` segments' worth of 300-frame test videos (`yt8m synth --kind segment`, 60 segments a video),
trains a frame-level model for one step on a few videos (3862 classes), then runs the predict command in a child
process with the packaged 1,000-class whitelist and --segment_max_pred (default 100,000: every class keeps its
worst-case 100,000 candidates). Prints one JSON line: segments, videos, seconds (scoring_seconds: until the CSV is
written; segments/s of those), the child's peak RSS (getrusage of the children) and the CSV's size.

Run on demand: `.venv/bin/python bench/bench_segment_predict.py [--segments 1000000] [--feature_sizes 16,8]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

from yt8m.config import config_from_dict
from yt8m.data.making.synthetic import write_synthetic
from yt8m.training import TrainConfig, train

FRAMES = 300
SEGMENT_SIZE = 5
NUM_CLASSES = 3862
TRAIN_VIDEOS = 32


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def write_data(folder: str, segments: int, feature_sizes: tuple[int, int], shards: int) -> int:
    videos = -(-segments // (FRAMES // SEGMENT_SIZE))
    if not os.path.isdir(os.path.join(folder, "segment")):
        write_synthetic(folder, kind="segment", num_classes=NUM_CLASSES, train_videos=TRAIN_VIDEOS, validate_videos=0,
                        test_videos=videos, shards=shards, feature_sizes=feature_sizes, min_frames=FRAMES,
                        max_frames=FRAMES, seed=0)
    return videos


def train_model(folder: str, model: str, feature_sizes: tuple[int, int]) -> str:
    train_dir = os.path.join(folder, f"run-{model}")
    train(config_from_dict(TrainConfig, dict(
        train_data_pattern=os.path.join(folder, "segment", "train-*"), train_dir=train_dir, model=model,
        frame_features=True, feature_names="rgb,audio", feature_sizes=",".join(map(str, feature_sizes)),
        num_classes=NUM_CLASSES, batch_size=TRAIN_VIDEOS, max_steps=1, num_readers=0), source="bench_segment_predict"))
    return train_dir


def run_predict(folder: str, train_dir: str, args: argparse.Namespace) -> dict:
    output = os.path.join(folder, "segments.csv")
    command = [sys.executable, "-m", "yt8m", "predict", "--segment_labels", "--train_dir", train_dir,
               "--input_data_pattern", os.path.join(folder, "segment", "test-*"), "--output_file", output,
               "--segment_max_pred", str(args.segment_max_pred), "--batch_size", str(args.batch_size),
               "--num_readers", args.num_readers, "--device", "cpu"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(done.stderr)
    summary = json.loads(done.stdout)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB
    return {**summary, "wall_seconds": round(wall, 1), "peak_rss_mb": round(peak_kib / 1024, 1),
            "csv_mb": round(os.path.getsize(output) / 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=1_000_000, help="Segments to score (60 per video).")
    parser.add_argument("--feature_sizes", default="16,8", help="rgb,audio sizes (1024,128: the real ones).")
    parser.add_argument("--model", default="FrameLevelLogisticModel")
    parser.add_argument("--segment_max_pred", type=int, default=100_000)
    parser.add_argument("--batch_size", type=int, default=8192, help="Segments per model batch.")
    parser.add_argument("--num_readers", default="auto")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--data_dir", default="", help="Keep the data here (reused when present); default: a temp dir.")
    args = parser.parse_args()
    feature_sizes = tuple(int(size) for size in args.feature_sizes.split(","))
    with tempfile.TemporaryDirectory(prefix="yt8m-bench-segments-") as scratch:
        folder = args.data_dir or scratch
        written = time.perf_counter()
        videos = write_data(folder, args.segments, feature_sizes, args.shards)
        write_seconds = time.perf_counter() - written
        figures = run_predict(folder, train_model(folder, args.model, feature_sizes), args)
    print(json.dumps({"model": args.model, "feature_sizes": list(feature_sizes), "test_videos": videos,
                      "write_seconds": round(write_seconds, 1), "cpu": cpu_model(), "cpus": os.cpu_count(),
                      **{key: figures[key] for key in ("videos", "segments", "classes", "segment_max_pred", "seconds",
                                                       "scoring_seconds", "segments_per_sec", "wall_seconds", "peak_rss_mb", "csv_mb")}}))


if __name__ == "__main__":
    main()

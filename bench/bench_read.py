"""Read-throughput benchmark: synthetic YT8M shards decoded into batched torch tensors with 0, 1 and 2 workers, and
with what `auto` picks on this machine (runtime.reader_workers).

Run on demand: `.venv/bin/python bench/bench_read.py` (about 1 minute to write 2.2 GB of data, then timings).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import tempfile

from yt8m.data.making.synthetic import write_synthetic
from yt8m.data.reading.dataset import FeatureSpec
from yt8m.data.reading.throughput import read_throughput
from yt8m.runtime import reader_workers

VIDEO_SPEC = FeatureSpec(["mean_rgb", "mean_audio"], [1024, 128], frame_features=False)
FRAME_SPEC = FeatureSpec(["rgb", "audio"], [1024, 128], frame_features=True)


def _write_data(folder: str, video_videos: int, frame_videos: int, shards: int) -> None:
    if not glob.glob(os.path.join(folder, "video", "train-*")):
        write_synthetic(folder, kind="video", train_videos=video_videos, validate_videos=0, test_videos=0,
                        shards=shards)
    if not glob.glob(os.path.join(folder, "frame", "train-*")):
        write_synthetic(folder, kind="frame", train_videos=frame_videos, validate_videos=0, test_videos=0,
                        shards=shards, min_frames=300, max_frames=300)


def _page_cache(pattern: str) -> int:
    """Read the files once so that the timings measure decoding, not the disk; returns their bytes."""
    total = 0
    for path in glob.glob(pattern):
        with open(path, "rb") as fh:
            while chunk := fh.read(64 << 20):
                total += len(chunk)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=None, help="Reuse (or keep) the synthetic data here.")
    parser.add_argument("--video_videos", type=int, default=100_000)
    parser.add_argument("--frame_videos", type=int, default=5_000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--workers", default="auto,0,1,2", help="Comma-separated worker counts (or auto) to time.")
    parser.add_argument("--repeats", type=int, default=3, help="Timed passes per setting; the best is kept.")
    parser.add_argument("--video_batch_size", type=int, default=1024)
    parser.add_argument("--frame_batch_size", type=int, default=64)
    args = parser.parse_args()
    folder = args.data_dir or tempfile.mkdtemp(prefix="yt8m_bench_")
    try:
        _write_data(folder, args.video_videos, args.frame_videos, args.shards)
        runs = [("video", VIDEO_SPEC, args.video_batch_size), ("frame", FRAME_SPEC, args.frame_batch_size)]
        for kind, spec, batch_size in runs:
            pattern = os.path.join(folder, kind, "train-*")
            gigabytes = _page_cache(pattern) / 1e9
            for requested in args.workers.split(","):
                workers = reader_workers(requested, spec.frame_features)
                best = max((read_throughput(pattern, spec, batch_size, workers) for _ in range(args.repeats)),
                           key=lambda result: result["examples_per_sec"])
                print(json.dumps({"kind": kind, "files_gb": round(gigabytes, 2), "requested": requested, **best}),
                      flush=True)
    finally:
        if args.data_dir is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

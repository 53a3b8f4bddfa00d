"""Peak RSS of frame-level `--cache_in_memory` (uint8 frames as stored) against streaming the same shards, and the
frames' bytes as uint8 and as float32 (what a float32 cache would hold), each reading in its own process.

Run on demand: `.venv/bin/python bench/bench_frame_cache.py --pattern 'DIR/frame/train-*'` (page-cached shards).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset, make_loader
from yt8m.data.reading.read_plan import ReadOptions

SPEC = FeatureSpec(["rgb", "audio"], [1024, 128], frame_features=True)


def one_epoch(pattern: str, cached: bool, batch_size: int) -> dict:
    """Read the shards (two epochs from the cache, where cached) in this process; its peak RSS and frame bytes."""
    dataset = YT8MDataset(pattern, SPEC, batch_size, ReadOptions(cache_in_memory=cached))
    frames = 0
    for _ in range(2 if cached else 1):
        frames = sum(int(batch.num_frames.sum()) for batch in make_loader(dataset, 0))
    return {"cached": cached, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "frames_uint8_mb": round(frames * SPEC.feature_size / 2 ** 20),
            "frames_float32_mb": round(4 * frames * SPEC.feature_size / 2 ** 20)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pattern", required=True)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--child", choices=("streamed", "cached"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_epoch(args.pattern, args.child == "cached", args.batch_size)))
        return
    runs = {}
    for mode in ("streamed", "cached"):
        output = subprocess.run([sys.executable, __file__, "--pattern", args.pattern, "--batch_size",
                                 str(args.batch_size), "--child", mode], capture_output=True, text=True, check=True)
        runs[mode] = json.loads(output.stdout.splitlines()[-1])
    held = runs["cached"]["peak_rss_mb"] - runs["streamed"]["peak_rss_mb"]
    print(json.dumps({**runs, "cache_rss_over_streaming_mb": held,
                      "of_float32_frames": round(held / runs["cached"]["frames_float32_mb"], 3)}))


if __name__ == "__main__":
    main()

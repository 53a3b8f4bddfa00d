"""Frame-level reading against its floor, side by side: the floor only reads the shards, frames the records, checks
each payload's CRC32C and copies its bytes into a uint8 batch buffer (one process); then `yt8m bench read`'s reading.

Run on demand: `.venv/bin/python bench/bench_read_floor.py --data_dir DIR` on the frame/ folder `bench_read.py` or
`yt8m synth` wrote (page-cached first). Settings alternate round by round; the best pass of each is printed as JSON.
`--compare_src OTHER/src` adds another checkout's in-process reading (its `yt8m bench read`, in a subprocess).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import subprocess
import sys
import time

import numpy as np
import torch

from yt8m.data.format.decode import LabelIds
from yt8m.data.format.tfrecord import read_record_chunks
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.batch_memory import SlotRef
from yt8m.data.reading.dataset import FeatureSpec
from yt8m.data.reading.delivery import Delivery
from yt8m.data.reading.throughput import read_throughput

FRAME_SPEC = FeatureSpec(["rgb", "audio"], [1024, 128], frame_features=True)


def floor_pass(paths: list[str], batch_size: int, record_bytes: int) -> dict:
    """Read, frame, CRC-check and copy every payload into a reused [batch_size, record_bytes] uint8 buffer."""
    buffer = np.empty((batch_size, record_bytes), np.uint8)
    videos, row = 0, 0
    start = time.perf_counter()
    for path in paths:
        for chunk in read_record_chunks(path, batch_size):
            for payload_start, payload_end in zip(chunk.starts.tolist(), chunk.ends.tolist()):
                size = payload_end - payload_start
                buffer[row, :size] = chunk.data[payload_start:payload_end]
                row = (row + 1) % batch_size
                videos += 1
    seconds = time.perf_counter() - start
    return {"examples": videos, "seconds": round(seconds, 6), "examples_per_sec": round(videos / seconds, 1)}


def other_checkout_pass(source: str, pattern: str, batch_size: int) -> dict:
    """`yt8m bench read --frame_features --num_workers 0` of another checkout (its src/ first on the path)."""
    command = [sys.executable, "-m", "yt8m", "bench", "read", pattern, "--frame_features", "--num_workers", "0",
               "--batch_size", str(batch_size)]
    env = {**os.environ, "PYTHONPATH": source}
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def pipe_bytes_per_batch(batch_size: int, frames: int) -> int:
    """The pickled bytes a worker sends per batch through its pipe: ids, label ids, frame counts, the slot's name."""
    video_ids = [f"{index:04d}" for index in range(batch_size)]
    labels = LabelIds(np.arange(3 * batch_size, dtype=np.int64), np.arange(0, 3 * batch_size + 1, 3, dtype=np.int64))
    slot = SlotRef(0, 0, 0, (batch_size, frames, FRAME_SPEC.feature_size), torch.uint8)
    batch = Batch(video_ids, slot, labels, num_frames=torch.full((batch_size,), frames))
    return len(pickle.dumps(Delivery(batch)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", required=True, help="Folder with frame/train-* shards (300-frame videos).")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", default="0,1,2", help="Worker counts of yt8m's reading to time.")
    parser.add_argument("--compare_src", default="", help="Another checkout's src/ to time side by side.")
    args = parser.parse_args()
    pattern = os.path.join(args.data_dir, "frame", "train-*")
    paths = sorted(glob.glob(pattern))
    record_bytes = max(os.path.getsize(path) for path in paths)  # room for any payload
    with open(paths[0], "rb") as fh:
        length = int.from_bytes(fh.read(8), "little")
    record_bytes = min(record_bytes, 2 * length)
    settings = {"floor": lambda: floor_pass(paths, args.batch_size, record_bytes)}
    for workers in args.workers.split(","):
        settings[f"yt8m_{workers}_workers"] = (
            lambda count=int(workers): read_throughput(pattern, FRAME_SPEC, args.batch_size, count))
    if args.compare_src:
        settings["compare_src_in_process"] = lambda: other_checkout_pass(args.compare_src, pattern, args.batch_size)
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for name, run in settings.items():
            result = run()
            if name not in best or result["examples_per_sec"] > best[name]["examples_per_sec"]:
                best[name] = result
    floor = best["floor"]["examples_per_sec"]
    in_process = best.get("yt8m_0_workers", {}).get("examples_per_sec")
    steady_in_process = best.get("yt8m_0_workers", {}).get("after_first_examples_per_sec")
    for name, result in best.items():
        steady = result.get("after_first_examples_per_sec")
        print(json.dumps({"setting": name, "examples_per_sec": result["examples_per_sec"],
                          "of_floor": round(result["examples_per_sec"] / floor, 3),
                          "of_in_process": round(result["examples_per_sec"] / in_process, 3) if in_process else None,
                          "first_batch_seconds": result.get("first_batch_seconds"),
                          "after_first_of_in_process": round(steady / steady_in_process, 3) if steady else None}))
    print(json.dumps({"pipe_bytes_per_batch": pipe_bytes_per_batch(args.batch_size, 300),
                      "shared_memory_bytes_per_video": 300 * FRAME_SPEC.feature_size}))


if __name__ == "__main__":
    main()

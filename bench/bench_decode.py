"""Decode-speed benchmark of the data layer: TFRecord reading and Example/SequenceExample decoding.

Run on demand: `.venv/bin/python bench/bench_decode.py [--video_records N] [--frame_records N] [--processes P]`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Sequence

import numpy as np

from yt8m.data.example import (decode_frame, decode_video, decode_video_batch, dequantize, encode_frame_example,
                               encode_video_example, labels_to_multi_hot)
from yt8m.data.tfrecord import TFRecordWriter, read_records

VIDEO_NAMES, VIDEO_SIZES = ["mean_rgb", "mean_audio"], [1024, 128]
FRAME_NAMES, FRAME_SIZES = ["rgb", "audio"], [1024, 128]
NUM_CLASSES = 3862
BATCH = 1024


def video_payloads(count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    features = rng.uniform(-2, 2, (count, 1152)).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, (count, 3))
    return [encode_video_example(f"{seed:02x}{i:06x}", labels[i].tolist(),
                                 {"mean_rgb": features[i, :1024], "mean_audio": features[i, 1024:]})
            for i in range(count)]


def frame_payloads(count: int, seed: int, num_frames: int = 300) -> list[bytes]:
    rng = np.random.default_rng(seed)
    distinct = [rng.integers(0, 256, (num_frames, 1152), dtype=np.uint8) for _ in range(8)]
    return [encode_frame_example(f"{seed:02x}{i:06x}", [i % NUM_CLASSES],
                                 {"rgb": distinct[i % 8][:, :1024], "audio": distinct[i % 8][:, 1024:]})
            for i in range(count)]


def write(path: str, payloads: Sequence[bytes]) -> None:
    with TFRecordWriter(path) as writer:
        for payload in payloads:
            writer.write(payload)


def batches(payloads: Sequence[bytes]) -> list[Sequence[bytes]]:
    return [payloads[i:i + BATCH] for i in range(0, len(payloads), BATCH)]


def decode_video_batches(chunks: Sequence[Sequence[bytes]]) -> None:
    for chunk in chunks:
        _, labels, _ = decode_video_batch(chunk, VIDEO_NAMES, VIDEO_SIZES, NUM_CLASSES)
        labels_to_multi_hot(labels, NUM_CLASSES)


def decode_video_each(payloads: Sequence[bytes]) -> None:
    for payload in payloads:
        decode_video(payload, VIDEO_NAMES, VIDEO_SIZES, NUM_CLASSES)


def decode_frames(payloads: Sequence[bytes]) -> None:
    for payload in payloads:
        dequantize(decode_frame(payload, FRAME_NAMES, FRAME_SIZES, NUM_CLASSES)[2])


def read_only(path: str) -> int:
    return sum(1 for _ in read_records(path))


def read_decode_video(path: str) -> int:
    records = (payload for _, payload in read_records(path))
    count = 0
    while chunk := list(itertools.islice(records, BATCH)):
        decode_video_batches([chunk])
        count += len(chunk)
    return count


def read_decode_frames(path: str) -> int:
    count = 0
    for _, payload in read_records(path):
        decode_frames([payload])
        count += 1
    return count


def report(label: str, records: int, nbytes: int, run: Callable[[], object]) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{label:<44} {records:>8} rec {wall:7.2f} s  {records / wall:>10,.0f} rec/s  "
          f"{nbytes / wall / 1e6:>8,.0f} MB/s  (cpu {records / max(cpu, 1e-9):>10,.0f} rec/s)", flush=True)


def run_parallel(function: Callable[[str], int], paths: Sequence[str]) -> None:
    with ProcessPoolExecutor(len(paths)) as pool:
        assert sum(pool.map(function, paths)) > 0


def bench_kind(kind: str, payloads: list[bytes], folder: str, processes: int) -> None:
    nbytes = sum(map(len, payloads))
    shard_paths = [os.path.join(folder, f"{kind}-{i}.tfrecord") for i in range(processes)]
    for index, path in enumerate(shard_paths):
        write(path, payloads[index::processes])
    file_bytes = sum(os.path.getsize(p) for p in shard_paths)
    n = len(payloads)
    report(f"{kind}: read_records (page cache)", n, file_bytes, lambda: sum(map(read_only, shard_paths)))
    if kind == "video":
        report("video: decode_video, one record at a time", n, nbytes, lambda: decode_video_each(payloads))
        chunks = batches(payloads)
        report(f"video: decode_video_batch({BATCH}) + multi-hot", n, nbytes, lambda: decode_video_batches(chunks))
        pipeline = read_decode_video
    else:
        report("frame: decode_frame + dequantize", n, nbytes, lambda: decode_frames(payloads))
        pipeline = read_decode_frames
    report(f"{kind}: read + decode, 1 process", n, file_bytes, lambda: sum(map(pipeline, shard_paths)))
    if processes > 1:
        report(f"{kind}: read + decode, {processes} processes", n, file_bytes,
               lambda: run_parallel(pipeline, shard_paths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--video_records", type=int, default=100_000)
    parser.add_argument("--frame_records", type=int, default=2_000)
    parser.add_argument("--processes", type=int, default=2, help="also run read + decode on this many cores")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="yt8m_bench_decode_") as folder:
        print(f"generating {args.video_records} video-level records ...", flush=True)
        bench_kind("video", video_payloads(args.video_records, seed=1), folder, args.processes)
        print(f"generating {args.frame_records} frame-level records of 300 frames ...", flush=True)
        bench_kind("frame", frame_payloads(args.frame_records, seed=2), folder, args.processes)


if __name__ == "__main__":
    main()

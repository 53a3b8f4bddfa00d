"""Peak RSS and wall time of `yt8m eval`, `yt8m predict` and `yt8m score` over growing numbers of synthetic
video-level videos (3862 classes, mean_rgb 1024 + mean_audio 128, a MoeModel), each command in its own process.

Run on demand: `.venv/bin/python bench/bench_memory.py --data_dir /tmp/yt8m_mem --sizes 100000,300000,1000000`.
The data (about 4.7 KB a video) and a 2-step MoeModel train dir are written once under --data_dir and reused.
`--entry main` runs each command's `main(argv)` without the process settings `yt8m` makes (as the issue did).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from yt8m.cli import COMMANDS
from yt8m.data.format.encode import encode_video_example
from yt8m.data.format.tfrecord import TFRecordWriter

NUM_CLASSES = 3862
FEATURE_SIZES = {"mean_rgb": 1024, "mean_audio": 128}
DISTINCT_FEATURES = 64  # feature vectors are drawn from a small pool: writing stays fast, decoding is the same


def shard_path(data_dir: str, shard: int) -> str:
    return os.path.join(data_dir, "shards", f"validate-{shard:05d}.tfrecord")


def write_shards(data_dir: str, num_shards: int, shard_videos: int) -> None:
    """Shards of `shard_videos` labelled videos each (1-6 labels, uniform) and a labels CSV beside each."""
    os.makedirs(os.path.join(data_dir, "shards"), exist_ok=True)
    pool = np.random.default_rng(0).uniform(-1, 1, (DISTINCT_FEATURES, sum(FEATURE_SIZES.values())))
    pool = pool.astype(np.float32)
    for shard in range(num_shards):
        path = shard_path(data_dir, shard)
        if os.path.exists(path + ".labels"):
            continue
        rng = np.random.default_rng(shard + 1)
        lines = []
        with TFRecordWriter(path) as writer:
            for index in range(shard * shard_videos, (shard + 1) * shard_videos):
                video_id = f"v{index:07d}"
                labels = np.unique(rng.integers(0, NUM_CLASSES, 1 + rng.poisson(2)))
                vector = pool[index % DISTINCT_FEATURES]
                writer.write(encode_video_example(video_id, labels.tolist(), {
                    "mean_rgb": vector[:FEATURE_SIZES["mean_rgb"]], "mean_audio": vector[FEATURE_SIZES["mean_rgb"]:]}))
                lines.append(f"{video_id},{' '.join(map(str, labels))}\n")
        with open(path + ".labels", "w") as out:
            out.writelines(lines)


def size_dir(data_dir: str, videos: int, shard_videos: int) -> str:
    """A folder with hard links to the first shards holding `videos` videos, and their labels CSV."""
    folder = os.path.join(data_dir, f"videos-{videos}")
    os.makedirs(folder, exist_ok=True)
    labels = os.path.join(folder, "labels.csv")
    if not os.path.exists(labels):
        with open(labels + ".part", "w") as out:
            out.write("VideoId,Labels\n")
            for shard in range(videos // shard_videos):
                link = os.path.join(folder, os.path.basename(shard_path(data_dir, shard)))
                if not os.path.exists(link):
                    os.link(shard_path(data_dir, shard), link)  # fsspec globs skip symlinks
                with open(shard_path(data_dir, shard) + ".labels") as part:
                    out.write(part.read())
        os.replace(labels + ".part", labels)
    return folder


def train_dir(data_dir: str) -> str:
    """A MoeModel trained for 2 steps on the first shard: the weights do not matter, only the shapes."""
    path = os.path.join(data_dir, "train_dir")
    if not os.path.exists(os.path.join(path, "checkpoints")):
        subprocess.run([sys.executable, "-m", "yt8m", "train", "--train_data_pattern", shard_path(data_dir, 0),
                        "--train_dir", path, "--model", "MoeModel", "--feature_names", ",".join(FEATURE_SIZES),
                        "--feature_sizes", ",".join(map(str, FEATURE_SIZES.values())), "--max_steps", "2",
                        "--num_readers", "0"], check=True, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return path


def command_line(entry: str, command: str, flags: list[str]) -> list[str]:
    if entry == "cli":
        return [sys.executable, "-m", "yt8m", command, *flags]
    module, function = COMMANDS[command][0].split(":")
    code = f"import sys; from {module} import {function} as main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", code, *flags]


def measure(argv: list[str]) -> dict:
    """Wall seconds and peak RSS (MB, from wait4) of one process, and the JSON line it printed."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        if process.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed ({process.returncode}):\n{stderr.read().decode()[-3000:]}")
        result = json.loads(stdout.read().decode().splitlines()[-1])
    return {"seconds": round(seconds, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024), "result": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--sizes", default="100000,300000,1000000", help="Numbers of videos, comma-separated.")
    parser.add_argument("--shard_videos", type=int, default=250,
                        help="Videos per shard (the real validate shards hold about 290); divides every size.")
    parser.add_argument("--commands", default="eval,predict,score")
    parser.add_argument("--entry", choices=("cli", "main"), default="cli",
                        help="cli: `python -m yt8m CMD`; main: the command's main() without the process settings.")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    if any(size % args.shard_videos for size in sizes):
        parser.error("--shard_videos must divide every size")
    write_shards(args.data_dir, max(sizes) // args.shard_videos, args.shard_videos)
    run_dir = train_dir(args.data_dir)
    for videos in sizes:
        folder = size_dir(args.data_dir, videos, args.shard_videos)
        pattern, predictions = os.path.join(folder, "*.tfrecord"), os.path.join(folder, "predictions.csv")
        flags = {
            "eval": ["--eval_data_pattern", pattern, "--train_dir", run_dir, "--run_once", "--num_readers", "0"],
            "predict": ["--input_data_pattern", pattern, "--train_dir", run_dir, "--output_file", predictions,
                        "--num_readers", "0"],
            "score": ["--predictions", predictions, "--labels", os.path.join(folder, "labels.csv")],
        }
        for command in args.commands.split(","):
            figures = measure(command_line(args.entry, command, flags[command]))
            print(json.dumps({"command": command, "entry": args.entry, "videos": videos,
                              "seconds": figures["seconds"], "peak_rss_mb": figures["peak_rss_mb"],
                              "num_videos": figures["result"].get("num_videos", figures["result"].get("videos"))}),
                  flush=True)


if __name__ == "__main__":
    main()

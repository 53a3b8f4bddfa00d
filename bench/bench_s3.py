"""Streaming training from S3 against local disk: `yt8m train` (video-level MoeModel) examples/s on the same synthetic
shards read from local disk and from an S3-compatible server on loopback (moto's, in its own process, via s3fs),
and the bare read throughput (`yt8m bench read`'s) of both, which says how far reading is from limiting training.

Each round runs every setting in turn (local data; s3 data; s3 data with the train dir on s3 too), so that a busy
machine slows all of them alike; the best round of each is kept. Needs the dev extras (s3fs, moto[server]).
Usage: .venv/bin/python bench/bench_s3.py [--videos 4000] [--epochs 1] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from s3_server import loopback_s3_server, s3_environment_set  # noqa: E402
from yt8m.config import config_from_dict  # noqa: E402
from yt8m.data.making.synthetic import write_synthetic  # noqa: E402
from yt8m.data.reading.dataset import FeatureSpec  # noqa: E402
from yt8m.data.reading.throughput import read_throughput  # noqa: E402
from yt8m.runtime import reader_workers, setup_logging  # noqa: E402
from yt8m.training import TrainConfig, train  # noqa: E402

BUCKET = "yt8m-bench"


def train_once(pattern: str, train_dir: str, args: argparse.Namespace) -> dict:
    config = config_from_dict(TrainConfig, dict(
        train_data_pattern=pattern, train_dir=train_dir, model="MoeModel", feature_names="mean_rgb,mean_audio",
        feature_sizes="1024,128", num_classes=3862, batch_size=args.batch_size, num_epochs=args.epochs,
        num_readers=args.readers, start_new_model=True, export_model_steps=10**9, log_every_steps=10**9, seed=1),
        source="bench_s3")
    summary = train(config)
    return {"examples": summary["examples"], "seconds": summary["seconds"],
            "examples_per_sec": summary["examples_per_sec"], "input_wait_fraction": summary["input_wait_fraction"]}


def read_once(pattern: str, _: str, args: argparse.Namespace) -> dict:
    spec = FeatureSpec(["mean_rgb", "mean_audio"], [1024, 128], frame_features=False)
    result = read_throughput(pattern, spec, args.batch_size, reader_workers(args.readers, False))
    return {key: result[key] for key in ("examples", "seconds", "examples_per_sec", "mb_per_sec")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=4_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--readers", default="auto", help="--num_readers of the runs.")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    setup_logging()
    import s3fs

    with tempfile.TemporaryDirectory(prefix="yt8m_bench_s3_") as folder, loopback_s3_server() as endpoint, \
            s3_environment_set(endpoint):
        write_synthetic(folder, kind="video", train_videos=args.videos, validate_videos=0, test_videos=0,
                        shards=args.shards, num_classes=3862)
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        fs.put(os.path.join(folder, "video") + "/", f"{BUCKET}/video/", recursive=True)
        local, remote = os.path.join(folder, "video", "train-*"), f"s3://{BUCKET}/video/train-*"
        settings = {("read", "local"): (read_once, local, ""), ("read", "s3_data"): (read_once, remote, ""),
                    ("train", "local"): (train_once, local, os.path.join(folder, "run")),
                    ("train", "s3_data"): (train_once, remote, os.path.join(folder, "run_s3_data")),
                    ("train", "s3_data_and_train_dir"): (train_once, remote, f"s3://{BUCKET}/run")}
        best: dict[tuple[str, str], dict] = {}
        for _ in range(args.rounds):
            for key, (run, pattern, train_dir) in settings.items():
                result = run(pattern, train_dir, args)
                if result["examples_per_sec"] > best.get(key, {}).get("examples_per_sec", 0):
                    best[key] = result
        for (what, name), result in best.items():
            ratio = result["examples_per_sec"] / best[(what, "local")]["examples_per_sec"]
            print(json.dumps({"what": what, "setting": name, **result, "vs_local": round(ratio, 3)}), flush=True)


if __name__ == "__main__":
    main()

"""Distillation on synthetic video-level data: a student trained on few labelled videos, alone and distilled from a
bigger teacher trained on all of them (`yt8m train --teacher`); validation GAP, mAP, Hit@1 and PERR of each.

The teacher is a MoeModel trained on all training shards; the students are LogisticModels trained on the first
`--student_shards` shards only, the same epochs and seed each: alone (--teacher not given), then distilled from the
teacher run (streamed) and from its full-probability JSONL predictions (stored), at a few weights and temperatures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from yt8m.cli import main as cli_main
from yt8m.data.making.synthetic import write_synthetic
from yt8m.io.checkpoints import export_root, read_export_metrics


def train(train_dir: str, train_pattern: str, eval_pattern: str, args: argparse.Namespace, *flags: str) -> dict:
    """Train with the given flags; the final export's validation metrics, and the seconds it took."""
    started = time.perf_counter()
    code = cli_main(["train", "--train_data_pattern", train_pattern, "--eval_data_pattern", eval_pattern,
                     "--train_dir", train_dir, "--feature_names", "mean_rgb,mean_audio", "--feature_sizes",
                     args.feature_sizes, "--num_classes", str(args.num_classes), "--batch_size", "128",
                     "--num_readers", "0", "--export_model_steps", "100000", "--log_every_steps", "1000",
                     "--metrics_every_steps", "1000", "--seed", "1", *flags])
    if code:
        raise SystemExit(f"training {train_dir} failed")
    metrics = read_export_metrics(export_root(train_dir, "final"))
    return {key: round(metrics[key], 4) for key in ("gap", "map", "hit_at_one", "perr")} | {
        "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work_dir", default="", help="Where data and runs go (default: a temporary folder).")
    parser.add_argument("--num_classes", type=int, default=200)
    parser.add_argument("--feature_sizes", default="128,32")
    parser.add_argument("--train_videos", type=int, default=8000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--student_shards", type=int, default=1)
    parser.add_argument("--teacher_epochs", type=int, default=10)
    parser.add_argument("--student_epochs", type=int, default=10)
    args = parser.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="yt8m-distill-")
    write_synthetic(work, kind="video", num_classes=args.num_classes, train_videos=args.train_videos,
                    validate_videos=2000, test_videos=0, shards=args.shards,
                    feature_sizes=tuple(map(int, args.feature_sizes.split(","))), seed=1)
    folder = os.path.join(work, "video")
    all_train, validate = os.path.join(folder, "train-*.tfrecord"), os.path.join(folder, "validate-*.tfrecord")
    few = ",".join(os.path.join(folder, f"train-{shard:05d}-of-{args.shards:05d}.tfrecord")
                   for shard in range(args.student_shards))
    teacher = os.path.join(work, "teacher")
    results = {"teacher MoeModel (4 mixtures), all shards": train(
        teacher, all_train, validate, args, "--model", "MoeModel", "--moe_num_mixtures", "4",
        "--num_epochs", str(args.teacher_epochs))}
    predictions = os.path.join(work, "teacher_train.jsonl")
    cli_main(["predict", "--input_data_pattern", few, "--train_dir", teacher, "--output_file", predictions,
              "--output_format", "jsonl", "--top_k", str(args.num_classes), "--num_readers", "0"])
    student = ("--model", "LogisticModel", "--num_epochs", str(args.student_epochs))
    runs = {"student alone": (),
            "distilled, run, W 0.5 T 1": ("--teacher", teacher),
            "distilled, JSONL, W 0.5 T 1": ("--teacher", predictions),
            "distilled, run, W 0.5 T 2": ("--teacher", teacher, "--distill_temperature", "2"),
            "distilled, run, W 0.9 T 1": ("--teacher", teacher, "--distill_weight", "0.9"),
            "distilled, run, softmax W 0.5 T 1": ("--teacher", teacher, "--distill_loss", "softmax")}
    for name, flags in runs.items():
        results[f"student LogisticModel, {args.student_shards} shard(s), {name}"] = train(
            os.path.join(work, name.replace(" ", "_").replace(",", "")), few, validate, args, *student, *flags)
    for name, result in results.items():
        print(json.dumps({"run": name, **result}))


if __name__ == "__main__":
    main()

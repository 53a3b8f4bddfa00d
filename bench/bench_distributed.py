"""Training examples/s of `yt8m train` in 1 process against 2 torchrun processes (DDP, gloo on CPU), same data.

Each run is a `yt8m train` subprocess on synthetic video-level data (1152 features, 3862 classes) held in RAM
(--cache_in_memory) so the figure is the step itself plus, with 2 processes, the gradient all-reduce. The
summary's steady-state examples/s counts global examples. Rounds alternate; each setting keeps its best.
On a shared machine more processes also win a larger share of the CPUs: the CPU seconds of each whole run
(start-up and RAM caching included) are printed beside the rate.
Usage: .venv/bin/python bench/bench_distributed.py [--model MoeModel] [--global_batch 1024] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

from yt8m.data.making.synthetic import write_synthetic
from yt8m.runtime import available_cpus
from yt8m.training.meter import WARMUP_STEPS


def run_training(data_pattern: str, train_dir: str, processes: int, batch_size: int, threads: int,
                 args: argparse.Namespace) -> dict:
    """One `yt8m train` run (under torchrun when processes > 1); its JSON summary."""
    flags = ["--train_data_pattern", data_pattern, "--train_dir", train_dir, "--model", args.model,
             "--feature_names", "mean_rgb,mean_audio", "--feature_sizes", "1024,128", "--num_classes", "3862",
             "--batch_size", str(batch_size), "--num_epochs", "1000", "--max_steps", str(WARMUP_STEPS + args.steps),
             "--export_model_steps", str(10 ** 9), "--num_readers", "0", "--cache_in_memory",
             "--start_new_model", "--log_every_steps", "10", "--device", "cpu"]
    launcher = [sys.executable, "-m", "yt8m"]
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
                    "-m", "yt8m"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([*launcher, "train", *flags], env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"training failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {**json.loads(done.stdout.splitlines()[-1]), "cpu_seconds": round(cpu, 1)}


def settings(args: argparse.Namespace) -> list[dict]:
    """(label, processes, per-process batch, threads per process): one process with every core, then two
    processes sharing the cores, at the same global batch and at twice the per-process batch."""
    cpus = available_cpus()
    half = max(cpus // 2, 1)
    return [
        {"label": f"1 process, {cpus} threads", "processes": 1, "batch_size": args.global_batch, "threads": cpus},
        {"label": f"2 processes x {half} thread(s), same global batch", "processes": 2,
         "batch_size": args.global_batch // 2, "threads": half},
        {"label": f"2 processes x {half} thread(s), same per-process batch", "processes": 2,
         "batch_size": args.global_batch, "threads": half},
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="MoeModel", help="A video-level model: MoeModel or LogisticModel.")
    parser.add_argument("--global_batch", type=int, default=1024, help="Examples per optimizer step in 1 process.")
    parser.add_argument("--steps", type=int, default=20, help="Timed steps per run, after the warm-up steps.")
    parser.add_argument("--videos", type=int, default=8192, help="Synthetic training videos.")
    parser.add_argument("--rounds", type=int, default=2, help="Alternating rounds; each setting keeps its best.")
    parser.add_argument("--work_dir", default=None, help="Where data and train dirs go (default: a temp dir).")
    args = parser.parse_args()
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="yt8m-bench-distributed-")
    data_dir = os.path.join(work_dir, "data")
    if not os.path.isdir(os.path.join(data_dir, "video")):
        write_synthetic(data_dir, kind="video", num_classes=3862, train_videos=args.videos, validate_videos=0,
                        test_videos=0, shards=8)
    pattern = os.path.join(data_dir, "video", "train-*")
    runs = settings(args)
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for index, setting in enumerate(runs):
            summary = run_training(pattern, os.path.join(work_dir, f"run-{index}"), setting["processes"],
                                   setting["batch_size"], setting["threads"], args)
            if summary["examples_per_sec"] > best.get(setting["label"], {}).get("examples_per_sec", -1):
                best[setting["label"]] = summary
    baseline = best[runs[0]["label"]]["examples_per_sec"]
    print(f"{args.model}, global batch {args.global_batch}, {available_cpus()} CPUs, best of {args.rounds} rounds",
          file=sys.stderr)
    for setting in runs:
        summary = best[setting["label"]]
        result = {"model": args.model, "setting": setting["label"], "processes": setting["processes"],
                  "batch_size_per_process": setting["batch_size"],
                  "global_batch": setting["batch_size"] * setting["processes"],
                  "examples_per_sec": summary["examples_per_sec"], "run_cpu_seconds": summary["cpu_seconds"],
                  "run_seconds": summary["seconds"],
                  "vs_one_process": round(summary["examples_per_sec"] / baseline, 3)}
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

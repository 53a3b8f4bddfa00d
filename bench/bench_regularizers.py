"""The small-data regularizers on the 38k split (issue 34): a recipe trained with each lever and several seeds,
GAP / mAP / Hit@1 / PERR of its final epoch and of its best epoch on the validation shards, mean and spread.

    python bench/bench_regularizers.py --recipe configs/recipes/video_logistic_cpu.yaml \
        --lever baseline= --lever label_smoothing=--label_smoothing,0.1 --lever mixup=--mixup_alpha,0.2 \
        --seeds 1,2,3 --jobs 2 --out bench/results/regularizers_logistic.json

Each run is `yt8m train --config RECIPE --seed S ...` on shards 0000-0111, validated every epoch on 0112-0131
(--checkpoint_every_epoch, as the recipes); with --jobs 2 two runs go at once, each pinned to one core (taskset).
A lever is NAME=FLAG,VALUE[,FLAG,VALUE...] (empty after '=': the recipe as it is).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata" / "yt8m_2018_video_validate"
METRICS = ("gap", "map", "hit_at_one", "perr")


def shards(first: int, last: int) -> str:
    return ",".join(str(REALDATA / f"validate{index:04d}.tfrecord") for index in range(first, last + 1))


def run(recipe: str, flags: list[str], seed: int, core: int, root: Path) -> dict:
    train_dir = Path(tempfile.mkdtemp(prefix="run-", dir=root))
    command = ["yt8m", "train", "--config", recipe, "--train_data_pattern", shards(0, 111),
               "--eval_data_pattern", shards(112, 131), "--train_dir", str(train_dir), "--seed", str(seed), *flags]
    pinned = ["taskset", "-c", str(core)] if shutil.which("taskset") else []
    started = time.perf_counter()
    subprocess.run(pinned + command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    final = json.loads((train_dir / "export" / "final" / "metrics.json").read_text())
    best_dir = max((train_dir / "export" / "best").iterdir())
    best = json.loads((best_dir / "metrics.json").read_text())
    shutil.rmtree(train_dir)
    return {"seed": seed, "seconds": round(seconds, 1), "final": {name: final[name] for name in METRICS},
            "best": {name: best[name] for name in METRICS}, "best_step": best.get("global_step")}


def summarize(runs: list[dict], which: str) -> dict:
    values = {name: [run[which][name] for run in runs] for name in METRICS}
    return {name: {"mean": round(statistics.mean(v), 4), "spread": round(max(v) - min(v), 4)}
            for name, v in values.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--lever", action="append", required=True, help="NAME=FLAG,VALUE,... (repeatable)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    levers = {}
    for lever in args.lever:
        name, _, flags = lever.partition("=")
        levers[name] = [part for part in flags.split(",") if part]
    seeds = [int(seed) for seed in args.seeds.split(",")]
    jobs = [(name, flags, seed) for name, flags in levers.items() for seed in seeds]
    root = Path(tempfile.mkdtemp(prefix="bench-regularizers-"))
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run, args.recipe, flags, seed, index % args.jobs, root)
                   for index, (name, flags, seed) in enumerate(jobs)]
        results: dict[str, list[dict]] = {name: [] for name in levers}
        for (name, _, _), future in zip(jobs, futures):
            results[name].append(future.result())
            print(f"{name} seed {results[name][-1]['seed']}: {results[name][-1]}", file=sys.stderr, flush=True)
    table = {name: {"flags": levers[name], "final": summarize(runs, "final"), "best": summarize(runs, "best"),
                    "seconds": round(statistics.mean(run["seconds"] for run in runs), 1), "runs": runs}
             for name, runs in results.items()}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    Path(args.out).write_text(json.dumps({"recipe": args.recipe, "seeds": seeds, "levers": table}, indent=1))
    base = table.get("baseline")
    for name, row in table.items():
        gain = f" ({row['final']['gap']['mean'] - base['final']['gap']['mean']:+.4f})" if base else ""
        print(f"| {name} | {row['final']['gap']['mean']:.4f} ± {row['final']['gap']['spread'] / 2:.4f}{gain} | "
              f"{row['final']['map']['mean']:.4f} | {row['final']['hit_at_one']['mean']:.4f} | "
              f"{row['final']['perr']['mean']:.4f} | {row['best']['gap']['mean']:.4f} | {row['seconds']:.0f} |")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

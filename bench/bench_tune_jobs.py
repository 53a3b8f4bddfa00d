"""Trials an hour of `yt8m tune --n_jobs J` on this machine's CPUs (issue 46): the same study, the same trials
(the random sampler draws each trial from (--seed, its number)), run with each J one after another.

    python bench/bench_tune_jobs.py --jobs 1,2 --n_trials 8 --train 0,27 --validate 112,119 --num_epochs 2 \
        --out bench/results/tune_jobs_cpu.json

The tuning file is configs/tune_video.yaml without its enqueued configurations, on the real 2018 shards named
(bench_tune_curves.study_config), with no pruning and no early stopping, so every trial trains the same epochs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tune_curves import study_config  # noqa: E402  (a sibling script)


def run(config: Path, jobs: int, n_trials: int, folder: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "yt8m", "tune", "--config", str(config), "--study_dir", str(folder / "study"),
               "--n_trials", str(n_trials), "--n_jobs", str(jobs), "--sampler", "random", "--pruner", "none",
               "--seed", "1"]
    started = time.perf_counter()
    with open(folder / "tune.log", "w") as log:
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=log, check=True)
    seconds = time.perf_counter() - started
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{folder}/study/study.db")
    complete = [trial for trial in study.trials if trial.state.name == "COMPLETE"]
    return {"jobs": jobs, "seconds": round(seconds, 1), "complete": len(complete),
            "trials_per_hour": round(len(complete) * 3600 / seconds, 1),
            "params": sorted(json.dumps(trial.params, sort_keys=True) for trial in complete)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tune_video.yaml")
    parser.add_argument("--jobs", default="1,2")
    parser.add_argument("--n_trials", type=int, default=8)
    parser.add_argument("--train", default="0,27")
    parser.add_argument("--validate", default="112,119")
    parser.add_argument("--num_epochs", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-tune-jobs-"))
    results = []
    for jobs in (int(part) for part in args.jobs.split(",")):
        folder = root / f"jobs{jobs}"
        folder.mkdir()
        config = study_config(args.config, args.train, args.validate, folder)
        document = yaml.safe_load(config.read_text())
        document["train"].update(num_epochs=args.num_epochs, early_stopping_patience=0)
        config.write_text(yaml.safe_dump(document, sort_keys=False))
        results.append(run(config, jobs, args.n_trials, folder))
        print(json.dumps({key: value for key, value in results[-1].items() if key != "params"}), flush=True)
    same = len({tuple(result["params"]) for result in results}) == 1
    Path(args.out).write_text(json.dumps({"n_trials": args.n_trials, "train": args.train, "validate": args.validate,
                                          "num_epochs": args.num_epochs, "same_trials": same, "results": results},
                                         indent=1) + "\n")
    print(f"same trials in every run: {same}; studies kept in {root}", file=sys.stderr)


if __name__ == "__main__":
    main()

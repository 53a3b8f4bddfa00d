"""Tuning benchmark. `synthetic`: TPE with median pruning against random search without pruning, same trial
budget, on synthetic shards: best validation GAP and training examples spent. `real`: a study on real 2018
shards whose best config is scored on shards it was not tuned on, against the default MoeModel config.

Run on demand: `.venv/bin/python bench/bench_tune.py synthetic` / `.venv/bin/python bench/bench_tune.py real`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import optuna
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_SHARDS = REPO_ROOT.parent / "shared" / "realdata" / "yt8m_2018_video_validate"
# Real-data protocol: tune on shards 0-39, score trials on 40-51, compare the winner on 52-63 only.
REAL_SPLITS = {"train": range(0, 40), "validate": range(40, 52), "holdout": range(52, 64)}
# The starter kit's defaults for MoeModel, enqueued as trial 0 so the study measures itself against them.
DEFAULT_MOE = {"model": "MoeModel", "base_learning_rate": 0.01, "batch_size": 1024, "moe_num_mixtures": 2,
               "l2_penalty": 1e-8}
SEARCH = {
    "model": {"type": "categorical", "choices": ["LogisticModel", "MoeModel"]},
    "base_learning_rate": {"type": "float", "low": 1e-4, "high": 0.3, "log": True},
    "batch_size": {"type": "categorical", "choices": [64, 128, 256, 512, 1024]},
    "moe_num_mixtures": {"type": "int", "low": 1, "high": 4, "when": {"model": "MoeModel"}},
    "l2_penalty": {"type": "float", "low": 1e-9, "high": 1e-3, "log": True},
}
ARMS = {"tpe+median": {"sampler": "tpe", "pruner": "median"}, "random": {"sampler": "random", "pruner": "none"}}


def run_tune(config: dict[str, Any], folder: Path, **flags: Any) -> dict[str, Any]:
    """`yt8m tune` in a subprocess (as a user runs it); returns its JSON line."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tune.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [sys.executable, "-m", "yt8m", "tune", "--config", str(path), "--study_dir", str(folder / "study")]
    argv += [f"--{name}={value}" for name, value in flags.items()]
    with open(folder / "tune.log", "w") as log:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=log, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def load(study_dir: str) -> optuna.Study:
    return optuna.load_study(study_name="tune", storage=f"sqlite:///{study_dir}/study.db")


def spend(study: optuna.Study, target: Optional[float] = None) -> dict[str, Any]:
    """Training examples of all trials; and, in finishing order, spent until the best value reached `target`."""
    trials = sorted((t for t in study.trials if t.state.is_finished()), key=lambda t: t.datetime_complete)
    total, to_target, best = 0, None, None
    for trial in trials:
        total += trial.user_attrs.get("examples", 0)
        if trial.state == optuna.trial.TrialState.COMPLETE:
            best = trial.value if best is None else max(best, trial.value)
        if to_target is None and target is not None and best is not None and best >= target:
            to_target = total
    states = [t.state.name for t in trials]
    return {"best_gap": best, "examples": total, "examples_to_target": to_target,
            "complete": states.count("COMPLETE"), "pruned": states.count("PRUNED"), "failed": states.count("FAIL")}


def synthetic(args: argparse.Namespace) -> None:
    from yt8m.data.making.synthetic import write_synthetic

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="yt8m_bench_tune_"))
    data = work / "data"
    if not (data / "video").is_dir():
        write_synthetic(str(data), kind="video", num_classes=args.num_classes, train_videos=args.train_videos,
                        validate_videos=args.validate_videos, test_videos=0, shards=4, seed=0)
    config = {"train": {"train_data_pattern": str(data / "video" / "train-*"),
                        "eval_data_pattern": str(data / "video" / "validate-*"),
                        "feature_names": "mean_rgb,mean_audio", "feature_sizes": "1024,128",
                        "num_classes": args.num_classes, "num_epochs": args.epochs, "num_readers": 0,
                        "cache_in_memory": True, "log_every_steps": 1000, "metrics_every_steps": 1000},
              "search": SEARCH, "objective": {"metric": "gap"},
              "tune": {"n_startup_trials": args.startup_trials}}
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        studies = {}
        for arm, flags in ARMS.items():
            result = run_tune(config, work / f"{arm}-seed{seed}", n_trials=args.trials, seed=seed, **flags)
            studies[arm] = load(result["study_dir"])
        random_best = spend(studies["random"])["best_gap"]
        for arm, study in studies.items():
            row = {"seed": seed, "arm": arm, **spend(study, target=random_best)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    summarize(rows, args)


def summarize(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n{args.trials} trials per study, {args.epochs} epochs per trial, seeds {args.seeds}; "
          f"examples_to_target: training examples spent until the best GAP reached random search's best")
    random_examples = [r["examples"] for r in rows if r["arm"] == "random"]
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        reached = [r["examples_to_target"] for r in mine if r["examples_to_target"] is not None]
        per_seed = ", ".join(f"{r['best_gap']:.4f}" for r in mine)
        print(f"{arm:11s} best GAP mean {statistics.mean(r['best_gap'] for r in mine):.4f} (per seed {per_seed}); "
              f"examples mean {statistics.mean(r['examples'] for r in mine):,.0f}; "
              f"reached random's best in {len(reached)}/{len(mine)} seeds"
              + (f", after {statistics.mean(reached) / statistics.mean(random_examples):.0%} of random's "
                 f"examples on average" if reached else ""))


def real(args: argparse.Namespace) -> None:
    from yt8m.tuning.report import evaluate_train_dir

    def shards(split: str) -> str:
        return ",".join(str(REAL_SHARDS / f"validate{i:04d}.tfrecord") for i in REAL_SPLITS[split])

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="yt8m_bench_tune_real_"))
    config = {"train": {"train_data_pattern": shards("train"), "eval_data_pattern": shards("validate"),
                        "feature_names": "mean_rgb,mean_audio", "feature_sizes": "1024,128",
                        "num_classes": 3862, "num_epochs": args.epochs, "num_readers": 0, "cache_in_memory": True,
                        "log_every_steps": 1000, "metrics_every_steps": 1000},
              "search": {**SEARCH, "base_learning_rate": {"type": "float", "low": 1e-3, "high": 0.1, "log": True},
                         "l2_penalty": {"type": "float", "low": 1e-9, "high": 1e-5, "log": True}},
              "objective": {"metric": "gap"},
              "tune": {"n_startup_trials": args.startup_trials, "enqueue": [DEFAULT_MOE]}}
    flags = {"n_trials": args.trials, **({"timeout": args.timeout} if args.timeout else {})}
    result = run_tune(config, work, **flags)
    study = load(result["study_dir"])
    default = study.trials[0]
    best = study.best_trial
    holdout = {name: evaluate_train_dir(trial.user_attrs["train_dir"], shards("holdout"))["gap"]
               for name, trial in (("default", default), ("tuned", best))}
    figures = {"epochs": args.epochs, "trials": result["n_trials"], "default_params": DEFAULT_MOE,
               "best_params": best.params, "best_trial": best.number,
               "validation_gap": {"default": default.value, "tuned": best.value},
               "holdout_gap": holdout, "holdout_gain": holdout["tuned"] - holdout["default"],
               "study_dir": result["study_dir"], **spend(study)}
    print(json.dumps(figures), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["synthetic", "real"])
    parser.add_argument("--work_dir", default=None, help="Keep data and studies here (default: a temp dir).")
    parser.add_argument("--trials", type=int, default=None, help="Trial budget per study (20 synthetic, 16 real).")
    parser.add_argument("--epochs", type=int, default=None, help="Epochs per trial (6 synthetic, 5 real).")
    parser.add_argument("--startup_trials", type=int, default=5, help="Random trials before TPE and pruning start.")
    parser.add_argument("--seeds", default="0,1,2", help="synthetic: sampler seeds, one pair of studies each.")
    parser.add_argument("--num_classes", type=int, default=100, help="synthetic: classes.")
    parser.add_argument("--train_videos", type=int, default=4000, help="synthetic: training videos.")
    parser.add_argument("--validate_videos", type=int, default=1000, help="synthetic: validation videos.")
    parser.add_argument("--timeout", type=float, default=None, help="real: start no trial after this many seconds.")
    args = parser.parse_args()
    if args.mode == "synthetic":
        args.trials, args.epochs = args.trials or 20, args.epochs or 6
        synthetic(args)
    else:
        if not REAL_SHARDS.is_dir():
            sys.exit(f"real shards not found at {REAL_SHARDS}")
        args.trials, args.epochs = args.trials or 16, args.epochs or 5
        real(args)


if __name__ == "__main__":
    main()

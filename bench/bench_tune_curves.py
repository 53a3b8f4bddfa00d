"""Search curves (issue 34): the best validated GAP a `yt8m tune` study has found against its wall time, for several
arms (sampler and pruner flags), with no enqueued configurations, on real 2018 shards.

    python bench/bench_tune_curves.py --config configs/tune_video.yaml --train 0,55 --validate 112,131 \
        --arm tpe+median=--pruner,median --arm tpe+hyperband=--pruner,hyperband --seeds 1,2 --budget 1800 \
        --out bench/results/tune_curves_half.json

Each study is `yt8m tune --config CONFIG --seed S --timeout BUDGET` with the config's `enqueue` removed and its
patterns set to the shards named (validateNNNN.tfrecord of shared/realdata/yt8m_2018_video_validate). The arms of
one seed run at once, each pinned to one core (taskset), so they meet the same machine. A trial stopped by the
timeout keeps its best validated epoch, as tune scores it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import optuna
import yaml

REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata" / "yt8m_2018_video_validate"


def shards(span: str) -> str:
    first, last = (int(part) for part in span.split(","))
    return ",".join(str(REALDATA / f"validate{index:04d}.tfrecord") for index in range(first, last + 1))


def study_config(config: str, train: str, validate: str, folder: Path) -> Path:
    """The config without its enqueued configurations, on the shards named."""
    document = yaml.safe_load(Path(config).read_text())
    document["train"].update(train_data_pattern=shards(train), eval_data_pattern=shards(validate))
    document.setdefault("tune", {}).pop("enqueue", None)
    path = folder / "tune.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def run_study(config: Path, flags: list[str], seed: int, budget: float, core: int, folder: Path) -> dict[str, Any]:
    pinned = ["taskset", "-c", str(core)] if shutil.which("taskset") else []
    command = [sys.executable, "-m", "yt8m", "tune", "--config", str(config), "--study_dir", str(folder / "study"),
               "--seed", str(seed), "--timeout", str(budget), "--n_trials", "1000", *flags]
    with open(folder / "tune.log", "w") as log:
        # Exit status 1 when no trial completed within the budget: the curve is then empty, not an error here.
        done = subprocess.run(pinned + command, stdout=subprocess.DEVNULL, stderr=log)
    return {**curve(folder / "study"), "exit_status": done.returncode}


def curve(study_dir: Path) -> dict[str, Any]:
    """Best-so-far value at each finished trial's end, in seconds from the first trial's start; and the counts."""
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{study_dir}/study.db")
    finished = sorted((t for t in study.trials if t.state.is_finished()), key=lambda t: t.datetime_complete)
    start = min(t.datetime_start for t in study.trials if t.datetime_start is not None)
    points, best = [], None
    for trial in finished:
        if trial.state == optuna.trial.TrialState.COMPLETE and trial.value is not None:
            best = trial.value if best is None else max(best, trial.value)
        if best is not None:
            points.append([round((trial.datetime_complete - start).total_seconds(), 1), round(best, 4)])
    states = [t.state.name for t in study.trials]
    winner = study.best_trial if best is not None else None
    return {"points": points, "best": best, "best_params": winner.params if winner else None,
            "reports": sum(len(t.intermediate_values) for t in study.trials),
            "examples_trained": sum(t.user_attrs.get("examples", 0) for t in study.trials),
            "trials": {state.lower(): states.count(state) for state in sorted(set(states))}}


def plot(results: dict[str, dict[int, dict[str, Any]]], path: str) -> None:
    import matplotlib  # the `plots` extra, only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for (arm, runs), color in zip(results.items(), ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        for seed, run in runs.items():
            xs = [point[0] / 60 for point in run["points"]]
            axes.step(xs, [point[1] for point in run["points"]], where="post", color=color,
                      label=f"{arm} (seed {seed})", linestyle="-" if seed == min(runs) else "--")
    axes.set_xlabel("minutes")
    axes.set_ylabel("best validated GAP so far")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tune_video.yaml")
    parser.add_argument("--train", default="0,55", help="first,last training shard")
    parser.add_argument("--validate", default="112,131", help="first,last validation shard")
    parser.add_argument("--arm", action="append", required=True, help="NAME=FLAG,VALUE,... (repeatable)")
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--budget", type=float, default=1800.0, help="seconds of each study (its --timeout)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--plot", default="", help="a PNG of the curves (needs the plots extra)")
    args = parser.parse_args()
    arms = {name: [part for part in flags.split(",") if part]
            for name, _, flags in (arm.partition("=") for arm in args.arm)}
    root = Path(tempfile.mkdtemp(prefix="bench-tune-curves-"))
    results: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in arms}
    for seed in (int(seed) for seed in args.seeds.split(",")):
        with ThreadPoolExecutor(len(arms)) as pool:
            futures = {}
            for core, (name, flags) in enumerate(arms.items()):
                folder = root / f"{name}-seed{seed}"
                folder.mkdir()
                config = study_config(args.config, args.train, args.validate, folder)
                futures[name] = pool.submit(run_study, config, flags, seed, args.budget, core, folder)
            for name, future in futures.items():
                results[name][seed] = future.result()
                print(f"{name} seed {seed}: best {results[name][seed]['best']} {results[name][seed]['trials']}",
                      file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps({"arms": arms, "budget_seconds": args.budget, "train": args.train,
                                          "validate": args.validate, "results": results}, indent=1) + "\n")
    if args.plot:
        plot(results, args.plot)
    print(f"studies kept in {root}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""The `yt8m <command>` entry point: dispatches to each command's own `main(argv)`.

Commands are imported lazily so that `yt8m --help` and light commands start fast.
"""

from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "synth": ("yt8m.data.synthetic:main", "Write learnable synthetic YT8M data (video, frame, segment)."),
    "inspect": ("yt8m.inspect:main", "Summarize TFRecord shards, or dump them as JSON lines."),
    "bench": ("yt8m.bench:main", "Measure your input pipeline: `yt8m bench read PATTERN`."),
    "score": ("yt8m.score:main", "Score a Kaggle-format predictions CSV against a labels CSV."),
    "train": ("yt8m.trainer:main", "Train a model (starter-kit train.py flags)."),
    "eval": ("yt8m.evaluate:main", "Evaluate checkpoints of a train dir (starter-kit eval.py flags)."),
    "predict": ("yt8m.predict:main", "Write a Kaggle CSV (or JSON lines) of top-k predictions, from a checkpoint or ONNX."),
    "export": ("yt8m.export:main", "Export a checkpoint as an ONNX model with a metadata JSON, for serving."),
    "convert-predictions": ("yt8m.predict:convert_main", "Turn `predict --output_format jsonl` output into the Kaggle CSV."),
    "demo": ("yt8m.demo:main", "Synthesize data, train, evaluate, predict and score, end to end."),
    "tune": ("yt8m.tune:main", "Search hyperparameters with Optuna: resumable, pruned, parallel (`--config tune.yaml`)."),
    "tune-report": ("yt8m.tune:report_main", "Leaderboard, best.yaml and plots of a tuning study; --retrain_best."),
}

# Commands that stream inputs of any size: they keep glibc from growing its heap with them instead of taking the
# training settings of configure_process (see runtime.map_large_blocks).
STREAMING_COMMANDS = frozenset({"eval", "predict", "score", "convert-predictions"})


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: yt8m <command> [flags]   (yt8m <command> --help for its flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from yt8m import __version__
        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"yt8m: unknown command '{name}'\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name = COMMANDS[name][0].split(":")
    from yt8m.runtime import configure_process, map_large_blocks  # here: `yt8m --help` need not import torch

    if name in STREAMING_COMMANDS:
        map_large_blocks()
    else:
        configure_process()
    command = getattr(importlib.import_module(module_name), func_name)
    try:
        return int(command(rest) or 0)
    except (ValueError, FileNotFoundError, OSError, KeyError) as err:
        if getattr(err, "yt8m_user_error", False) or isinstance(err, (ValueError, FileNotFoundError)):
            print(f"yt8m {name}: error: {err}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())

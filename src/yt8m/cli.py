"""The `yt8m <command>` entry point: dispatches to each command's own `main(argv)`.

Commands are imported lazily so that `yt8m --help` and light commands start fast. A user error (bad input, a
bad flag, a missing or unwritable file) prints one line and exits 1; `--verbose` adds its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from typing import Optional, Sequence

from yt8m import __version__
from yt8m.fields import nearest
from yt8m.process_settings import configure_streaming_process, configure_training_process

COMMANDS: dict[str, tuple[str, str]] = {
    "download": ("yt8m.commands.download:main",
                 "Download YouTube-8M shards (official plan, mirrors, --shard I,N): resumable, MD5-verified."),
    "synth": ("yt8m.commands.synth:main", "Write learnable synthetic YT8M data (video, frame, segment)."),
    "inspect": ("yt8m.commands.inspect:main", "Summarize TFRecord shards, or dump them as JSON lines."),
    "bench": ("yt8m.commands.bench:main", "Measure your input pipeline: `yt8m bench read PATTERN`."),
    "score": ("yt8m.commands.score:main", "Score a Kaggle-format predictions CSV against a labels CSV."),
    "train": ("yt8m.commands.train:main", "Train a model (starter-kit train.py flags)."),
    "eval": ("yt8m.commands.eval:main", "Evaluate checkpoints of a train dir (starter-kit eval.py flags)."),
    "predict": ("yt8m.commands.predict:main",
                "Write a Kaggle CSV (or JSON lines) of top-k predictions, from a checkpoint or ONNX."),
    "export": ("yt8m.commands.export:main", "Export a checkpoint as an ONNX model with a metadata JSON, for serving."),
    "ensemble": ("yt8m.commands.ensemble:main",
                 "Combine runs, exports or prediction files by a weighted average (weights given or fitted)."),
    "convert-predictions": ("yt8m.commands.convert_predictions:main",
                            "Turn `predict --output_format jsonl` output into the Kaggle CSV."),
    "demo": ("yt8m.commands.demo:main", "Synthesize data, train, evaluate, predict and score, end to end."),
    "tune": ("yt8m.commands.tune:main",
             "Search hyperparameters with Optuna: resumable, pruned, parallel (`--config tune.yaml`)."),
    "tune-report": ("yt8m.commands.tune_report:main",
                    "Leaderboard, best.yaml and plots of a tuning study; --retrain_best."),
}
# Commands whose work is training get the process settings that speed it up, those that stream inputs of any size
# the one that keeps their memory flat (yt8m.process_settings); none changes the values a command prints.
TRAINING_COMMANDS = ("train", "tune")
STREAMING_COMMANDS = ("eval", "predict", "ensemble", "score", "convert-predictions")
VERBOSE_FLAG = "--verbose"
# Errors a user can act on, printed as one line: bad input or flags (ValueError), missing or unwritable files and a
# full disk (OSError), and what object storage's clients raise of their own for an endpoint that does not answer,
# a refused key pair or a missing bucket (botocore's EndpointConnectionError, ...). Anything else is a bug and keeps
# its traceback.
USER_ERRORS = (ValueError, OSError)
STORAGE_CLIENTS = ("botocore", "aiobotocore", "s3fs", "gcsfs", "google.auth", "google.api_core", "aiohttp")
# An error may carry its own exit status (a run interrupted between steps, its progress saved: 130): one line too.
EXIT_STATUS = "exit_status"
# An error every process of a torchrun job raises alike (their listings differ) is printed by rank 0 only.
RANK0_REPORTS = "rank0_reports"
RANK0_GRACE_SECONDS = 2.0
# An error line longer than this is cut in the middle: messages quote input in part (yt8m.fields.quoted), and
# this keeps one that does not, or that lists thousands of failures, a line a terminal can show.
MESSAGE_LIMIT = 2000


def configure_process_for(command: str) -> None:
    """The process settings of the command's kind of work, made before its module imports torch."""
    if command in TRAINING_COMMANDS:
        configure_training_process()
    elif command in STREAMING_COMMANDS:
        configure_streaming_process()


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: yt8m <command> [flags] [--verbose]   (yt8m <command> --help for its flags; --verbose: "
             "tracebacks with errors)", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = VERBOSE_FLAG in argv
    argv = [arg for arg in argv if arg != VERBOSE_FLAG]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        suggestion = nearest(name, COMMANDS)
        hint = f" (did you mean {suggestion}?)" if suggestion else ""
        print(f"yt8m: error: unknown command '{name}'{hint}; `yt8m --help` lists the commands", file=sys.stderr)
        return 1
    configure_process_for(name)
    importable_from_here()
    module_name, func_name = COMMANDS[name][0].split(":")
    command = getattr(importlib.import_module(module_name), func_name)
    try:
        return int(command(rest) or 0)
    except Exception as err:
        if not is_user_error(err):
            raise
        if verbose:
            traceback.print_exc()
        status = getattr(err, EXIT_STATUS, 1)
        if getattr(err, RANK0_REPORTS, False) and os.environ.get("RANK", "0") != "0":
            # every torchrun process raised it and rank 0 says it: torchrun stops the job as soon as one process
            # exits, so the others leave a moment later, after rank 0 has printed its line
            time.sleep(RANK0_GRACE_SECONDS)
            return int(status)
        kind = "error: " if status == 1 else ""  # an outcome of its own (a run interrupted) is not an error
        print(f"yt8m {name}: {kind}{shortened(str(err) or type(err).__name__)}", file=sys.stderr)
        return int(status)


def importable_from_here() -> None:
    """Modules in the working directory import, as under `python -m yt8m` (the `yt8m` script's own directory is on
    the path instead): `--model mymodels:MyModel` finds ./mymodels.py, and so do the processes yt8m starts."""
    here = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == here for entry in sys.path):
        sys.path.insert(0, here)


def is_user_error(err: BaseException) -> bool:
    return isinstance(err, USER_ERRORS) or hasattr(type(err), EXIT_STATUS) or any(
        _is_storage_client(cls.__module__) for cls in type(err).__mro__)


def _is_storage_client(module: str) -> bool:
    return any(module == client or module.startswith(f"{client}.") for client in STORAGE_CLIENTS)


def shortened(message: str) -> str:
    """`message`, cut in the middle to about MESSAGE_LIMIT characters where it is longer."""
    if len(message) <= MESSAGE_LIMIT:
        return message
    head, tail = MESSAGE_LIMIT * 3 // 4, MESSAGE_LIMIT // 4
    return f"{message[:head]} ... [{len(message) - head - tail} characters cut] ... {message[-tail:]}"


if __name__ == "__main__":
    sys.exit(main())

"""A trial of `--gpus_per_trial K` > 1: trained as a K-process torchrun job (`python -m yt8m.tuning.trial_process
FILE`), whose rank 0 reports to the study as an in-process trial does; the job reads back its outcome.

The job writes FILE (the tuning file, the trial's parameters and number, its limits' seconds left); every rank reads
the trial's config from it; rank 0 wraps the study's trial and runs the same ValidationReporter, then writes FILE's
outcome beside it. Ctrl+C and SIGTERM reach the processes through torchrun and stop them between steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

import optuna

from yt8m.distributed.ranks import env_rank, torchrun_command
from yt8m.io.files import write_file_atomically
from yt8m.models.model_size import ModelTooLargeError
from yt8m.runtime import setup_logging
from yt8m.training import train
from yt8m.training.stopping import STOPS, noting_signals
from yt8m.tuning.objective import TrialFailure, Validated, ValidationReporter
from yt8m.tuning.space import TuneSpec
from yt8m.tuning.study import open_storage, open_study

PAYLOAD = "trial_process.pkl"
OUTCOME = "trial_process.json"
POLL_SECS = 0.2


def train_across_processes(trial: optuna.Trial, reporter: ValidationReporter, params: dict[str, Any],
                           overrides: dict[str, Any], processes: int) -> dict[str, Any]:
    """Train the trial as `processes` torchrun processes; `reporter` gets rank 0's reports and verdict. The
    training summary; a TrialFailure (or ModelTooLargeError) for the error that ended it."""
    train_dir = reporter.config.checkpoints.train_dir
    os.makedirs(train_dir, exist_ok=True)
    payload = {"spec": reporter.spec, "params": params, "overrides": overrides, "trial": trial.number,
               "rungs": reporter.rungs, "limits": STOPS.seconds_left()}
    with open(os.path.join(train_dir, PAYLOAD), "wb") as out:  # read only by the job it starts next
        pickle.dump(payload, out)
    command = torchrun_command([], processes)
    command[command.index("yt8m"):] = ["yt8m.tuning.trial_process", os.path.join(train_dir, PAYLOAD)]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    signalled = False
    while child.poll() is None:
        if STOPS.signal_noted is not None and not signalled:  # a SIGTERM to the job alone: pass it on
            child.send_signal(signal.SIGTERM)
            signalled = True
        time.sleep(POLL_SECS)
    return read_outcome(os.path.join(train_dir, OUTCOME), reporter, f"its {processes}-process job ended with "
                        f"exit status {child.returncode} before writing its outcome")


def read_outcome(path: str, reporter: ValidationReporter, missing: str) -> dict[str, Any]:
    """Rank 0's outcome into `reporter`; its summary, or the error that ended the job (`missing`: none written)."""
    if not os.path.exists(path):
        raise TrialFailure(missing)
    with open(path) as fh:
        outcome = json.load(fh)
    for name in ("reports", "metrics", "epochs", "examples", "pruned_at", "failure"):
        setattr(reporter, name, outcome["reporter"][name])
    reporter.reports = [(int(step), float(value)) for step, value in reporter.reports]
    best = outcome["reporter"]["best"]
    reporter.best = Validated(**best) if best else None
    if outcome.get("too_large"):
        raise ModelTooLargeError(outcome["too_large"])
    if outcome.get("error"):
        raise TrialFailure(outcome["error"])
    return outcome["summary"]


def run_rank(payload_path: str) -> None:
    """One process of the job: train the trial's config; rank 0 reports to the study and writes the outcome."""
    with open(payload_path, "rb") as fh:
        payload = pickle.load(fh)
    spec: TuneSpec = payload["spec"]
    config = spec.trial_config(payload["params"], os.path.dirname(payload_path), **payload["overrides"])
    rank = env_rank()  # torchrun's: the process group is joined inside train()
    reporter = ValidationReporter(_study_trial(spec, payload["trial"]), spec, config, rungs=payload["rungs"]) \
        if rank == 0 else None
    outcome: dict[str, Any] = {}
    try:
        with contextlib.ExitStack() as limits:
            # Rank 0 alone holds the limits: every rank stops at the step it says, and a limit another rank saw
            # first would reach rank 0 as "stopped by another process", an interrupt, not the limit it is.
            for name, seconds in (payload["limits"] if reporter is not None else {}).items():
                limits.enter_context(STOPS.deadline(name, seconds))
            outcome["summary"] = train(config, hooks=[reporter] if reporter else [])
    except ModelTooLargeError as err:
        outcome["too_large"] = str(err)
    except Exception as err:  # the trial's own error, as the in-process trial records it
        outcome["error"] = f"{type(err).__name__}: {err}"
    if reporter is not None:
        outcome["reporter"] = _reporter_state(reporter)
        path = os.path.join(os.path.dirname(payload_path), OUTCOME)
        write_file_atomically(path, lambda out: json.dump(outcome, out, default=str))


def _study_trial(spec: TuneSpec, number: int) -> optuna.Trial:
    """The study's running trial `number`, to report to and ask the study's pruner (as the study was opened)."""
    storage = open_storage(spec.settings.study)
    study = open_study(spec, storage)
    study_id = storage.get_study_id_from_name(study.study_name)
    return optuna.trial.Trial(study, storage.get_trial_id_from_study_id_trial_number(study_id, number))


def _reporter_state(reporter: ValidationReporter) -> dict[str, Any]:
    return {"reports": reporter.reports, "metrics": reporter.metrics, "epochs": reporter.epochs,
            "examples": reporter.examples, "pruned_at": reporter.pruned_at, "failure": reporter.failure,
            "best": asdict(reporter.best) if reporter.best else None}


if __name__ == "__main__":
    setup_logging()
    with noting_signals(again="ignore"):
        run_rank(sys.argv[1])

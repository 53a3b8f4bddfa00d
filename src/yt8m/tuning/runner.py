"""Running a study: create or resume it, run trials in this process or J spawned job processes (which die with
it) until it has --n_trials finished trials, then write the report; Ctrl+C, SIGTERM and --timeout stop the running
trials between two steps (re-queued; at --timeout, one that validated keeps its best value)."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import multiprocessing
import os
import signal
import sys
import time
from typing import Any, Optional

import optuna
import torch
import yaml

from yt8m.config import config_from_dict, config_values, flag_names, with_values
from yt8m.data.format.tfrecord import expand_pattern
from yt8m.io.files import write_file_atomically
from yt8m.process_settings import configure_training_process
from yt8m.runtime import available_cpus, setup_logging, share_machine_among, visible_gpus
from yt8m.training.stopping import STOPS, noting_signals
from yt8m.tuning.budget import study_budget
from yt8m.tuning.devices import check_gpus_per_trial, job_count, job_devices, use_job_devices
from yt8m.tuning.lifetime import TrialStartLock, note_interrupt, stop_jobs, watch_over_job
from yt8m.tuning.limits import RunFlags, RunLimits
from yt8m.tuning.objective import TrialFailure, TrialInterrupted, TrialObjective, remove_checkpoints_beyond_best
from yt8m.tuning.report import LEADERBOARD_TXT, write_leaderboard_and_best, write_report
from yt8m.tuning.space import TuneSettings, TuneSpec, load_tune_spec
from yt8m.tuning.study import (
    STUDY_FILE,
    describe_counts,
    display_url,
    open_storage,
    open_study,
    recover_interrupted,
    state_counts,
    storage_url,
    trials_to_start,
)
from yt8m.tuning.trial_process import train_across_processes

log = logging.getLogger("yt8m.tune")

# prctl(2) option: the signal the calling process receives when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1
# Exit status of an interrupted run, and of a job the watchdog ends (128 + SIGINT, as after Ctrl+C).
EXIT_INTERRUPTED = 130
JOIN_POLL_SECS = 0.2  # how often the tune process looks at its jobs and at a stop request
# How often a job whose budget other processes' running trials hold looks for one of them interrupted (at most: at
# each heartbeat where those are shorter), a cheap read of the study.
OTHERS_POLL_SECS = 5


def run_tune(spec: TuneSpec) -> tuple[optuna.Study, dict[str, Any]]:
    """Create or resume the study, run trials until it has --n_trials, write the report; returns the study and
    the summary. On Ctrl+C (or SIGTERM), and when --timeout passes, the running trials are re-queued and the report
    is still written; a trial past --trial_timeout is stopped at its best validated epoch."""
    _check_data(spec)
    check_gpus_per_trial(spec.settings.study.gpus_per_trial)
    settings = spec.settings
    os.makedirs(settings.study.study_dir, exist_ok=True)
    study = open_study(spec, open_storage(settings.study))
    write_study_file(spec, os.path.join(settings.study.study_dir, STUDY_FILE))
    log.info("study '%s' in %s (%s): %s; target %d finished trials", settings.study.study_name,
             display_url(storage_url(settings.study)), settings.study.study_dir, describe_counts(state_counts(study)),
             settings.study.n_trials)
    limits = RunLimits.starting_now(settings.study.timeout, settings.study.trial_timeout)
    with noting_signals() as stops:
        failed_jobs = run_jobs(spec, limits)
        interrupted = stops.interrupted
    if interrupted:
        log.warning("interrupted: the running trials were marked interrupted and their parameters re-queued; run "
                    "the same command again to resume the study")
    timed_out = not interrupted and limits.passed()
    if timed_out:
        log.warning("--timeout %g s reached: trials still running were stopped, each scored by its best validated "
                    "epoch (one without a validation yet was re-queued); run the same command again to go on with "
                    "the study", settings.study.timeout)
    return study, {**write_report(study, spec), "interrupted": interrupted, "timed_out": timed_out,
                   "failed_jobs": failed_jobs}


# The name a tuning file given as a mapping goes by in messages (and its study, without a study_name).
DICT_SOURCE = "tune.yaml (the config dict)"


def tune_from_file(path: str | dict[str, Any], values: dict[str, Any]
                   ) -> tuple[optuna.Study, TuneSpec, dict[str, Any]]:
    """`yt8m tune --config PATH` with flag values `values` (the `tune:` settings and RunFlags, by flag name): the
    study, the tuning file as run, and the summary; a ChildProcessError where a job died, a ValueError where no trial
    completed (the reasons are in the study's leaderboard). `path` may be the file's sections as a mapping."""
    overrides = {name: value for name, value in values.items() if name in flag_names(TuneSettings)}
    unknown = sorted(set(values) - set(overrides) - set(flag_names(RunFlags)))
    if unknown:
        raise ValueError(f"unknown tune setting(s) {', '.join(unknown)} (settings: "
                         f"{', '.join([*flag_names(TuneSettings), *flag_names(RunFlags)])})")
    flags = config_from_dict(RunFlags, {name: value for name, value in values.items()
                                        if name in flag_names(RunFlags)}, source="flags")
    read = load_tune_spec(path, overrides) if isinstance(path, str) else load_tune_spec(DICT_SOURCE, overrides, path)
    spec = with_data_patterns(read, flags.train_data_pattern, flags.eval_data_pattern)
    study, summary = run_tune(spec)
    return study, spec, summary


def raise_failures(summary: dict[str, Any]) -> None:
    """The one-line error of a study run whose jobs died, or in which no trial completed."""
    if summary["failed_jobs"]:
        raise ChildProcessError(f"{', '.join(summary['failed_jobs'])} died; the other jobs carried on, and a dead "
                                "job's trial is re-queued as interrupted: run the same command again to finish the "
                                "study")
    if summary["best_value"] is None:
        raise ValueError(f"no trial completed ({describe_counts(summary['n_trials'])}): the reasons are in "
                         f"{os.path.join(summary['study_dir'], LEADERBOARD_TXT)}")


def _check_data(spec: TuneSpec) -> None:
    """Fail before the first trial when a data pattern matches nothing, instead of failing every trial."""
    expand_pattern(spec.train.data.train_data_pattern)
    expand_pattern(spec.eval_data_pattern)


def with_data_patterns(spec: TuneSpec, train_pattern: str, eval_pattern: str) -> TuneSpec:
    """The tuning file with its data patterns replaced where given (`yt8m tune --train_data_pattern`,
    `--eval_data_pattern`), in the copy written to the study dir too. The patterns are part of the study's identity:
    a study made on other data is not resumed with these."""
    if not train_pattern and not eval_pattern:
        return spec
    flags = " and ".join(name for name, given in (("--train_data_pattern", train_pattern),
                                                  ("--eval_data_pattern", eval_pattern)) if given)
    train_pattern = train_pattern or spec.train.data.train_data_pattern
    eval_pattern = eval_pattern or spec.eval_data_pattern
    train = with_values(spec.train, train_data_pattern=train_pattern, eval_data_pattern=eval_pattern)
    document = {**spec.document, "train": {**(spec.document.get("train") or {}), "train_data_pattern": train_pattern,
                                           "eval_data_pattern": eval_pattern}}
    return dataclasses.replace(spec, train=train, fixed={**spec.fixed, "train_data_pattern": train_pattern},
                               document=document, source=f"{spec.source} with {flags}")


def write_study_file(spec: TuneSpec, path: str) -> None:
    """The tuning file with its settings resolved (password hidden): what `yt8m tune-report DIR` reads."""
    study = spec.settings.study
    resolved = dataclasses.replace(study, study_dir=os.path.abspath(study.study_dir),
                                   storage=display_url(study.storage) if study.storage else "")
    settings = config_values(dataclasses.replace(spec.settings, study=resolved))
    document = {**spec.document, "tune": {**settings, "enqueue": spec.enqueue}}
    write_file_atomically(path, lambda out: yaml.safe_dump(document, out, sort_keys=False))


RESOURCE_TRACKER_WARNING = "ignore:resource_tracker:UserWarning"


def run_jobs(spec: TuneSpec, limits: RunLimits) -> list[str]:
    """One job runs in this process; J jobs run in J spawned processes (torch is not fork- or thread-safe). Returns
    the jobs that died (an error, a signal), each described; the others go on with the study meanwhile."""
    per_trial = spec.settings.study.gpus_per_trial
    n_jobs = job_count(spec.settings.study.n_jobs, per_trial, announce=True)
    if n_jobs == 1:
        run_worker(spec, limits)
        return []
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # A job process importing the main script again, which starts the study again: one line, not a traceback.
        raise SystemExit("a tune job process started the study again while importing the main script: put the "
                         'tuning call under `if __name__ == "__main__":`')
    # A job killed by a signal leaves its semaphores to the resource tracker, which frees them and warns so at exit,
    # after the command's one error line: the tracker takes this process's -W options when it starts.
    if RESOURCE_TRACKER_WARNING not in sys.warnoptions:
        sys.warnoptions.append(RESOURCE_TRACKER_WARNING)
    context = multiprocessing.get_context("spawn")
    gpus = visible_gpus()
    workers = [context.Process(target=_job_process, name=f"tune-job-{index}",
                               args=(spec, limits, os.getpid(), n_jobs, job_devices(index, per_trial, gpus)))
               for index in range(n_jobs)]
    for worker in workers:
        if not STOPS.interrupted:
            worker.start()
    while any(worker.is_alive() for worker in workers if worker.pid is not None) and not STOPS.interrupted:
        for worker in workers:
            if worker.pid is not None:
                worker.join(JOIN_POLL_SECS)
    if STOPS.interrupted:
        # Ctrl+C reached the jobs too (one process group), a SIGTERM only this process: pass it on, let each job
        # mark its trial interrupted, and kill one that does not end within the grace.
        stop_jobs([worker for worker in workers if worker.pid is not None])
        return []
    return [f"{worker.name} ({_exit_description(worker.exitcode)})" for worker in workers if worker.exitcode != 0]


def _exit_description(exitcode: Optional[int]) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


def run_worker(spec: TuneSpec, limits: RunLimits) -> None:
    """Run trials one at a time until the study's budget is met or --timeout passes (which also stops the trial
    running then); after each, rewrite the leaderboard and best.yaml (the plots, slower, are drawn at the end). While
    other processes' running trials hold the rest of the budget, wait for them: one may be interrupted."""
    settings = spec.settings
    storage = open_storage(settings.study)
    study = open_study(spec, storage)
    lock = TrialStartLock(os.path.join(settings.study.study_dir, ".budget.lock"))
    budget = study_budget(study, spec)
    processes = settings.study.gpus_per_trial
    training = functools.partial(train_across_processes, processes=processes) if processes > 1 else None
    objective = TrialObjective(spec, lock, limits, budget.rungs if budget else (), training)
    quiet_trial_logs()

    def after_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        remove_checkpoints_beyond_best(study, settings.study.study_dir, settings.study.keep_best)
        write_leaderboard_and_best(study, spec)

    waited_for: set[int] = set()
    while not limits.passed() and not STOPS.interrupted:
        with lock.held():
            # The study dir's own SQLite file: every job of the study runs on this machine and takes this lock.
            recover_interrupted(study, storage, jobs_here_only=not settings.study.storage)
            budget_taken = trials_to_start(study, settings.study.n_trials) <= 0
            if not budget_taken:
                try:
                    study.optimize(objective, n_trials=1, catch=(Exception,), callbacks=[after_trial])
                except TrialInterrupted:
                    return  # its record re-queues it; the run ends (an interrupt) or its --timeout has passed
        if budget_taken and not wait_for_running_trials(study, settings.study.heartbeat_seconds, limits, waited_for):
            return


def wait_for_running_trials(study: optuna.Study, heartbeat_seconds: int, limits: RunLimits,
                            waited_for: set[int]) -> bool:
    """The budget is taken, but by trials still running in other processes (jobs, machines): wait a poll, since one
    of them may be interrupted (its process killed, its machine lost) and its parameters re-queued, to be run here.
    False, at once, when no trial runs: the study is done. `waited_for`: the trials named in the last log line."""
    running = {trial.number for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
    if not running:
        return False
    if running != waited_for:
        log.info("the study's --n_trials are all taken; waiting for trial(s) %s, running in other processes: one "
                 "that is interrupted is re-queued and run here", ", ".join(map(str, sorted(running))))
        waited_for.clear()
        waited_for.update(running)
    deadline = time.monotonic() + min(heartbeat_seconds, OTHERS_POLL_SECS)
    while time.monotonic() < deadline and not limits.passed() and not STOPS.interrupted:
        time.sleep(JOIN_POLL_SECS)
    return True


def quiet_trial_logs() -> None:
    """Keep Optuna from logging a trial stopped by Ctrl+C, SIGTERM or --timeout (TrialInterrupted) as a failure with
    its traceback (some 45 lines): the trial is re-queued, and the runner says so in one line. A trial failed by the
    user's error (bad data, a metric giving nan: as the CLI sees them) keeps Optuna's one warning line, without it."""
    optimize_log = logging.getLogger("optuna.study._optimize")
    if not any(isinstance(existing, _TrialLogFilter) for existing in optimize_log.filters):
        optimize_log.addFilter(_TrialLogFilter())


# What fails a trial as the user's error, named in Optuna's warning and the leaderboard's note: a traceback of
# yt8m's frames says nothing more (the CLI's user errors, and a trial's own failure).
TRIAL_USER_ERRORS = (ValueError, OSError, TrialFailure)


class _TrialLogFilter(logging.Filter):
    """Drops Optuna's two warnings about a trial whose objective raised KeyboardInterrupt (the one with the
    traceback, and the 'failed with value None' that follows it), and the traceback of a user's error."""

    def __init__(self) -> None:
        super().__init__()
        self._after_interrupt = False

    def filter(self, record: logging.LogRecord) -> bool:
        raised = record.exc_info[0] if record.exc_info else None
        if raised and issubclass(raised, TrialInterrupted):
            self._after_interrupt = True
            return False
        if self._after_interrupt and "failed with value" in record.getMessage():
            self._after_interrupt = False
            return False
        if raised and issubclass(raised, TRIAL_USER_ERRORS):
            record.exc_info = record.exc_text = None
        return True


def _job_process(spec: TuneSpec, limits: RunLimits, parent_pid: int, n_jobs: int, devices: Optional[str]) -> None:
    """A spawned job, one of `n_jobs`: sees only its own GPUs (`devices`), dies with the tune process, takes its share
    of the cores, stops its trial between steps on SIGTERM as on Ctrl+C (the trial is marked interrupted and
    re-queued; a second signal, e.g. the parent passing the same Ctrl+C on, is ignored), then runs trials until the
    budget is met or --timeout passes."""
    use_job_devices(devices)  # before anything initializes CUDA
    STOPS.on_signal = note_interrupt  # the watchdog ends the job should its trial not stop within the grace
    with noting_signals(again="ignore"):
        if not _parent_alive(parent_pid):
            return
        # The death signal can be lost: the watchdog ends this job anyway, after a grace.
        watch_over_job(parent_pid, EXIT_INTERRUPTED)
        configure_training_process()  # a spawned process starts afresh (its environment is the parent's)
        setup_logging()
        # J jobs share the machine's cores instead of each starting one thread per core, and its memory: each
        # trial's readers and RAM cache get their share.
        torch.set_num_threads(max(1, available_cpus() // n_jobs))
        share_machine_among(n_jobs)
        run_worker(spec, limits)


def _parent_alive(parent_pid: int) -> bool:
    """Have Linux send this job SIGTERM when the tune process dies, even by SIGKILL: an orphaned job would go on
    training a trial that the next run re-queues as interrupted, and write best.yaml behind its back. Elsewhere
    (no prctl) the job only checks the parent at its start. False where the parent is gone already."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed (%s): this job outlives a killed tune process",
                        os.strerror(ctypes.get_errno()))
    # The parent may have died before the prctl, and the job then belongs to another process already.
    return os.getppid() == parent_pid

"""Running a study: create or resume it, run trials in this process or J spawned job processes (which die with
it) until it has --n_trials finished trials, then write the report; Ctrl+C and SIGTERM re-queue running trials."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import time
from typing import Any, Iterator, Optional

import optuna
import torch
import yaml

from yt8m.io.files import write_file_atomically
from yt8m.tune.objective import TrialObjective, remove_checkpoints_beyond_best
from yt8m.tune.report import write_leaderboard_and_best, write_report
from yt8m.tune.space import TuneSpec
from yt8m.data.tfrecord import expand_pattern
from yt8m.process_settings import configure_training_process
from yt8m.runtime import available_cpus, setup_logging
from yt8m.tune.study import (
    STUDY_FILE,
    FileLock,
    display_url,
    open_storage,
    open_study,
    recover_interrupted,
    state_counts,
    storage_url,
    trials_to_start,
)

log = logging.getLogger("yt8m.tune")

# prctl(2) option: the signal the calling process receives when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1
# Exit status of a process whose interrupt was lost in a finalizer (128 + SIGINT, as after Ctrl+C).
EXIT_INTERRUPTED = 130


def run_tune(spec: TuneSpec) -> tuple[optuna.Study, dict[str, Any]]:
    """Create or resume the study, run trials until it has --n_trials, write the report; returns the study and
    the summary. On Ctrl+C (or SIGTERM) the running trials are re-queued and the report is still written."""
    _check_data(spec)
    settings = spec.settings
    os.makedirs(settings.study_dir, exist_ok=True)
    study = open_study(spec, open_storage(settings))
    write_study_file(spec, os.path.join(settings.study_dir, STUDY_FILE))
    log.info("study '%s' in %s (%s): %s; target %d finished trials", settings.study_name,
             display_url(storage_url(settings)), settings.study_dir, state_counts(study), settings.n_trials)
    deadline = time.time() + settings.timeout if settings.timeout else None
    interrupted, failed_jobs = False, []
    try:
        with _ending_on_lost_interrupt():
            failed_jobs = run_jobs(spec, deadline)
    except KeyboardInterrupt:
        interrupted = True
        log.warning("interrupted: the running trials were marked FAILED and re-queued; run the same command "
                    "again to resume the study")
    return study, {**write_report(study, spec), "interrupted": interrupted, "failed_jobs": failed_jobs}


def _check_data(spec: TuneSpec) -> None:
    """Fail before the first trial when a data pattern matches nothing, instead of failing every trial."""
    expand_pattern(spec.train["train_data_pattern"])
    expand_pattern(spec.eval_data_pattern)


def write_study_file(spec: TuneSpec, path: str) -> None:
    """The tuning file with its settings resolved (password hidden): what `yt8m tune-report DIR` reads."""
    settings = dataclasses.asdict(spec.settings)
    settings["study_dir"] = os.path.abspath(settings["study_dir"])
    settings["storage"] = display_url(settings["storage"]) if settings["storage"] else ""
    document = {**spec.document, "tune": {**settings, "enqueue": spec.enqueue}}
    write_file_atomically(path, lambda out: yaml.safe_dump(document, out, sort_keys=False))


def run_jobs(spec: TuneSpec, deadline: Optional[float]) -> list[str]:
    """One job runs in this process; J jobs run in J spawned processes (torch is not fork- or thread-safe). Returns
    the jobs that died (an error, a signal), each described; the others go on with the study meanwhile."""
    n_jobs = spec.settings.n_jobs
    if n_jobs == 1:
        run_worker(spec, deadline)
        return []
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_job_process, args=(spec, deadline, os.getpid()), name=f"tune-job-{index}")
               for index in range(n_jobs)]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.join()
    except KeyboardInterrupt:
        # Ctrl+C reached the jobs too (one process group), a SIGTERM only this process: pass it on, then let
        # each job mark its trial interrupted.
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join()
        raise
    return [f"{worker.name} ({_exit_description(worker.exitcode)})" for worker in workers if worker.exitcode != 0]


def _exit_description(exitcode: int) -> str:
    if exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


def run_worker(spec: TuneSpec, deadline: Optional[float]) -> None:
    """Run trials one at a time until the study's budget is met or the deadline passes; after each, rewrite the
    leaderboard and best.yaml (the plots, slower, are drawn at the end)."""
    settings = spec.settings
    storage = open_storage(settings)
    study = open_study(spec, storage)
    lock = FileLock(os.path.join(settings.study_dir, ".budget.lock"))
    objective = TrialObjective(spec, lock)

    def after_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        remove_checkpoints_beyond_best(study, settings.study_dir, settings.keep_best)
        write_leaderboard_and_best(study, spec)

    while deadline is None or time.time() < deadline:
        with lock.held():
            recover_interrupted(study, storage)
            if trials_to_start(study, settings.n_trials) <= 0:
                return
            study.optimize(objective, n_trials=1, catch=(Exception,), callbacks=[after_trial])
    log.info("--timeout reached: no new trial started")


def _job_process(spec: TuneSpec, deadline: Optional[float], parent_pid: int) -> None:
    """A spawned job: dies with the tune process, takes its share of the cores, handles SIGTERM like Ctrl+C
    (its trial is marked interrupted and re-queued), then runs trials until the budget is met."""
    signal.signal(signal.SIGINT, interrupt_once)
    signal.signal(signal.SIGTERM, interrupt_once)
    try:
        _die_with_parent(parent_pid)
        configure_training_process()  # a spawned process starts afresh (its environment is the parent's)
        setup_logging()
        # J jobs share the machine's cores instead of each starting one thread per core.
        torch.set_num_threads(max(1, available_cpus() // spec.settings.n_jobs))
        with _ending_on_lost_interrupt():
            run_worker(spec, deadline)
    except KeyboardInterrupt:
        pass  # the parent writes the report (or, if it was killed, the next run does)


def _die_with_parent(parent_pid: int) -> None:
    """Have Linux send this job SIGTERM when the tune process dies, even by SIGKILL: an orphaned job would go on
    training a trial that the next run re-queues as interrupted, and write best.yaml behind its back. Elsewhere
    (no prctl) the job only checks the parent at its start."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed (%s): this job outlives a killed tune process",
                        os.strerror(ctypes.get_errno()))
    # The parent may have died before the prctl, and the job then belongs to another process already.
    if os.getppid() != parent_pid:
        raise KeyboardInterrupt("the tune process is gone")


@contextlib.contextmanager
def _ending_on_lost_interrupt() -> Iterator[None]:
    """Python only prints an exception raised while it runs a finalizer (a weakref callback, __del__), and a
    signal's KeyboardInterrupt lands there often (here in half the SIGTERMs of a dying parent): the process would
    go on training, deaf to further signals. End it at once instead, as a kill would; the next run recovers its
    trial as interrupted."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        previous(unraisable)
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            os._exit(EXIT_INTERRUPTED)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def interrupt_once(signum: int, frame: Any) -> None:
    """SIGTERM (and in jobs SIGINT) as KeyboardInterrupt, once: a second signal, e.g. the parent passing
    the same Ctrl+C on, must not break off the recording of the interrupted trial."""
    for name in ("SIGINT", "SIGTERM"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

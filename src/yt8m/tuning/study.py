"""The Optuna side of `yt8m tune`: storage, sampler and pruner, resuming a study, its trial budget, and
interrupted trials, which are marked FAILED and re-queued so that a killed run loses no parameter set.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import re
import socket
import time
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence, TextIO

import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from yt8m.tuning.budget import study_budget
from yt8m.tuning.space import PruningSettings, SamplingSettings, StudySettings, TuneSpec

log = logging.getLogger("yt8m.tune")

# The tuning file with resolved settings, written into the study dir for `yt8m tune-report DIR`.
STUDY_FILE = "tune.yaml"
# SQLite waits this long for another process's write lock instead of failing with "database is locked".
SQLITE_BUSY_TIMEOUT_SECONDS = 300
# Opening a new database: attempts at creating its tables when other processes create them too.
SCHEMA_ATTEMPTS = 4
# A running trial whose heartbeat is older than this many heartbeat intervals is taken as interrupted.
HEARTBEAT_GRACE_INTERVALS = 4
# An interrupted parameter set is re-queued at most this many times, counted over the study's history (a
# config that kills its process every time must not loop forever).
MAX_RETRIES = 2

# Trial user attributes.
WORKER_ATTR = "worker"  # {"host", "pid", "start"}: the process running the trial
RETRY_OF_ATTR = "retry_of"  # the number of the interrupted trial whose parameters this one re-runs
RETRIES_ATTR = "retries"  # how many times its parameters had been interrupted when it was queued
FAIL_REASON_ATTR = "fail_reason"
# Study user attributes.
SPEC_ATTR = "tune_spec"
INTERRUPTED_PREFIX = "interrupted_trial_"  # + number -> why it was taken as interrupted
UNCLAIMED_PREFIX = "unclaimed_trial_"  # + number -> when it was first seen RUNNING with no worker


def storage_url(study: StudySettings) -> str:
    if study.storage:
        return with_installed_driver(study.storage)
    return f"sqlite:///{os.path.abspath(os.path.join(study.study_dir, 'study.db'))}"


def with_installed_driver(url: str) -> str:
    """postgresql://... names no driver and SQLAlchemy 2.1 then wants psycopg 3; use psycopg2 when only it is
    installed (the package's `postgres` extra)."""
    parsed = _parse_url(url)
    if parsed.drivername != "postgresql" or importlib.util.find_spec("psycopg") is not None:
        return url
    if importlib.util.find_spec("psycopg2") is None:
        raise ValueError(f"--storage {display_url(url)} needs a PostgreSQL driver: pip install 'yt8m[postgres]'")
    return parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)


def _parse_url(url: str) -> sqlalchemy.engine.URL:
    try:
        return sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError as err:
        raise ValueError(f"--storage {display_url(url)} is not a database URL (e.g. sqlite:///study.db or "
                         f"postgresql://user:password@host/database)") from err


def display_url(url: str) -> str:
    """The storage URL with any password hidden, for logs, errors and the files written in the study dir."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)


def open_storage(study: StudySettings) -> optuna.storages.RDBStorage:
    """The study's database; a ValueError naming it (password hidden) when it cannot be reached or is not supported."""
    url = storage_url(study)
    # Errors name the URL as given (password hidden), not as completed with a driver.
    where = f"cannot open the study database {display_url(study.storage or url)}"
    _check_connection(url, where)
    try:
        return _rdb_storage_after_races(url, study.heartbeat_seconds)
    except (sqlalchemy.exc.SQLAlchemyError, RuntimeError) as err:
        # RuntimeError: Optuna's own, e.g. a database made by an incompatible Optuna version.
        raise ValueError(f"{where}: {_reason(err)}") from err


def _rdb_storage_after_races(url: str, heartbeat_seconds: int) -> optuna.storages.RDBStorage:
    for attempt in range(1, SCHEMA_ATTEMPTS):
        try:
            return _rdb_storage(url, heartbeat_seconds)
        except sqlalchemy.exc.DatabaseError as err:
            # Processes starting together on a new database race to create its tables; the loser retries.
            log.info("creating the tables of %s raced with another process (%s); retrying",
                     display_url(url), type(err.orig).__name__)
            time.sleep(attempt)
    return _rdb_storage(url, heartbeat_seconds)


def _check_connection(url: str, where: str) -> None:
    """Connect once, so that an unreachable server, an unknown URL scheme or a missing driver is one clear error
    (and not retried as a race on creating the tables)."""
    try:
        engine = sqlalchemy.create_engine(url, **_engine_kwargs(url))
    except sqlalchemy.exc.NoSuchModuleError as err:
        raise ValueError(f"{where}: SQLAlchemy knows no database '{_parse_url(url).drivername}' (use "
                         f"sqlite:///PATH, or postgresql://... with the `postgres` extra)") from err
    except ImportError as err:
        raise ValueError(f"{where}: its database driver is not installed ({err})") from err
    except sqlalchemy.exc.ArgumentError as err:
        raise ValueError(f"{where}: {_reason(err)}") from err
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.SQLAlchemyError as err:
        raise ValueError(f"{where}: {_reason(err)}") from err
    finally:
        engine.dispose()


def _reason(err: Exception) -> str:
    """The driver's message on one line, without SQLAlchemy's background link."""
    message = str(getattr(err, "orig", None) or err).split("(Background on this error")[0]
    return "; ".join(" ".join(line.split()) for line in message.splitlines() if line.strip())


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_SECONDS}}
    # Server connections idle for a whole trial may have been dropped; test them before use.
    return {"pool_pre_ping": True}


def _rdb_storage(url: str, heartbeat_seconds: int) -> optuna.storages.RDBStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url), heartbeat_interval=heartbeat_seconds,
                                          grace_period=HEARTBEAT_GRACE_INTERVALS * heartbeat_seconds,
                                          heartbeat_stale_trial_callback=_requeue_stale_trial)


def trial_seed(seed: int, trial_number: int) -> int:
    """The sampler's seed for one trial: numbers are unique in a study, so each trial (of a resumed run, of
    another job or machine) draws its own points, and the same history gives the same points."""
    digest = hashlib.sha256(f"{seed}:{trial_number}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


class PerTrialSeedSampler(optuna.samplers.BaseSampler):
    """Runs a sampler built afresh for each trial, seeded from (--seed, the trial's number).

    Optuna calls `before_trial` when it creates the trial, before any relative (multivariate TPE) or independent
    sampling, so every draw of the trial comes from its own seed and the study's history.
    """

    def __init__(self, build: Callable[[int], optuna.samplers.BaseSampler], seed: int) -> None:
        self._build = build
        self._seed = seed
        self._sampler = build(trial_seed(seed, 0))

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._sampler = self._build(trial_seed(self._seed, trial.number))
        self._sampler.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._sampler.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self._sampler.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._sampler.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Optional[Sequence[float]]) -> None:
        self._sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._sampler.reseed_rng()


def create_sampler(sampling: SamplingSettings) -> optuna.samplers.BaseSampler:
    return PerTrialSeedSampler(lambda seed: _seeded_sampler(sampling, seed), sampling.seed)


def _seeded_sampler(sampling: SamplingSettings, seed: int) -> optuna.samplers.BaseSampler:
    if sampling.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # group=True: `when` makes the space conditional, which plain multivariate TPE handles poorly.
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=sampling.n_startup_trials,
                                          multivariate=True, group=True, constant_liar=True)


def create_pruner(pruning: PruningSettings, num_epochs: Optional[int],
                  rungs: tuple[int, ...] = ()) -> optuna.pruners.BasePruner:
    """`num_epochs`: every trial's epoch count (None when searched), Hyperband's full budget in epoch mode. `rungs`:
    with --resource examples, the example counts trials report at (each --reduction_factor times the one before),
    successive halving's and Hyperband's rungs."""
    if pruning.pruner == "median":
        # By default from the first complete trial on (not after TPE's n_startup_trials): a slow, poor trial dies at
        # its first report instead of running to the end while the study warms up.
        warmup = pruning.n_warmup_steps
        if rungs:  # counted in rungs: no pruning below the rung that many up
            warmup = rungs[warmup] if warmup < len(rungs) else rungs[-1] + 1
        return optuna.pruners.MedianPruner(n_startup_trials=pruning.pruner_startup_trials, n_warmup_steps=warmup)
    if pruning.pruner == "successive_halving":
        if rungs:
            return optuna.pruners.SuccessiveHalvingPruner(min_resource=rungs[0],
                                                          reduction_factor=pruning.reduction_factor)
        return optuna.pruners.SuccessiveHalvingPruner()
    if pruning.pruner == "hyperband":
        if rungs:
            return optuna.pruners.HyperbandPruner(min_resource=rungs[0], max_resource=rungs[-1],
                                                  reduction_factor=pruning.reduction_factor)
        max_resource = num_epochs if num_epochs and pruning.report_every_steps == 0 else "auto"
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_resource)
    return optuna.pruners.NopPruner()


def open_study(spec: TuneSpec, storage: optuna.storages.RDBStorage) -> optuna.Study:
    """Create the study or resume it; refuses to resume one made with another space, objective or train set."""
    settings = spec.settings
    searched = {param.name for param in spec.search}
    num_epochs = None if "num_epochs" in searched else spec.train.schedule.num_epochs
    study = optuna.create_study(storage=storage, study_name=settings.study.study_name,
                                direction=optuna.study.StudyDirection[spec.direction.upper()],
                                sampler=create_sampler(settings.sampling), load_if_exists=True)
    saved = study.user_attrs.get(SPEC_ATTR)
    if saved is None:
        study.set_user_attr(SPEC_ATTR, spec.identity())
        for params in spec.enqueue:
            study.enqueue_trial(params, skip_if_exists=True)
    elif saved != spec.identity():
        raise ValueError(
            f"study '{settings.study.study_name}' in {display_url(storage_url(settings.study))} was created from a "
            f"different train:, search: or objective: section than {spec.source}; resuming it would mix incomparable "
            f"trials. Restore the original file, or start another study with --study_name or --study_dir.")
    budget = study_budget(study, spec)
    study.pruner = create_pruner(settings.pruning, num_epochs, budget.rungs if budget else ())
    return study


def load_existing_study(study: StudySettings) -> optuna.Study:
    """An existing study, for reports; a clear error when there is none."""
    storage = open_storage(study)
    names = optuna.study.get_all_study_names(storage)
    if study.study_name not in names:
        raise ValueError(f"no study '{study.study_name}' in {display_url(storage_url(study))} "
                         f"(studies there: {', '.join(names) or 'none'})")
    return optuna.load_study(study_name=study.study_name, storage=storage)


def interrupted_trials(study: optuna.Study) -> dict[int, str]:
    """Trial number -> why it was taken as interrupted; such trials do not count toward --n_trials."""
    return {int(key[len(INTERRUPTED_PREFIX):]): reason for key, reason in study.user_attrs.items()
            if key.startswith(INTERRUPTED_PREFIX)}


def budget_used(study: optuna.Study, before: Optional[int] = None) -> int:
    """The trials that use up --n_trials (with `before`, those numbered lower): running ones, and finished ones
    (complete, pruned, or failed by their own error). Counted from one read of the trials: with two, a trial
    of another job finishing in between would count once as running and once as finished."""
    skipped = interrupted_trials(study)
    return sum(1 for trial in study.get_trials(deepcopy=False)
               if (before is None or trial.number < before) and _uses_budget(trial, skipped))


def _uses_budget(trial: FrozenTrial, interrupted: dict[int, str]) -> bool:
    if trial.state == TrialState.RUNNING:
        return True
    return trial.state.is_finished() and trial.number not in interrupted


def trials_to_start(study: optuna.Study, n_trials: int) -> int:
    return n_trials - budget_used(study)


def state_counts(study: optuna.Study) -> dict[str, int]:
    """Trials by state; `interrupted` ones (killed, or surplus of a parallel race) are not in `fail`."""
    skipped = interrupted_trials(study)
    counts = {"complete": 0, "pruned": 0, "fail": 0, "interrupted": 0, "running": 0, "waiting": 0}
    for trial in study.get_trials(deepcopy=False):
        key = "interrupted" if trial.number in skipped else trial.state.name.lower()
        counts[key] += 1
    return counts


def describe_counts(counts: dict[str, int]) -> str:
    """Trial counts as a person reads them: '4 complete, 1 pruned, 1 failed' (states without trials left out)."""
    words = {"fail": "failed"}
    return ", ".join(f"{count} {words.get(state, state)}" for state, count in counts.items() if count) or "no trials"


def worker_identity() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _process_start_ticks(pid)}


def _process_start_ticks(pid: int) -> Optional[int]:
    """When the process started (Linux clock ticks since boot): tells a live process from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            # The command name (field 2) may contain spaces; fields after its closing parenthesis are fixed.
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _is_gone(worker: dict[str, Any]) -> bool:
    """True when the worker ran on this host and its process no longer exists."""
    if worker.get("host") != socket.gethostname():
        return False
    pid = int(worker.get("pid", -1))
    if pid == os.getpid():
        return True  # this process runs no trial while it looks for interrupted ones
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    start = _process_start_ticks(pid)
    return start is not None and worker.get("start") is not None and start != worker["start"]


def recover_interrupted(study: optuna.Study, storage: optuna.storages.RDBStorage, jobs_here_only: bool) -> None:
    """Fail and re-queue the running trials whose process is gone: on this host at once, elsewhere by heartbeat.
    Also those that no process claimed (one was killed while it started them): at once when `jobs_here_only` says
    every job of the study takes this machine's start lock (held by the caller), else once unclaimed for the
    heartbeat grace, since a job of another machine may be starting one right now."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get(WORKER_ATTR)
        if worker:
            gone = _is_gone(worker)
            reason = f"interrupted: its process {worker['host']}:{worker['pid']} is gone (killed or crashed)"
        else:
            gone = jobs_here_only or _unclaimed_too_long(study, trial, storage.grace_period or 0)
            reason = "interrupted: its process ended while it started the trial, before saying whose it was"
        if gone and _fail_running_trial(storage, study, trial):
            record_interruption(study, trial, reason)


def _unclaimed_too_long(study: optuna.Study, trial: FrozenTrial, grace_seconds: float) -> bool:
    """True once the trial has been seen unclaimed for over `grace_seconds`; its first sighting is noted in the
    study (in seconds since the epoch, which all machines share, unlike the trial's own local start time)."""
    key = f"{UNCLAIMED_PREFIX}{trial.number}"
    first_seen = study.user_attrs.get(key)
    if first_seen is None:
        study.set_user_attr(key, time.time())
        return False
    return time.time() - first_seen > grace_seconds


def _fail_running_trial(storage: optuna.storages.RDBStorage, study: optuna.Study, trial: FrozenTrial) -> bool:
    """Mark FAILED; False when another process got there first (then it also re-queues the trial)."""
    study_id = storage.get_study_id_from_name(study.study_name)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
    try:
        return storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


def _requeue_stale_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    worker = trial.user_attrs.get(WORKER_ATTR, {})
    where = f" on {worker['host']}:{worker['pid']}" if worker else ""
    record_interruption(study, trial, f"interrupted: no heartbeat{where} for over "
                                      f"{HEARTBEAT_GRACE_INTERVALS} intervals (killed, or its machine was lost)")


def record_interruption(study: optuna.Study, trial: FrozenTrial, reason: str, level: int = logging.WARNING) -> None:
    """Note why the (already FAILED) trial was interrupted and queue its parameters again, unless the study's
    history already holds MAX_RETRIES + 1 interruptions of them (retries, or the same point sampled again); logged
    at `level` (a Ctrl+C's is said once for the whole run, by the runner)."""
    study.set_user_attr(f"{INTERRUPTED_PREFIX}{trial.number}", reason)
    params = parameter_set(trial)
    if not params:
        log.log(level, "trial %d %s before it sampled its parameters; a new trial takes its place", trial.number,
                reason)
        return
    interruptions = times_interrupted(study, params)
    if interruptions > MAX_RETRIES:
        log.warning("trial %d %s; marked FAILED, not re-queued: its parameters were interrupted %d times",
                    trial.number, reason, interruptions)
        return
    original = trial.user_attrs.get(RETRY_OF_ATTR, trial.number)
    study.enqueue_trial(params, user_attrs={RETRY_OF_ATTR: original, RETRIES_ATTR: interruptions})
    log.log(level, "trial %d %s; marked FAILED and its parameters re-queued as a new trial", trial.number, reason)


def parameter_set(trial: FrozenTrial) -> dict[str, Any]:
    """The trial's parameters: those it was queued with (a re-queued or a hand-given configuration, which an
    interrupt before sampling must not lose) and those it sampled."""
    return {**trial.system_attrs.get("fixed_params", {}), **trial.params}


def times_interrupted(study: optuna.Study, params: dict[str, Any]) -> int:
    """How many trials of the study with exactly these parameters were interrupted."""
    interrupted = interrupted_trials(study)
    return sum(1 for trial in study.get_trials(deepcopy=False)
               if trial.number in interrupted and parameter_set(trial) == params)


class FileLock:
    """An exclusive lock on a file (flock), held in a `with held()` block or until `release()`; the OS drops it
    when the process dies. Serializes this machine's jobs where they must take turns: starting a trial (under
    the budget), writing the report."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fh: Optional[TextIO] = None

    @contextlib.contextmanager
    def held(self) -> Iterator["FileLock"]:
        self._fh = open(self.path, "a")
        fcntl.flock(self._fh, fcntl.LOCK_EX)
        try:
            yield self
        finally:
            self.release()

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

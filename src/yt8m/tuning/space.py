"""The `yt8m tune` YAML: fixed `train:` fields, a `search:` space over them, the `objective:` and `tune:` settings.

Validation collects every problem in the file (and the flags) into one ValueError, so one pass fixes them all.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional, cast

import optuna

from yt8m.config import (
    ConfigError,
    component_sections,
    config_from_dict,
    config_settings,
    flag_type,
    flattened,
    hparam_type,
    load_named_components,
    load_yaml,
)
from yt8m.eval.metrics import HIGHER_IS_BETTER
from yt8m.fields import parse_list, setting
from yt8m.models.registry import hparam_fields
from yt8m.tasks.metrics import canonical_metric, higher_is_better, is_own_metric, metric_problem
from yt8m.tasks.spec import TaskConfig, TasksConfig, reads_segments, task_entries
from yt8m.tasks.video import metric_names
from yt8m.training.checks import train_config_problems
from yt8m.training.config import TrainConfig
from yt8m.tuning.devices import job_count_problem

SECTIONS = ("train", "search", "objective", "tune")
# Validation metrics `evaluate_model` returns, with the direction that makes a model better.
METRIC_DIRECTIONS = {name: "maximize" if higher else "minimize" for name, higher in HIGHER_IS_BETTER.items()}
DISTRIBUTION_KEYS = {"categorical": {"choices"}, "int": {"low", "high", "step", "log"},
                     "float": {"low", "high", "step", "log"}}
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "successive_halving", "hyperband", "none")
# What a trial's budget and its reports count: epochs, or training examples (rungs of an example budget).
RESOURCES = ("epochs", "examples")
# Set by `yt8m tune` for every trial, so a value in the file would silently lose.
TUNE_OWNED_FIELDS = ("train_dir", "start_new_model")
# The validation set; the file names it in `train:` beside the training set.
EVAL_PATTERN = "eval_data_pattern"
# A mapping of the model's hyper-parameters is not searched whole: each is searched by its own name.
HPARAMS_FLAG = "model_hparams"
# What trial configs are checked with before the study starts, in place of each trial's own directory.
PLACEHOLDER_TRAIN_DIR = "<study_dir>/trials/trial-<number>"
# A searched field of one task of `train.tasks`: tasks.TASK.FIELD, or tasks.TASK.head_hparams.HPARAM.
TASK_PREFIX = "tasks."
HEAD_HPARAMS = "head_hparams"
# The task fields a search may vary; the others say what the task is (its data, classes), which a study keeps.
SEARCHABLE_TASK_FIELDS = ("weight", "loss", "head_model", "metric")


def _samplers() -> tuple[str, ...]:
    return SAMPLERS


def _pruners() -> tuple[str, ...]:
    return PRUNERS


def _resources() -> tuple[str, ...]:
    return RESOURCES


@dataclass(frozen=True)
class StudySettings:
    """Where a study lives, how long it runs, and what it keeps."""

    study_dir: str = setting("", "Directory of the study: database, trials/, report, plots; empty: "
                                 "studies/<study_name>.")
    study_name: str = setting("", "Study name in the storage; empty: the config file's name without .yaml.")
    storage: str = setting("", "Optuna storage URL, e.g. postgresql://user@host/db; empty: "
                               "sqlite:///<study_dir>/study.db.")
    n_trials: int = setting(20, "The study's total of finished trials; re-running carries on to this total.",
                            at_least=1)
    timeout: Optional[float] = setting(None, "Start no new trial after this many seconds of this run.", above=0)
    trial_timeout: Optional[float] = setting(None, "Stop a trial that runs longer than this many seconds; it keeps "
                                                   "the value of its best validated epoch (None: no limit).", above=0)
    n_jobs: str = setting("1", "Trial processes run in parallel on this machine; auto: one per visible GPU (each "
                               "job its own, by CUDA_VISIBLE_DEVICES), and 1 without a GPU (measured: 2 jobs on 2 "
                               "cores gave 1.15x the trials an hour of 1).", check=job_count_problem)
    gpus_per_trial: int = setting(1, "GPUs of each trial: above 1, a trial trains as a torchrun job of this many "
                                     "processes (gloo on a machine without GPUs), and --n_jobs auto runs one job per "
                                     "this many visible GPUs.", at_least=1)
    keep_best: Optional[int] = setting(None, "Keep the checkpoints of the best K complete trials only (and of the "
                                              "K that `tune-report --diverse` takes); None keeps all.", at_least=0)
    heartbeat_seconds: int = setting(30, "Running trials record a heartbeat this often; one silent for 4 "
                                          "heartbeats is taken as interrupted.", at_least=1)


@dataclass(frozen=True)
class SamplingSettings:
    """How the next trial's values are chosen."""

    sampler: str = setting("tpe", f"Search algorithm: {', '.join(SAMPLERS)}.", choices=_samplers)
    seed: int = setting(0, "Seed of the sampler; each trial draws from (seed, its number), so resumed runs, "
                            "parallel jobs and machines sample different points, the same history the same ones.")
    n_startup_trials: int = setting(5, "Trials sampled at random before TPE models the results.", at_least=0)


@dataclass(frozen=True)
class PruningSettings:
    """When trials report, and which of them are stopped early."""

    pruner: str = setting("median", f"Early stopping of poor trials: {', '.join(PRUNERS)}.", choices=_pruners)
    resource: str = setting("epochs", "What a trial's budget and its reports count. epochs: it reports each epoch "
                                      "(or every --report_every_steps steps). examples: its budget is --num_epochs "
                                      "of the training set (sized from its shards), and it reports at --rungs counts "
                                      "of examples, each --reduction_factor times the one before (1/27, 1/9, 1/3 and "
                                      "1 of it by default: within the first epoch on a large set), where successive "
                                      "halving and Hyperband promote the best; it also validates at each epoch's end "
                                      "and keeps its best validation.", choices=_resources)
    rungs: int = setting(4, "--resource examples: the report points of a trial's budget.", at_least=2)
    reduction_factor: int = setting(3, "--resource examples: each rung this many times the one before; successive "
                                       "halving and Hyperband keep 1 in this many trials at each.", at_least=2)
    n_warmup_steps: int = setting(0, "Median pruner: never prune at a report step below this (epochs, or "
                                      "training steps with --report_every_steps; with --resource examples, "
                                      "rungs).", at_least=0)
    pruner_startup_trials: int = setting(1, "Median pruner: complete trials it waits for before it judges (1: from "
                                             "the first on; the median of one trial is that trial).", at_least=1)
    report_every_steps: int = setting(0, "Evaluate and report to the pruner every this many training steps "
                                          "(0: at each epoch end).", at_least=0)


@dataclass(frozen=True)
class TuneSettings:
    """The `tune:` section of the file, flat or by part; each field is also a `yt8m tune` flag, which wins over the
    file."""

    study: StudySettings = field(default_factory=StudySettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    pruning: PruningSettings = field(default_factory=PruningSettings)


@dataclass(frozen=True)
class Param:
    """One searched field: its distribution and the values of earlier fields it needs (`when`)."""

    name: str
    kind: str
    choices: tuple = ()
    low: Optional[float] = None
    high: Optional[float] = None
    step: Optional[float] = None
    log: bool = False
    when: tuple[tuple[str, tuple], ...] = ()

    def is_active(self, values: dict[str, Any]) -> bool:
        return all(name in values and values[name] in accepted for name, accepted in self.when)

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        low, high = self.bounds()
        if self.kind == "int":
            return trial.suggest_int(self.name, int(low), int(high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, low, high, step=self.step, log=self.log)

    def bounds(self) -> tuple[float, float]:
        """A range's (low, high); a categorical field has none."""
        if self.low is None or self.high is None:
            raise ValueError(f"search.{self.name}: a {self.kind} field has no range")
        return self.low, self.high

    def checked_values(self) -> tuple:
        """The values that stand for what a trial may get when trial configs are checked: every choice, or
        both ends of a range."""
        if self.kind == "categorical":
            return self.choices
        number = int if self.kind == "int" else float
        return tuple(map(number, self.bounds()))

    def admits(self, value: Any) -> bool:
        if self.kind == "categorical":
            return value in self.choices
        low, high = self.bounds()
        return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


@dataclass
class TuneSpec:
    """A validated tuning file: what every trial trains with (`train`, the train: section read by the one config
    reader into a TrainConfig, checked with every searched value before the first trial; `fixed`, the values it
    gives, the study's identity), what varies, and what is optimized."""

    source: str
    train: TrainConfig
    fixed: dict[str, Any]
    search: list[Param]
    metric: str
    direction: str
    settings: TuneSettings
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    document: dict[str, Any] = field(default_factory=dict)  # the file as read, for the copy in the study dir

    @property
    def eval_data_pattern(self) -> str:
        """The validation shards every trial is scored on."""
        return self.train.validation.eval_data_pattern

    def sample(self, trial: optuna.Trial) -> dict[str, Any]:
        """The trial's values of the active fields, suggested in sampling order (each field after the fields its
        `when` names) so `when` sees its inputs."""
        values: dict[str, Any] = {}
        for param in self.search:
            if param.is_active(values):
                values[param.name] = param.suggest(trial)
        return values

    def trial_config(self, params: dict[str, Any], train_dir: str, **overrides: Any) -> TrainConfig:
        """The config of a trial of these parameters in `train_dir`: the fixed fields with them over them, read by the
        config reader as `yt8m train` reads a file (a flat name goes to whichever chosen component declares it)."""
        values = {**self.fixed, EVAL_PATTERN: self.eval_data_pattern, **params, "train_dir": train_dir,
                  "start_new_model": True, **overrides}
        values = with_task_fields(values)
        load_named_components(TrainConfig, values)  # in a job process too: the flat names of one's own components
        return config_from_dict(TrainConfig, values, source=f"{self.source}: trial config")

    def __getstate__(self) -> dict[str, Any]:
        """What a spawned job receives: all but the typed train config, whose components' hyper-parameter classes
        may be made at run time (a plain module's own, read off its signature) and do not pickle; it is read again
        from the fixed fields (`__setstate__`)."""
        return {**{name: value for name, value in vars(self).items() if name != "train"},
                EVAL_PATTERN: self.eval_data_pattern}

    def __setstate__(self, state: dict[str, Any]) -> None:
        eval_pattern = state.pop(EVAL_PATTERN)
        vars(self).update(state)
        self.train = typed_train_config(self.source, self.fixed, eval_pattern)

    def identity(self) -> str:
        """What must not change when a study is resumed: the fixed fields, the space and the objective."""
        space = [dataclasses.asdict(param) for param in self.search]
        return json.dumps({"train": self.fixed, "eval_data_pattern": self.eval_data_pattern, "search": space,
                           "metric": self.metric, "direction": self.direction}, sort_keys=True, default=str)


def load_tune_spec(path: str, overrides: Optional[dict[str, Any]] = None,
                   document: Optional[dict[str, Any]] = None) -> TuneSpec:
    """Read and validate a tuning file; `overrides` (flags) replace `tune:` settings. One error lists all problems.
    `document`: the file's sections given as a mapping (the Python API's dict), `path` then naming it in messages
    and, without a study_name, the study."""
    document = load_yaml(path) if document is None else document
    problems = [f"{path}: unknown section '{name}' (sections: {', '.join(SECTIONS)})"
                for name in document if name not in SECTIONS]
    train_section, search_section = _section(path, document, "train", []), _section(path, document, "search", [])
    _load_named_components(train_section, search_section)
    candidates = candidates_of(flattened(TrainConfig, train_section), search_section)
    fixed, eval_pattern = _read_train(path, _section(path, document, "train", problems), problems, candidates)
    search, typed_by = _read_search(path, _section(path, document, "search", problems), fixed, problems, candidates)
    metric, direction = _read_objective(path, _section(path, document, "objective", problems), problems)
    known = len(problems)
    _check_objective_task(path, fixed, search, metric, problems)
    if len(problems) == known:  # an objective no trial reports is said once, not again as each trial's best metric
        fixed = _reporting(fixed, metric)
    tune_section = dict(_section(path, document, "tune", problems))
    raw_enqueue = tune_section.pop("enqueue", [])
    settings = _read_settings(path, {**tune_section, **(overrides or {})}, problems)
    enqueue = _read_enqueue(path, raw_enqueue, search, problems, typed_by)
    _check_report_schedule(path, settings, fixed, search, problems)
    # Trials validate on the study's shards: what needs validations (early stopping) is checked with them.
    _check_trial_configs(path, {**fixed, EVAL_PATTERN: eval_pattern}, search, settings, problems)
    if problems:
        raise ValueError(f"{path}: {len(problems)} problem(s) in the tuning config:\n  " + "\n  ".join(problems))
    name = settings.study.study_name or os.path.splitext(os.path.basename(path))[0]
    study = dataclasses.replace(settings.study, study_name=name,
                                study_dir=settings.study.study_dir or os.path.join("studies", name))
    return TuneSpec(path, typed_train_config(path, fixed, eval_pattern), fixed, search, metric, direction,
                    dataclasses.replace(settings, study=study), enqueue, document)


def typed_train_config(source: str, fixed: dict[str, Any], eval_pattern: str) -> TrainConfig:
    """The fixed fields (checked already) as a TrainConfig, the components they name by import path loaded."""
    values = {**fixed, EVAL_PATTERN: eval_pattern}
    load_named_components(TrainConfig, values)
    return config_from_dict(TrainConfig, values, f"{source}: train", check_values=False)


def _section(path: str, document: dict, name: str, problems: list[str]) -> dict:
    value = document.get(name) or {}
    if not isinstance(value, dict):
        problems.append(f"{path}: section '{name}' must be a mapping of field: value, got {type(value).__name__}")
        return {}
    return value


def _collect(problems: list[str], build, *args: Any) -> Any:
    """Run a config builder, adding the problems of its ConfigError to `problems`."""
    try:
        return build(*args)
    except ConfigError as err:
        problems.extend(err.problems)
        return None


def _load_named_components(train: dict, search: dict) -> None:
    """Import the components train: and the choices of search: name by import path, so that their
    hyper-parameters are fields a search can vary."""
    load_named_components(TrainConfig, train)
    for name, spec in search.items():
        choices = spec.get("choices") if isinstance(spec, dict) else None
        for choice in choices if isinstance(choices, list) else []:
            load_named_components(TrainConfig, {name: choice})


def _reporting(train: dict[str, Any], metric: str) -> dict[str, Any]:
    """The fixed fields with the objective as each trial's --best_metric (unless train: names one: the best export
    a trial keeps, which refits and ensembles read, is its best epoch's) and among the metrics it reports where the
    objective is a metric of one's own."""
    train = {"best_metric": metric, **train}
    plain = metric.rpartition("/")[2]
    if is_own_metric(plain):
        return train
    given = parse_list(train.get("metrics") or [], str)  # the comma form of _typed_values, or a list
    return {**train, "metrics": ",".join(dict.fromkeys([*map(canonical_metric, given), plain]))}


def _read_train(path: str, section: dict, problems: list[str], candidates: Candidates
                ) -> tuple[dict[str, Any], str]:
    values = flattened(TrainConfig, section)
    eval_pattern = str(values.pop(EVAL_PATTERN, "") or "")
    for name in TUNE_OWNED_FIELDS:
        if name in values:
            problems.append(f"{path}: train.{name} is set by yt8m tune for each trial "
                            f"(<study_dir>/trials/trial-<number>); remove it")
            values.pop(name)
    for name in [name for name in values if name.startswith(TASK_PREFIX)]:
        problems.append(f"{path}: train.{name}: a task's fixed fields go in its entry of train.tasks")
        values.pop(name)
    fixed = _typed_values(values, f"{path}: train", problems, candidates)
    if not fixed.get("train_data_pattern"):
        problems.append(f"{path}: train.train_data_pattern is required")
    if not eval_pattern:
        problems.append(f"{path}: train.{EVAL_PATTERN} is required (the validation shards trials are scored on)")
    return fixed, eval_pattern


def _typed_values(values: dict[str, Any], source: str, problems: list[str],
                  candidates: Optional["Candidates"] = None) -> dict[str, Any]:
    """The values converted to the types of their `yt8m train` fields (a component's hyper-parameter to the type the
    `candidates` components give it); unknown fields and ill-typed values are reported and left out. Types only: a
    value's range and its combination with other fields are checked on whole trial configs (`_check_trial_configs`),
    where the other fields have the values a trial gives them."""
    typed = {}
    for name, value in values.items():
        short = name.rsplit(".", 1)[-1]
        holder = _collect(problems, config_from_dict, _field_holder(name, searched_field_type(name, candidates)),
                          {short: value}, source)
        if holder is not None:
            value = getattr(holder, short)
            # Optuna's choices are plain values: a list field (feature_sizes) is searched in its comma form; the
            # tasks (a list of mappings) are never searched whole and stay as they are.
            plain_list = isinstance(value, list) and not any(isinstance(item, dict) for item in value)
            typed[name] = ",".join(map(str, value)) if plain_list else value
    return typed


@functools.lru_cache(maxsize=None)
def _field_holder(name: str, kind: Any) -> type:
    """A config class holding only the searchable field `name` (named by its last part) of type `kind` (no field
    where `kind` is None)."""
    fields = [(name.rsplit(".", 1)[-1], kind, None)] if kind is not None else []
    return dataclasses.make_dataclass("TrainField", fields)


@dataclass(frozen=True)
class Candidates:
    """The components a trial may train with, by section (model, loss): the train: section's and the choices its
    search gives them; a component's hyper-parameter is typed as the first of them that declares it."""

    by_section: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def restricted(self, section: str, names: tuple) -> "Candidates":
        """These candidates with `section`'s limited to `names` (a field searched `when` the model is one of them)."""
        return Candidates(tuple((key, tuple(map(str, names)) if key == section else chosen)
                                for key, chosen in self.by_section))

    def hparam_type(self, name: str) -> Optional[type]:
        """The type of hyper-parameter `name` (`SECTION.NAME`, or a flat NAME of any section's components)."""
        key, dot, short = name.partition(".")
        sections = component_sections(TrainConfig)
        for section_name, chosen in self.by_section:
            if dot and section_name != key:
                continue
            for component in chosen:
                kind = hparam_type(sections[section_name], component, short if dot else name)
                if kind is not None:
                    return kind
        return None


def searched_field_type(name: str, candidates: Optional[Candidates] = None) -> Optional[type]:
    """The type of a searchable field: a `yt8m train` field, a component's hyper-parameter (flat or `model.NAME`, as
    the `candidates` give it; default: any loaded component's), tasks.TASK.FIELD (a TaskConfig field) or
    tasks.TASK.head_hparams.HPARAM (a model hyper-parameter); None if not one."""
    if not name.startswith(TASK_PREFIX):
        return train_field_type(name, candidates)
    parts = name.split(".")
    if len(parts) == 3 and parts[2] in SEARCHABLE_TASK_FIELDS:
        return flag_type(TaskConfig, parts[2])
    if len(parts) == 4 and parts[2] == HEAD_HPARAMS:
        return _hparam_type(parts[3])
    return None


def train_field_type(name: str, candidates: Optional[Candidates] = None) -> Optional[type]:
    """The type of a `yt8m train` field or of a component's hyper-parameter (flat, or by its dotted name); None if
    neither."""
    if name == HPARAMS_FLAG:
        return None
    if name in config_settings(TrainConfig) or candidates is None:
        return flag_type(TrainConfig, name)
    return candidates.hparam_type(name) or flag_type(TrainConfig, name)


def _hparam_type(name: str) -> Optional[type]:
    """The type of a registered model's hyper-parameter (its `yt8m train` flag's); None if no model has one."""
    return next((kind for hparam, kind in hparam_fields() if hparam.name == name), None)


def candidates_of(train: dict[str, Any], search: dict[str, Any]) -> Candidates:
    """The components trials of this train: and search: may train with, by section."""
    found = []
    for key, section in component_sections(TrainConfig).items():
        flag = section.name_flag()
        chosen = [train.get(flag, train.get(f"{key}.{section.NAME}", section.default_component()))]
        spec = search.get(flag)
        if isinstance(spec, dict) and isinstance(spec.get("choices"), list):
            chosen += spec["choices"]
        found.append((key, tuple(dict.fromkeys(map(str, chosen)))))
    return Candidates(tuple(found))


def with_task_fields(values: dict[str, Any]) -> dict[str, Any]:
    """Config values with each tasks.TASK.FIELD value moved into TASK's entry of `tasks`."""
    task_values = {name: value for name, value in values.items() if name.startswith(TASK_PREFIX)}
    if not task_values:
        return values
    tasks = copy.deepcopy(list(values.get("tasks") or []))
    for name, value in task_values.items():
        _, task, *path = name.split(".")
        entry = next(entry for entry in tasks if entry.get("name") == task)
        if path[0] == HEAD_HPARAMS:
            entry[HEAD_HPARAMS] = {**(entry.get(HEAD_HPARAMS) or {}), path[1]: value}
        else:
            entry[path[0]] = value
    return {**{name: value for name, value in values.items() if name not in task_values}, "tasks": tasks}


def _task_field_problem(name: str, train: dict[str, Any]) -> Optional[str]:
    """Why tasks.TASK.FIELD cannot be searched, if it cannot."""
    names = [entry.get("name") for entry in train.get("tasks") or [] if isinstance(entry, dict)]
    parts = name.split(".")
    if len(parts) < 3 or parts[1] not in names:
        return (f"names no task of train.tasks (tasks there: {', '.join(map(str, names)) or 'none'}; "
                "a task's field is searched as tasks.TASK.FIELD)")
    if searched_field_type(name) is None:
        return (f"unknown task field (searchable: {', '.join(SEARCHABLE_TASK_FIELDS)}, "
                f"{HEAD_HPARAMS}.HPARAM with HPARAM a model hyper-parameter flag)")
    return None


def _read_search(path: str, section: dict, train: dict[str, Any], problems: list[str], candidates: Candidates
                 ) -> tuple[list[Param], dict[str, Candidates]]:
    """The searched fields in sampling order, and the components each may be searched with (its `when` may name
    the model): what types its values."""
    if not section:
        problems.append(f"{path}: section 'search' must name at least one field to search")
    params: list[Param] = []
    raw_when: dict[str, tuple[str, Any]] = {}
    typed_by: dict[str, Candidates] = {}
    for name, spec in section.items():
        where = f"{path}: search.{name}"
        own = typed_by[name] = _when_restricted(candidates, spec)
        if name.startswith(TASK_PREFIX):
            problem = _task_field_problem(name, train)
            if problem:
                problems.append(f"{where}: {problem}")
                continue
        elif train_field_type(name, own) is None:
            problems.append(f"{where}: unknown field (not a `yt8m train` field)")
            continue
        if name in TUNE_OWNED_FIELDS:
            problems.append(f"{where}: cannot be searched, yt8m tune sets it for each trial")
            continue
        if not isinstance(spec, dict):
            problems.append(f"{where}: expected a mapping like {{type: float, low: ..., high: ...}}, got {spec!r}")
            continue
        param = _read_param(where, name, spec, problems, own)
        if param is not None:
            params.append(param)
            raw_when[name] = (where, spec.get("when"))
    # `when` may name any searched field, above or below it: conditions are read once every field is known.
    by_name = {param.name: param for param in params}
    params = [dataclasses.replace(param, when=_read_when(*raw_when[param.name], by_name, problems, typed_by))
              for param in params]
    return _sampling_order(path, params, problems), typed_by


def _when_restricted(candidates: Candidates, spec: Any) -> Candidates:
    """The candidates of a field searched `when` a component section's name (model, label_loss) has given values."""
    when = spec.get("when") if isinstance(spec, dict) else None
    for key, section in component_sections(TrainConfig).items():
        if isinstance(when, dict) and section.name_flag() in when:
            wanted = when[section.name_flag()]
            candidates = candidates.restricted(key, tuple(wanted) if isinstance(wanted, list) else (wanted,))
    return candidates


def _sampling_order(path: str, params: list[Param], problems: list[str]) -> list[Param]:
    """The fields in the order trials sample them: file order, except that each field waits for the fields its
    `when` names (a stable topological sort, so a file in that order keeps it and a file samples the same way
    every time). A cycle of `when` conditions is a problem naming its fields; each cycle is reported once."""
    ordered: list[Param] = []
    placed: set[str] = set()
    pending = list(params)
    while pending:
        ready = next((param for param in pending if all(name in placed for name, _ in param.when)), None)
        if ready is None:
            cycle = _when_cycle(pending, placed)
            problems.append(f"{path}: search: the 'when' conditions form a cycle, {' -> '.join(cycle)} "
                            f"(each field's 'when' names the next); no field can be sampled first")
            placed.update(cycle)  # taken as sampled, so that the fields after the cycle are still checked
            continue
        ordered.append(ready)
        placed.add(ready.name)
        pending.remove(ready)
    return ordered


def _when_cycle(pending: list[Param], placed: set[str]) -> list[str]:
    """A cycle among fields none of which can be sampled: each waits for another unplaced one, so following
    the first such wait from any of them must come back to a field already seen."""
    by_name = {param.name: param for param in pending}
    path = [pending[0].name]
    while True:
        waits_for = next(name for name, _ in by_name[path[-1]].when if name not in placed)
        if waits_for in path:
            return path[path.index(waits_for):] + [waits_for]
        path.append(waits_for)


def _read_param(where: str, name: str, spec: dict, problems: list[str], candidates: Candidates) -> Optional[Param]:
    kind = spec.get("type")
    if kind not in DISTRIBUTION_KEYS:
        problems.append(f"{where}: type {kind!r} is not a distribution (use one of: {', '.join(DISTRIBUTION_KEYS)})")
        return None
    unknown = sorted(set(spec) - DISTRIBUTION_KEYS[kind] - {"type", "when"})
    if unknown:
        problems.append(f"{where}: unknown key(s) {', '.join(unknown)} for type {kind} "
                        f"(allowed: type, {', '.join(sorted(DISTRIBUTION_KEYS[kind]))}, when)")
    before = len(problems)
    if kind == "categorical":
        choices = _read_choices(where, name, spec.get("choices"), problems, candidates)
        return Param(name, kind, choices=choices) if len(problems) == before else None
    bounds = _read_range(where, name, kind, spec, problems, candidates)
    if bounds is None or len(problems) != before:
        return None
    low, high, step, log = bounds
    return Param(name, kind, low=low, high=high, step=step, log=log)


def _coerce_value(name: str, value: Any, source: str, problems: list[str], candidates: Optional[Candidates]) -> Any:
    return _typed_values({name: value}, source, problems, candidates).get(name)


def _read_choices(where: str, name: str, raw: Any, problems: list[str], candidates: Candidates) -> tuple:
    if not isinstance(raw, list) or not raw:
        problems.append(f"{where}: categorical needs a non-empty list 'choices', got {raw!r}")
        return ()
    choices = tuple(_coerce_value(name, value, where, problems, candidates) for value in raw)
    if len(set(choices)) != len(choices):
        problems.append(f"{where}: choices {list(raw)} repeat a value")
    return choices


def _read_range(where: str, name: str, kind: str, spec: dict, problems: list[str], candidates: Candidates
                ) -> Optional[tuple]:
    value_type = searched_field_type(name, candidates)
    if value_type not in (int, float):
        problems.append(f"{where}: a {kind} range needs a numeric field, but '{name}' holds "
                        f"{getattr(value_type, '__name__', value_type)} values; use type: categorical")
        return None
    if kind == "float" and value_type is int:
        problems.append(f"{where}: '{name}' holds integers; use type: int")
        return None
    number = int if kind == "int" else (int, float)
    low: Any = spec.get("low")
    high: Any = spec.get("high")
    step: Any = spec.get("step")
    log: Any = spec.get("log", False)
    bad = [key for key, value in (("low", low), ("high", high)) if not _is_number(value, number)]
    if step is not None and not _is_number(step, number):
        bad.append("step")
    if bad:
        problems.append(f"{where}: {', '.join(bad)} must be {'an integer' if kind == 'int' else 'a number'} "
                        f"(got low={low!r}, high={high!r}, step={step!r})")
        return None
    if not isinstance(log, bool):
        problems.append(f"{where}: log must be true or false, got {log!r}")
    if low > high:
        problems.append(f"{where}: inverted range, low {low} > high {high}")
    elif low == high:
        problems.append(f"{where}: empty range, low == high == {low}; fix the value in train: instead")
    if log is True and low <= 0:
        problems.append(f"{where}: log scale needs low > 0, got {low}")
    if step is not None and log is True:
        problems.append(f"{where}: step and log cannot be combined")
    if step is not None and not 0 < step <= high - low:
        problems.append(f"{where}: step {step} must be positive and at most high - low ({high - low})")
    return low, high, step, log is True


def _is_number(value: Any, number: type | tuple[type, ...]) -> bool:
    return isinstance(value, number) and not isinstance(value, bool) and math.isfinite(cast(float, value))


def _read_when(where: str, raw: Any, by_name: dict[str, Param], problems: list[str],
               typed_by: dict[str, Candidates]) -> tuple:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        problems.append(f"{where}: 'when' must map other searched fields to a value or list of values, got {raw!r}")
        return ()
    conditions = []
    for name, wanted in raw.items():
        if name not in by_name:
            problems.append(f"{where}: 'when' refers to '{name}', which is not a searched field "
                            f"(searched: {', '.join(by_name) or 'none'})")
            continue
        values = tuple(wanted) if isinstance(wanted, list) else (wanted,)
        coerced = tuple(_coerce_value(name, value, f"{where}: when.{name}", problems, typed_by.get(name))
                        for value in values)
        outside = [value for value in coerced if value is not None and not by_name[name].admits(value)]
        if outside:
            problems.append(f"{where}: 'when' value(s) {outside} can never be sampled for '{name}'")
        conditions.append((name, coerced))
    return tuple(conditions)


def _read_objective(path: str, section: dict, problems: list[str]) -> tuple[str, str]:
    unknown = sorted(set(section) - {"metric", "direction"})
    if unknown:
        problems.append(f"{path}: objective: unknown key(s) {', '.join(unknown)} (allowed: metric, direction)")
    metric = section.get("metric", "gap")
    task, _, plain = metric.rpartition("/")  # TASK/METRIC with tasks
    if not is_own_metric(plain) and metric_problem(plain) is not None:
        problems.append(f"{path}: objective.metric {metric!r} is not a validation metric "
                        f"(use one of: {', '.join(METRIC_DIRECTIONS)}, or a metric of one's own; with tasks, "
                        f"TASK/METRIC): {metric_problem(plain)}")
        return "gap", "maximize"
    metric = f"{task}/{canonical_metric(plain)}" if task else canonical_metric(plain)
    direction = section.get("direction", "maximize" if higher_is_better(plain) else "minimize")
    if direction not in ("maximize", "minimize"):
        problems.append(f"{path}: objective.direction {direction!r} must be maximize or minimize")
    return metric, direction


def _check_objective_task(path: str, train: dict[str, Any], search: list[Param], metric: str,
                          problems: list[str]) -> None:
    """The objective must be a metric the trials report: segment_map needs segment labels, map video labels; with
    tasks, TASK/METRIC of one of them (a plain METRIC: the first task's)."""
    task, _, plain = metric.rpartition("/")
    entries = _objective_task_entries(train, search)
    if task and not entries:
        problems.append(f"{path}: objective.metric {metric!r} names a task, but train has no tasks")
        return
    if task and task not in [entry.get("name") for entry in entries]:
        problems.append(f"{path}: objective.metric {metric!r}: no task is named {task!r} (tasks: "
                        f"{', '.join(str(entry.get('name')) for entry in entries)})")
        return
    chosen = next((entry for entry in entries if entry.get("name") == task), entries[0] if entries else None)
    main_pattern, segment_labels = train.get("train_data_pattern", ""), bool(train.get("segment_labels"))
    segments = reads_segments(chosen.get("label_source", "labels"), chosen.get("train_data_pattern", ""),
                              main_pattern, segment_labels) if chosen else segment_labels
    names = metric_names(segments)
    if plain not in names and (is_own_metric(plain) or segments):
        source = f"task {chosen.get('name')} reads segment ratings" if chosen else "train: segment_labels"
        kind = f"segment ({source})" if segments else "video-level"
        problems.append(f"{path}: objective.metric {metric!r} is not a {kind} metric (use one of: "
                        f"{', '.join(name for name in names if not name.startswith('num_'))})")


def _objective_task_entries(train: dict[str, Any], search: list[Param]) -> list[dict[str, Any]]:
    """The tasks trials train, as `tasks:` entries (the --aux_vertical_weight shorthand's too, fixed or searched)."""
    aux = train.get("aux_vertical_weight") or (1.0 if any(p.name == "aux_vertical_weight" for p in search) else 0)
    tasks = [entry for entry in train.get("tasks") or [] if isinstance(entry, dict)]
    return task_entries(TasksConfig(entries=tasks, aux_vertical_weight=aux))


def objective_key(metric: str, tasks: TasksConfig) -> str:
    """The objective's key in a trial's validation metrics: with tasks TASK/METRIC, a plain METRIC the first
    task's."""
    if not tasks.multitask or "/" in metric:
        return metric
    return f"{task_entries(tasks)[0]['name']}/{metric}"


def _read_settings(path: str, values: dict[str, Any], problems: list[str]) -> TuneSettings:
    try:
        return config_from_dict(TuneSettings, values, source=f"{path}: tune")
    except ConfigError as err:
        problems.extend(f"{path}: tune.{problem.removeprefix('--')}" for problem in err.problems)
        return TuneSettings()


def _read_enqueue(path: str, raw: Any, search: list[Param], problems: list[str],
                  typed_by: dict[str, Candidates]) -> list[dict[str, Any]]:
    """`tune.enqueue`: parameter sets tried first (e.g. the defaults, as a baseline the search must beat)."""
    if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
        problems.append(f"{path}: tune.enqueue must be a list of mappings field: value, got {raw!r}")
        return []
    by_name = {param.name: param for param in search}
    entries = []
    for index, entry in enumerate(raw):
        where = f"{path}: tune.enqueue[{index}]"
        coerced = {}
        for name, value in entry.items():
            if name not in by_name:
                problems.append(f"{where}: '{name}' is not a searched field")
                continue
            coerced[name] = _coerce_value(name, value, where, problems, typed_by.get(name))
            if coerced[name] is not None and not by_name[name].admits(coerced[name]):
                problems.append(f"{where}: {name}={value!r} lies outside its search space")
        entries.append(coerced)
    return entries


def _check_report_schedule(path: str, settings: TuneSettings, train: dict[str, Any], search: list[Param],
                           problems: list[str]) -> None:
    """Trials validate where they report (report_schedule), so the tuner owns their export_model_steps."""
    for owned in ("export_model_steps", "checkpoint_at_examples"):
        if owned in train or any(param.name == owned for param in search):
            steps = settings.pruning.report_every_steps
            where = f"every tune.report_every_steps={steps} steps" if steps else \
                "at each epoch's end (tune.report_every_steps for more often; tune.resource examples for rungs)"
            problems.append(f"{path}: trials validate and report {where}; remove {owned} from train: and search:")
    if settings.pruning.resource == "examples":
        problems.extend(f"{path}: {problem}" for problem in _example_budget_problems(settings, train, search))


def _example_budget_problems(settings: TuneSettings, train: dict[str, Any], search: list[Param]) -> list[str]:
    """--resource examples: every trial's budget is the same number of examples (num_epochs of the training set),
    reported at its rungs."""
    problems = []
    if settings.pruning.report_every_steps:
        problems.append("tune.resource examples reports at rungs of the example budget; remove "
                        "tune.report_every_steps")
    searched = {param.name for param in search}
    budget = "tune.resource examples: every trial's budget is train.num_epochs of the training set"
    if "num_epochs" in searched:
        problems.append(f"{budget}; remove num_epochs from search:")
    if "max_steps" in train or "max_steps" in searched:
        problems.append(f"{budget}; remove max_steps from train: and search:")
    return problems


def report_schedule(pruning: PruningSettings, rungs: tuple[int, ...] = ()) -> dict[str, Any]:
    """Trials validate their checkpoints where they report, and only there (a validation in between could become the
    trial's value unseen by the pruner, and count in early stopping's patience): every --report_every_steps steps
    (their export_model_steps), else at each epoch's end; with --resource examples also at the `rungs`."""
    steps = pruning.report_every_steps
    if steps:
        return {"export_model_steps": steps}
    return {"checkpoint_every_epoch": True, "export_model_steps": 0, "checkpoint_at_examples": list(rungs)}


def _check_trial_configs(path: str, train: dict[str, Any], search: list[Param], settings: TuneSettings,
                         problems: list[str]) -> None:
    """Check the configs trials will train with as `yt8m train` checks its config (ranges, model names,
    combinations), so that a bad value fails the file instead of every trial: the fixed fields with each
    searched field at its first value, then each searched value in turn. A problem is reported under the
    searched value that brings it, or under train: when the fixed fields bring it."""
    source = f"{path}: train"
    fixed = {**train, "train_dir": PLACEHOLDER_TRAIN_DIR, "start_new_model": True, **report_schedule(settings.pruning)}
    base = {**fixed, **{param.name: param.checked_values()[0] for param in search if not param.when}}
    from_search = set()
    for param in search:
        # The other fields as in `base`, this one at its default, the fields its `when` names set to make it active,
        # and the fields that are active with those at their first values, as a trial sampling these would have them.
        reference = {name: value for name, value in base.items() if name != param.name}
        reference.update({name: accepted[0] for name, accepted in param.when})
        for other in search:
            if other is not param and other.name not in reference and other.is_active(reference):
                reference[other.name] = other.checked_values()[0]
        known = set(_config_problems(reference, source))
        for value in param.checked_values():
            for line in _config_problems({**reference, param.name: value}, source):
                if line not in known:
                    from_search.add(line)
                    problems.append(f"{path}: search.{param.name} value {value!r}: {_without_source(line, source)}")
    problems.extend(line for line in _config_problems(base, source) if line not in from_search)


def _config_problems(values: dict[str, Any], source: str) -> list[str]:
    problems: list[str] = []
    _collect(problems, config_from_dict, TrainConfig, with_task_fields(values), source, True, train_config_problems)
    return problems


def _without_source(line: str, source: str) -> str:
    return line[len(source) + 2:] if line.startswith(f"{source}: ") else line

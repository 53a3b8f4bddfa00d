"""`yt8m tune` and `yt8m tune-report` on tiny synthetic shards: the tuning file and its one-error validation,
resuming (also after a SIGKILL, with new points and no orphaned jobs), parallel jobs, pruning, failing trials,
the report and best.yaml (kept current while trials run), one-line errors for bad storage URLs and files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml

from tune_fixtures import FEATURE_SIZES, NUM_CLASSES, SEARCH, shards, tune_file  # noqa: F401  (a fixture)
from yt8m import cli
from yt8m.config import config_values, load_config
from yt8m.training import TrainConfig
from yt8m.tuning import study as study_module
from yt8m.tuning.lifetime import TrialStartLock
from yt8m.tuning.objective import TrialObjective
from yt8m.tuning.space import PruningSettings, SamplingSettings, TuneSpec, load_tune_spec
from yt8m.tuning.study import (
    PerTrialSeedSampler,
    create_pruner,
    create_sampler,
    interrupted_trials,
    open_storage,
    open_study,
    record_interruption,
    recover_interrupted,
    state_counts,
    with_installed_driver,
    worker_identity,
)

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]

def saved_values(path) -> dict:
    """A stored train config (a trial's config.yaml, best.yaml) by flag: the flat view, whatever its form."""
    return config_values(load_config(TrainConfig, str(path)))

def tune_in_process(capsys, *argv: str) -> dict:
    assert cli.main(["tune", *argv]) == 0, capsys.readouterr().err[-3000:]
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def yt8m_process(*argv: str, env_extra: dict | None = None, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "yt8m", *argv], env=env, text=True, **popen)


def finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, (err or getattr(process, "log_text", lambda: "")())[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def logged_to_file(process_args: list[str], log: Path, **popen) -> subprocess.Popen:
    """A process whose stderr goes to `log`: a pipe nobody reads while it runs would fill and stall it."""
    with open(log, "w") as err:
        process = subprocess.Popen(process_args, stdout=subprocess.PIPE, stderr=err, text=True, **popen)
    process.log_text = log.read_text  # type: ignore[attr-defined]
    return process


def load_study(study_dir: str | Path, name: str = "tune", storage: str = "") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=storage or f"sqlite:///{study_dir}/study.db")


def worker_pids(study: optuna.Study) -> set[int]:
    return {trial.user_attrs["worker"]["pid"] for trial in study.trials if "worker" in trial.user_attrs}


# The tuning file ---------------------------------------------------------------------------------------------

def test_one_error_lists_every_problem(tmp_path, shards, capsys):
    search = {
        "no_such_flag": {"type": "float", "low": 0.1, "high": 1.0},
        "base_learning_rate": {"type": "float", "low": 0.5, "high": 0.1},
        "moe_num_mixtures": {"type": "int", "low": 4, "high": 4},
        "l2_penalty": {"type": "gaussian", "mean": 0.0},
        "batch_size": {"type": "categorical", "choices": [16, 32], "when": {"optimizer": "Adam"}},
        "num_epochs": {"type": "float", "low": 1, "high": 3},
    }
    path = tune_file(tmp_path / "tune.yaml", shards, search, tune={"sampler": "annealing"}, learning_rate=0.1,
                     export_model_steps=500)
    document = yaml.safe_load(Path(path).read_text())
    document["objective"] = {"metric": "accuracy", "direction": "maximize"}
    Path(path).write_text(yaml.safe_dump(document))

    assert cli.main(["tune", "--config", path, "--pruner", "sometimes"]) == 1
    err = capsys.readouterr().err
    for expected in ["train: unknown field 'learning_rate'",
                     "search.no_such_flag: unknown field",
                     "search.base_learning_rate: inverted range, low 0.5 > high 0.1",
                     "search.moe_num_mixtures: empty range",
                     "search.l2_penalty: type 'gaussian' is not a distribution",
                     "search.batch_size: 'when' refers to 'optimizer', which is not a searched field",
                     "search.num_epochs: 'num_epochs' holds integers; use type: int",
                     "objective.metric 'accuracy' is not a validation metric",
                     "tune.sampler must be one of tpe, random, got 'annealing'",
                     "tune.pruner must be one of median, successive_halving, hyperband, none, got 'sometimes'",
                     "trials validate and report at each epoch's end (tune.report_every_steps for more often; "
                     "tune.resource examples for rungs); remove export_model_steps from train: and search:"]:
        assert expected in err
    assert "11 problem(s)" in err
    assert not (tmp_path / "study").exists()


TWO_TASKS = [{"name": "main"}, {"name": "copy", "head_model": "LogisticModel", "weight": 0.5}]


def test_task_weights_and_head_hyperparameters_are_searched(tmp_path, shards, capsys):
    """tasks.TASK.FIELD and tasks.TASK.head_hparams.HPARAM reach the task's entry in each trial's config and in
    best.yaml, which `yt8m train --config` takes as it is."""
    search = {"tasks.copy.weight": {"type": "float", "low": 0.1, "high": 2.0},
              "tasks.main.head_hparams.moe_num_mixtures": {"type": "int", "low": 1, "high": 3},
              "tasks.copy.loss": {"type": "categorical", "choices": ["CrossEntropyLoss", "SoftmaxLoss"]}}
    enqueue = [{"tasks.copy.weight": 1.5, "tasks.main.head_hparams.moe_num_mixtures": 3,
                "tasks.copy.loss": "SoftmaxLoss"}]
    path = tune_file(tmp_path / "tune.yaml", shards, search, model="MoeModel", tasks=TWO_TASKS, num_epochs=1,
                     tune={"enqueue": enqueue, "pruner": "none"})
    document = yaml.safe_load(Path(path).read_text())
    document["objective"] = {"metric": "copy/gap"}  # a task's metric is the objective
    Path(path).write_text(yaml.safe_dump(document, sort_keys=False))
    summary = tune_in_process(capsys, "--config", path, "--n_trials", "2")
    assert summary["n_trials"]["complete"] == 2 and summary["metric"] == "copy/gap"
    for trial in load_study(tmp_path / "study").trials:
        assert trial.value == trial.user_attrs["metrics"]["copy/gap"] != trial.user_attrs["metrics"]["main/gap"]
        saved = saved_values(Path(trial.user_attrs["train_dir"]) / "config.yaml")
        main_task, copy_task = saved["tasks"]
        assert copy_task["weight"] == trial.params["tasks.copy.weight"]
        assert copy_task["loss"] == trial.params["tasks.copy.loss"] and copy_task["head_model"] == "LogisticModel"
        assert main_task["head_hparams"] == {"moe_num_mixtures": trial.params["tasks.main.head_hparams.moe_num_mixtures"]}
        assert not any(name.startswith("tasks.") for name in saved)
    first = saved_values(tmp_path / "study" / "trials" / "trial-0" / "config.yaml")
    assert first["tasks"][1]["weight"] == 1.5 and first["tasks"][0]["head_hparams"] == {"moe_num_mixtures": 3}
    best = saved_values(tmp_path / "study" / "best.yaml")
    assert [task["name"] for task in best["tasks"]] == ["main", "copy"] and "tasks.copy.weight" not in best


def test_task_fields_that_cannot_be_searched_are_named(tmp_path, shards, capsys):
    search = {"tasks.nope.weight": {"type": "float", "low": 0.1, "high": 1.0},
              "tasks.copy.train_data_pattern": {"type": "categorical", "choices": ["a", "b"]},
              "tasks.copy.loss": {"type": "float", "low": 0.1, "high": 1.0},
              "tasks.copy.head_hparams.no_such_flag": {"type": "int", "low": 1, "high": 3},
              "tasks.copy.weight": {"type": "float", "low": -1.0, "high": 1.0}}
    path = tune_file(tmp_path / "tune.yaml", shards, search, tasks=TWO_TASKS, **{"tasks.copy.weight": 0.3})
    document = yaml.safe_load(Path(path).read_text())
    document["objective"] = {"metric": "nope/map"}
    Path(path).write_text(yaml.safe_dump(document, sort_keys=False))
    assert cli.main(["tune", "--config", path]) == 1
    err = capsys.readouterr().err
    for expected in ["search.tasks.nope.weight: names no task of train.tasks (tasks there: main, copy",
                     "search.tasks.copy.train_data_pattern: unknown task field (searchable: weight, loss",
                     "search.tasks.copy.loss: a float range needs a numeric field",
                     "search.tasks.copy.head_hparams.no_such_flag: unknown task field",
                     "search.tasks.copy.weight value -1.0: ",
                     "train.tasks.copy.weight: a task's fixed fields go in its entry of train.tasks",
                     "objective.metric 'nope/map': no task is named 'nope' (tasks: main, copy)"]:
        assert expected in err
    assert "7 problem(s)" in err


@pytest.mark.parametrize("name", ["tune_video.yaml", "tune_video_gpu.yaml", "tune_frame.yaml", "tune_frame_gpu.yaml"])
def test_example_configs_are_valid_and_enqueue_whole_configurations(name):
    """Each enqueued baseline sets exactly the fields active for it: none is left to chance (a FixedTrial refuses a
    field it lacks), none is set that its model ignores."""
    spec = load_tune_spec(str(REPO_ROOT / "configs" / name))
    assert spec.search and spec.enqueue and spec.settings.study.study_dir == os.path.join("studies", name[:-5])
    for entry in spec.enqueue:
        assert spec.sample(optuna.trial.FixedTrial(entry)) == entry


def test_a_train_section_may_stop_trials_early_on_the_studys_validation(tmp_path, shards):
    """early_stopping_patience needs validations: a trial has the study's, so the file is accepted (it was refused as
    if trials had none) and each trial stops that many epochs after its best."""
    spec = load_tune_spec(tune_file(tmp_path / "tune.yaml", shards, early_stopping_patience=2))
    config = spec.trial_config({"model": "LogisticModel", "base_learning_rate": 0.01}, str(tmp_path / "trial"))
    assert config.validation.early_stopping_patience == 2 and config.validation.eval_data_pattern


def test_when_makes_a_field_conditional(tmp_path, shards):
    spec = load_tune_spec(tune_file(tmp_path / "tune.yaml", shards))
    logistic = spec.sample(optuna.trial.FixedTrial({"model": "LogisticModel", "base_learning_rate": 0.01}))
    moe = spec.sample(optuna.trial.FixedTrial({"model": "MoeModel", "base_learning_rate": 0.01,
                                               "moe_num_mixtures": 3}))
    assert logistic == {"model": "LogisticModel", "base_learning_rate": 0.01}
    assert moe["moe_num_mixtures"] == 3
    config = spec.trial_config(moe, str(tmp_path / "trial"))
    assert (config.model.name, config.model.hparams.moe_num_mixtures, config.features.num_classes) == \
        ("MoeModel", 3, NUM_CLASSES)
    assert config.checkpoints.start_new_model and config.checkpoints.train_dir == str(tmp_path / "trial")


# `l2_penalty` sorts before `model`, which its `when` names: an alphabetical dump puts it above the field it needs.
CONDITIONED_ABOVE = {**SEARCH, "l2_penalty": {"type": "float", "low": 1e-8, "high": 1e-5, "log": True,
                                              "when": {"model": "MoeModel"}}}


def test_a_resorted_file_tunes_with_each_field_after_the_fields_its_when_names(tmp_path, shards, capsys):
    path = tune_file(tmp_path / "tune.yaml", shards, CONDITIONED_ABOVE, tune={"pruner": "none", "n_startup_trials": 4})
    Path(path).write_text(yaml.safe_dump(yaml.safe_load(Path(path).read_text()), sort_keys=True))
    assert list(yaml.safe_load(Path(path).read_text())["search"])[:2] == ["base_learning_rate", "l2_penalty"]
    assert [param.name for param in load_tune_spec(path).search] == \
        ["base_learning_rate", "model", "l2_penalty", "moe_num_mixtures"]

    summary = tune_in_process(capsys, "--config", path, "--n_trials", "4")
    assert summary["n_trials"]["complete"] == 4
    trials = load_study(tmp_path / "study").trials
    assert {trial.params["model"] for trial in trials} == {"LogisticModel", "MoeModel"}
    for trial in trials:
        moe = trial.params["model"] == "MoeModel"
        assert ("l2_penalty" in trial.params) == moe and ("moe_num_mixtures" in trial.params) == moe


def test_a_file_in_when_order_keeps_its_order_and_samples_the_same_points_every_time(tmp_path, shards):
    path = tune_file(tmp_path / "tune.yaml", shards, CONDITIONED_ABOVE)
    assert [param.name for param in load_tune_spec(path).search] == list(CONDITIONED_ABOVE)
    Path(path).write_text(yaml.safe_dump(yaml.safe_load(Path(path).read_text()), sort_keys=True))

    def sampled() -> list[dict]:
        spec = load_tune_spec(path)
        study = optuna.create_study(sampler=create_sampler(SamplingSettings(sampler="tpe", n_startup_trials=3)),
                                    direction="maximize")
        study.optimize(lambda trial: spec.sample(trial)["base_learning_rate"], n_trials=6)
        return [trial.params for trial in study.trials]

    assert sampled() == sampled()


def test_a_cycle_of_when_conditions_is_one_error_naming_it(tmp_path, shards, capsys):
    search = {"model": {"type": "categorical", "choices": ["LogisticModel", "MoeModel"],
                        "when": {"moe_num_mixtures": 2}},
              "moe_num_mixtures": {"type": "int", "low": 1, "high": 3, "when": {"model": "MoeModel"}},
              "l2_penalty": {"type": "float", "low": 1e-8, "high": 1e-5, "when": {"l2_penalty": 1e-6}},
              "base_learning_rate": {"type": "float", "low": 1e-3, "high": 0.3, "when": {"model": "MoeModel"}}}
    path = tune_file(tmp_path / "tune.yaml", shards, search)
    assert cli.main(["tune", "--config", path]) == 1
    err = capsys.readouterr().err
    assert "2 problem(s)" in err
    assert "search: the 'when' conditions form a cycle, model -> moe_num_mixtures -> model" in err
    assert "search: the 'when' conditions form a cycle, l2_penalty -> l2_penalty" in err
    assert not (tmp_path / "study").exists()


def test_flags_override_the_file_and_names_default_from_it(tmp_path, shards):
    path = tune_file(tmp_path / "video_search.yaml", shards, tune={"n_trials": 3, "sampler": "tpe"})
    document = yaml.safe_load(Path(path).read_text())
    del document["tune"]["study_dir"]
    Path(path).write_text(yaml.safe_dump(document))
    settings = load_tune_spec(path, {"n_trials": 7, "sampler": "random"}).settings
    assert (settings.study.n_trials, settings.sampling.sampler) == (7, "random")
    assert settings.study.study_name == "video_search"
    assert settings.study.study_dir == os.path.join("studies", "video_search")


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_samplers_are_seeded(tmp_path, shards, sampler):
    spec = load_tune_spec(tune_file(tmp_path / "tune.yaml", shards))

    def sampled(seed: int) -> list[dict]:
        settings = SamplingSettings(sampler=sampler, seed=seed, n_startup_trials=2)
        study = optuna.create_study(sampler=create_sampler(settings), direction="maximize")
        study.optimize(lambda trial: spec.sample(trial)["base_learning_rate"], n_trials=5)
        return [trial.params for trial in study.trials]

    assert sampled(1) == sampled(1)
    assert sampled(1) != sampled(2)


def test_pruner_choice():
    expected = {"median": optuna.pruners.MedianPruner, "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
                "hyperband": optuna.pruners.HyperbandPruner, "none": optuna.pruners.NopPruner}
    for name, cls in expected.items():
        assert type(create_pruner(PruningSettings(pruner=name), num_epochs=3)) is cls


def test_the_tune_section_reads_the_same_flat_or_by_part(tmp_path, shards):
    flat = load_tune_spec(tune_file(tmp_path / "flat.yaml", shards, tune={"sampler": "random", "pruner": "none",
                                                                          "n_trials": 3}))
    by_part = load_tune_spec(tune_file(tmp_path / "parts.yaml", shards, tune={
        "sampling": {"sampler": "random"}, "pruning": {"pruner": "none"}, "study": {"n_trials": 3}}))
    assert dataclasses.replace(by_part.settings, study=dataclasses.replace(by_part.settings.study,
                                                                           study_name="flat")) == flat.settings
    assert (flat.settings.sampling.sampler, flat.settings.pruning.pruner, flat.settings.study.n_trials) == (
        "random", "none", 3)


# Studies -----------------------------------------------------------------------------------------------------

def test_rerun_carries_on_to_the_same_total_and_reports(tmp_path, shards, capsys):
    path = tune_file(tmp_path / "tune.yaml", shards, tune={"pruner": "none", "keep_best": 1})
    first = tune_in_process(capsys, "--config", path, "--n_trials", "2")
    assert first["n_trials"]["complete"] == 2
    again = tune_in_process(capsys, "--config", path, "--n_trials", "2")
    assert again["n_trials"] == first["n_trials"] and again["best_value"] == first["best_value"]
    more = tune_in_process(capsys, "--config", path, "--n_trials", "3")
    study_dir = Path(more["study_dir"])
    assert more["n_trials"]["complete"] == 3 and len(load_study(study_dir).trials) == 3

    # --keep_best 1: only the best trial keeps its checkpoints and the exports of its evaluations.
    for kept in ("checkpoints", "export"):
        with_files = sorted(p.parent.name for p in study_dir.glob(f"trials/trial-*/{kept}"))
        assert with_files == [f"trial-{more['best_trial']}"]

    assert cli.main(["tune-report", str(study_dir)]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)  # stdout: one JSON line; the leaderboard is for a person, on stderr
    assert report["best_value"] == more["best_value"]
    assert "trial  state     gap" in err and "COMPLETE" in err and "gap: GAP@20: every video's 20 best" in err
    for name in ("best_so_far", "intermediate_values"):  # 3 complete trials of 2 epochs: both have points to draw
        assert Path(report["plots"][name]).read_bytes().startswith(b"\x89PNG")
    assert report["plots"]["param_importances"] == ("skipped: importances need 10 complete trials at least, the "
                                                    "study has 3: from fewer, they rank noise")
    best = saved_values(study_dir / "best.yaml")
    assert {k: best[k] for k in more["best_params"]} == more["best_params"]

    # Retraining the best config (same seed, same data) reproduces its validation score.
    assert cli.main(["tune-report", str(study_dir), "--retrain_best"]) == 0
    retrain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["retrain"]
    assert retrain["validation"]["gap"] == pytest.approx(more["best_value"], abs=1e-4)

    assert cli.main(["train", "--config", str(study_dir / "best.yaml"), "--train_dir", str(tmp_path / "again"),
                     "--num_epochs", "1"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["global_step"] > 0


def test_resuming_with_another_search_space_is_refused(tmp_path, shards, capsys):
    path = tune_file(tmp_path / "tune.yaml", shards, tune={"pruner": "none"})
    tune_in_process(capsys, "--config", path, "--n_trials", "1")
    changed = {**SEARCH, "base_learning_rate": {"type": "float", "low": 1e-4, "high": 0.3, "log": True}}
    tune_file(tmp_path / "tune.yaml", shards, changed, tune={"pruner": "none"})
    assert cli.main(["tune", "--config", path, "--n_trials", "2"]) == 1
    assert "was created from a different train:, search: or objective: section" in capsys.readouterr().err


def test_a_study_killed_mid_trial_resumes_with_the_trial_requeued(tmp_path, shards):
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": SEARCH["base_learning_rate"]},
                     tune={"pruner": "none"}, model="LogisticModel", num_epochs=40)  # outlasts a slow poll
    study_dir = tmp_path / "study"
    process = yt8m_process("tune", "--config", path, "--n_trials", "2", stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        # trials/ appears once the study's tables exist; then wait for trial 0's first epoch score.
        trials = load_study(study_dir).trials if (study_dir / "trials").exists() else []
        if trials and trials[0].intermediate_values:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed = load_study(study_dir).trials
    assert [t.state for t in killed] == [optuna.trial.TrialState.RUNNING]

    resumed = finish(yt8m_process("tune", "--config", path, "--n_trials", "2", stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE))
    assert resumed["n_trials"] == {"complete": 2, "pruned": 0, "fail": 0, "interrupted": 1, "running": 0,
                                   "waiting": 0}
    trials = load_study(study_dir).trials
    assert trials[0].state == optuna.trial.TrialState.FAIL
    assert trials[1].user_attrs["retry_of"] == 0 and trials[1].params == trials[0].params
    assert trials[1].state == trials[2].state == optuna.trial.TrialState.COMPLETE
    assert "interrupted" in (study_dir / "leaderboard.txt").read_text()


def test_an_interrupt_before_training_starts_requeues_the_trial(tmp_path, shards, capsys, monkeypatch):
    """A killed run's jobs get their SIGTERM at any moment, also between sampling and training: the trial is
    interrupted and re-queued, not FAILED (a rerun used to finish with one failed trial)."""
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": SEARCH["base_learning_rate"]},
                     tune={"pruner": "none"}, model="LogisticModel", num_epochs=1)
    trial_config = TuneSpec.trial_config

    def interrupted_while_setting_up(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return trial_config(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(TuneSpec, "trial_config", interrupted_while_setting_up)
        assert cli.main(["tune", "--config", path, "--n_trials", "1"]) == 130
    stopped = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stopped["interrupted"] and stopped["n_trials"]["fail"] == 0
    assert stopped["n_trials"]["interrupted"] == 1 and stopped["n_trials"]["waiting"] == 1
    resumed = tune_in_process(capsys, "--config", path, "--n_trials", "1")
    assert resumed["n_trials"] == {"complete": 1, "pruned": 0, "fail": 0, "interrupted": 1, "running": 0,
                                   "waiting": 0}
    trials = load_study(tmp_path / "study").trials
    assert trials[1].user_attrs["retry_of"] == 0 and trials[1].params == trials[0].params


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_a_trial_is_created_stops_it_once_it_says_whose_it_is(tmp_path, shards, capsys,
                                                                                 monkeypatch, signum):
    """A signal inside Optuna's creation of a trial (here in the sampler's before_trial, once the trial is RUNNING)
    used to leave it RUNNING with no worker: no rerun could judge it, and it held a place in --n_trials for ever (a
    kill test's rerun ended with 4 of 5 trials complete and 1 running). A signal now only asks to stop: the trial is
    stamped, then stopped as interrupted, and the hand-given configuration it was started with is queued again."""
    config = {"base_learning_rate": 0.05}
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": SEARCH["base_learning_rate"]},
                     tune={"pruner": "none", "enqueue": [config]}, model="LogisticModel", num_epochs=1)
    before_trial = PerTrialSeedSampler.before_trial

    def signalled_while_the_trial_is_created(self, study, trial):
        os.kill(os.getpid(), signum)
        before_trial(self, study, trial)

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with monkeypatch.context() as patch:
            patch.setattr(PerTrialSeedSampler, "before_trial", signalled_while_the_trial_is_created)
            assert cli.main(["tune", "--config", path, "--n_trials", "1"]) == 130
    finally:
        for sig, handler in handlers.items():  # `yt8m tune` takes SIGTERM; this test process must get it back
            signal.signal(sig, handler)
    stopped = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stopped["n_trials"] == {"complete": 0, "pruned": 0, "fail": 0, "interrupted": 1, "running": 0,
                                   "waiting": 1}
    resumed = tune_in_process(capsys, "--config", path, "--n_trials", "1")
    assert resumed["n_trials"] == {"complete": 1, "pruned": 0, "fail": 0, "interrupted": 1, "running": 0,
                                   "waiting": 0}
    trials = load_study(tmp_path / "study").trials
    assert trials[1].params == config and trials[1].user_attrs["retry_of"] == 0


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_trial_whose_job_died_before_claiming_it_is_replaced_by_the_next_run(tmp_path, shards, capsys):
    """A job killed outright (SIGKILL, its watchdog's exit) between Optuna creating its trial and stamping it
    leaves a RUNNING trial with no worker. On the study dir's own SQLite, every job of the study takes this
    machine's start lock before it creates a trial, so the next run takes such a trial as interrupted at once."""
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": SEARCH["base_learning_rate"]},
                     tune={"pruner": "none"}, model="LogisticModel", num_epochs=1)
    spec = load_tune_spec(path)
    (tmp_path / "study").mkdir()
    open_study(spec, open_storage(spec.settings.study)).ask()  # the job is gone from here on
    resumed = tune_in_process(capsys, "--config", path, "--n_trials", "1")
    assert resumed["n_trials"] == {"complete": 1, "pruned": 0, "fail": 0, "interrupted": 1, "running": 0,
                                   "waiting": 0}
    assert "before saying whose it was" in interrupted_trials(load_study(tmp_path / "study"))[0]


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_on_a_shared_storage_an_unclaimed_trial_is_judged_after_the_heartbeat_grace(tmp_path, shards, monkeypatch):
    """With --storage, another machine's job may be creating that trial right now: the trial is taken as
    interrupted only once it has been seen unclaimed for longer than the heartbeat grace (4 heartbeats)."""
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": SEARCH["base_learning_rate"]},
                     tune={"storage": f"sqlite:///{tmp_path}/shared.db", "heartbeat_seconds": 5},
                     model="LogisticModel")
    spec = load_tune_spec(path)
    storage = open_storage(spec.settings.study)
    study = open_study(spec, storage)
    study.ask()
    seen_at = time.time()
    for after, state in ((0, optuna.trial.TrialState.RUNNING), (19, optuna.trial.TrialState.RUNNING),
                         (21, optuna.trial.TrialState.FAIL)):
        monkeypatch.setattr(study_module, "time", SimpleNamespace(time=lambda: seen_at + after))
        recover_interrupted(study, storage, jobs_here_only=False)
        assert study.trials[0].state == state, after
    assert list(interrupted_trials(study)) == [0]


def test_two_jobs_share_one_study(tmp_path, shards):
    path = tune_file(tmp_path / "tune.yaml", shards, tune={"pruner": "none"}, num_epochs=3)
    result = finish(yt8m_process("tune", "--config", path, "--n_trials", "4", "--n_jobs", "2",
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    assert result["n_trials"]["complete"] == 4
    study = load_study(tmp_path / "study")
    assert len(study.trials) == 4
    assert len(worker_pids(study)) == 2
    params = [json.dumps(trial.params, sort_keys=True) for trial in study.trials]
    assert len(set(params)) == len(params)  # each job has its own seed


@pytest.mark.integration
def test_each_of_two_jobs_checks_its_ram_cache_against_half_the_memory(tmp_path, shards):
    path = tune_file(tmp_path / "tune.yaml", shards, tune={"pruner": "none"}, num_epochs=1, cache_in_memory=True,
                     log_every_steps=1000)
    process = yt8m_process("tune", "--config", path, "--n_trials", "2", "--n_jobs", "2", stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    checks = [line for line in err.splitlines() if "caching the training data in RAM: estimate" in line]
    assert len(checks) == 2 and all("(this process's share: 1/2 for --n_jobs 2)" in line for line in checks)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_trial_within_the_budget_is_trained_when_another_job_finishes_one_meanwhile(tmp_path, shards,
                                                                                      monkeypatch):
    """The race behind a flaky test_two_jobs_share_one_study: the surplus check read the trials twice, so another
    job's trial finishing in between counted as running and as finished, and a trial within --n_trials was
    failed as surplus (and one more trial started)."""
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": SEARCH["base_learning_rate"]},
                     tune={"n_trials": 4, "pruner": "none", "sampler": "random"}, model="LogisticModel",
                     num_epochs=1)
    spec = load_tune_spec(path)
    (tmp_path / "study").mkdir()
    study, other_job = (open_study(spec, open_storage(spec.settings.study)) for _ in range(2))
    for _ in range(2):
        study.tell(study.ask(), 0.5)
    others_trial, trial = other_job.ask(), study.ask()  # trials 2 and 3: 4 in all, within the budget
    read_trials = study.get_trials

    def read_then_the_other_job_finishes(*args, **kwargs):
        monkeypatch.setattr(study, "get_trials", read_trials)
        trials = read_trials(*args, **kwargs)
        other_job.tell(others_trial, 0.5)
        return trials

    seen_by_the_other_job = []

    class Lock(TrialStartLock):
        def release(self) -> None:
            seen_by_the_other_job.append(other_job.trials[trial.number].user_attrs.get("worker"))
            super().release()

    monkeypatch.setattr(study, "get_trials", read_then_the_other_job_finishes)
    with Lock(str(tmp_path / ".budget.lock")).held() as lock:
        value = TrialObjective(spec, lock)(trial)
    assert interrupted_trials(study) == {} and 0 < value <= 1
    # Once the lock is free the other job may look for interrupted trials: this one must say whose it is.
    assert seen_by_the_other_job[0] == worker_identity()


@pytest.mark.skipif(not os.environ.get("YT8M_TEST_POSTGRES_URL"),
                    reason="YT8M_TEST_POSTGRES_URL is not set: start a server with `.ci/postgres.sh start`")
def test_two_tune_processes_share_one_postgres_study(tmp_path, shards):
    url = os.environ["YT8M_TEST_POSTGRES_URL"]
    name = f"test-{uuid.uuid4().hex[:8]}"
    path = tune_file(tmp_path / "tune.yaml", shards, tune={"pruner": "none"}, num_epochs=6)

    def machine(directory: str, n_trials: int) -> subprocess.Popen:  # each "machine" its own study dir, one database
        return yt8m_process("tune", "--config", path, "--n_trials", str(n_trials), "--storage", url,
                            "--study_name", name, "--study_dir", str(tmp_path / directory),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    # One after the other: the second carries the shared study on to its total, sampling around the first's trials.
    finish(machine("a", 2))
    assert finish(machine("b", 4))["n_trials"]["complete"] == 4
    study = load_study("", name, with_installed_driver(url))
    assert len(worker_pids(study)) == 2
    # At once (whether they overlap depends on start-up times, so only the outcome is asserted): the study ends at
    # exactly its total; surplus trials of a race between the machines would show as "interrupted", not complete.
    for process in [machine("a", 8), machine("b", 8)]:
        finish(process)
    study = load_study("", name, with_installed_driver(url))
    counts = state_counts(study)
    assert counts["complete"] == 8 and counts["fail"] == counts["running"] == counts["waiting"] == 0
    params = [json.dumps(trial.params, sort_keys=True) for trial in study.trials if trial.state.name == "COMPLETE"]
    assert len(set(params)) == len(params)  # the same command on two machines samples different points


@pytest.mark.skipif(not os.environ.get("YT8M_TEST_POSTGRES_URL"),
                    reason="YT8M_TEST_POSTGRES_URL is not set: start a server with `.ci/postgres.sh start`")
def test_a_machine_killed_mid_trial_loses_nothing_of_a_shared_postgres_study(tmp_path, shards):
    """Two `yt8m tune` processes ("machines": each its own study dir) on one PostgreSQL study; one is killed with
    SIGKILL while its trial runs. The other re-queues that trial (its process is gone) and finishes the study."""
    url = os.environ["YT8M_TEST_POSTGRES_URL"]
    name = f"test-{uuid.uuid4().hex[:8]}"
    path = tune_file(tmp_path / "tune.yaml", shards, tune={"pruner": "none"}, num_epochs=12)
    storage = with_installed_driver(url)

    def machine(directory: str) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        return logged_to_file([sys.executable, "-m", "yt8m", "tune", "--config", path, "--n_trials", "4", "--storage",
                               url, "--study_name", name, "--study_dir", str(tmp_path / directory)],
                              tmp_path / f"{directory}.log", env=env)

    killed, survivor = machine("a"), machine("b")
    deadline = time.monotonic() + 240
    running = None
    while running is None and time.monotonic() < deadline and killed.poll() is None:
        time.sleep(0.2)
        if name in optuna.study.get_all_study_names(storage):
            running = next((trial for trial in load_study("", name, storage).trials if trial.state.name == "RUNNING"
                            and trial.user_attrs.get("worker", {}).get("pid") == killed.pid and trial.params), None)
    assert running is not None, "the first machine ran no trial"
    killed.kill()
    killed.communicate()
    summary = finish(survivor)
    study = load_study("", name, storage)
    trials = {trial.number: trial for trial in study.trials}
    assert summary["n_trials"]["complete"] == 4 and state_counts(study)["running"] == 0
    assert trials[running.number].state.name == "FAIL"
    assert "is gone (killed or crashed)" in interrupted_trials(study)[running.number]
    retry = [trial for trial in study.trials if trial.user_attrs.get("retry_of") == running.number]
    assert len(retry) == 1 and retry[0].state.name == "COMPLETE" and retry[0].params == running.params
    complete = [json.dumps(trial.params, sort_keys=True) for trial in study.trials if trial.state.name == "COMPLETE"]
    assert len(complete) == 4 and len(set(complete)) == 4  # no configuration trained twice


@pytest.mark.skipif(not os.environ.get("YT8M_TEST_POSTGRES_URL"),
                    reason="YT8M_TEST_POSTGRES_URL is not set: start a server with `.ci/postgres.sh start`")
def test_the_slurm_and_kubernetes_launchers_run_one_study_between_them(tmp_path, shards):
    """examples/slurm/tune_array.sbatch (run by bash as a task of the array) and examples/kubernetes/tune_job.yaml's
    container command (run by sh as its pod would), at once, on one study of the test server."""
    name = f"launch-{uuid.uuid4().hex[:8]}"
    path = tune_file(tmp_path / f"{name}.yaml", shards, tune={"pruner": "none"}, num_epochs=10)
    env = {**os.environ, "YT8M_STORAGE": os.environ["YT8M_TEST_POSTGRES_URL"], "YT8M_TUNE_CONFIG": path,
           "YT8M_STUDIES": str(tmp_path / "studies"),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    job = yaml.safe_load((REPO_ROOT / "examples" / "kubernetes" / "tune_job.yaml").read_text())
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert {entry["name"] for entry in container["env"]} == {"YT8M_STORAGE", "YT8M_TUNE_CONFIG", "YT8M_STUDIES"}
    pod_command = [*container["command"][:-1], "6"]  # its --n_trials, smaller
    assert container["command"][-2:] == ["--n_trials", "200"]
    array_task = ["bash", str(REPO_ROOT / "examples" / "slurm" / "tune_array.sbatch"), "--n_trials", "6"]
    processes = [logged_to_file(array_task, tmp_path / "task.log", env={**env, "SLURM_ARRAY_TASK_ID": "1"}),
                 logged_to_file(pod_command, tmp_path / "pod.log", env={**env, "JOB_COMPLETION_INDEX": "0"})]
    for process in processes:
        finish(process)
    assert sorted(folder.name for folder in (tmp_path / "studies" / name).iterdir()) == ["pod-0", "task-1"]
    study = load_study("", name, with_installed_driver(os.environ["YT8M_TEST_POSTGRES_URL"]))
    assert state_counts(study)["complete"] == 6 and len(worker_pids(study)) == 2


@pytest.mark.parametrize("report_every_steps, first_report, examples", [(0, 1, 240), (4, 4, 120)])
def test_pruning_stops_a_hopeless_trial(tmp_path, shards, capsys, report_every_steps, first_report, examples):
    """Reports each epoch (step = epochs done) or every 4 training steps (step = global step); 240 videos, batch 30.
    The pruner judges from the first complete trial on (or --pruner_startup_trials), at the first report, whatever
    TPE's n_startup_trials."""
    search = {"base_learning_rate": {"type": "float", "low": 1e-7, "high": 0.5, "log": True}}
    enqueue = [{"base_learning_rate": 0.1}, {"base_learning_rate": 1e-7}]
    path = tune_file(tmp_path / "tune.yaml", shards, search, model="LogisticModel", num_epochs=4,
                     tune={"enqueue": enqueue, "n_startup_trials": 8, "report_every_steps": report_every_steps})
    result = tune_in_process(capsys, "--config", path, "--n_trials", "2", "--study_name", "pruned")
    trials = load_study(result["study_dir"], "pruned").trials
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED"]
    assert list(trials[1].intermediate_values) == [first_report]
    assert trials[1].user_attrs["examples"] == examples and trials[0].user_attrs["examples"] == 4 * 240

    unpruned = tune_in_process(capsys, "--config", path, "--n_trials", "2", "--study_name", "unpruned",
                               "--pruner", "none")
    assert unpruned["n_trials"]["complete"] == 2
    # Told to wait for 2 complete trials, the median pruner lets the second run to its end.
    waiting = tune_in_process(capsys, "--config", path, "--n_trials", "2", "--study_name", "waiting",
                              "--pruner_startup_trials", "2")
    assert waiting["n_trials"]["complete"] == 2


def test_failing_trials_are_recorded_and_the_study_goes_on(tmp_path, shards, capsys):
    # A feature size the shards do not have passes the file's checks and fails its trial on the first record.
    sizes = ",".join(map(str, FEATURE_SIZES))
    wrong_sizes = f"{FEATURE_SIZES[0]},{FEATURE_SIZES[1] + 1}"
    search = {"feature_sizes": {"type": "categorical", "choices": [sizes, wrong_sizes]},
              "base_learning_rate": {"type": "categorical", "choices": [0.1, 1.0e+38]}}
    enqueue = [{"feature_sizes": wrong_sizes, "base_learning_rate": 0.1},
               {"feature_sizes": sizes, "base_learning_rate": 1.0e+38},
               {"feature_sizes": sizes, "base_learning_rate": 0.1}]
    path = tune_file(tmp_path / "tune.yaml", shards, search, model="LogisticModel", clip_gradient_norm=0.0,
                     tune={"enqueue": enqueue, "pruner": "none"})
    result = tune_in_process(capsys, "--config", path, "--n_trials", "3")
    assert result["n_trials"]["fail"] == 2 and result["n_trials"]["complete"] == 1
    trials = load_study(result["study_dir"]).trials
    assert f"expected float_list of {FEATURE_SIZES[1] + 1} values" in trials[0].user_attrs["fail_reason"]
    assert "the training loss is nan" in trials[1].user_attrs["fail_reason"]
    assert result["best_params"] == enqueue[2]



def test_a_trial_over_max_model_size_mb_is_pruned_before_it_trains_and_not_retried(tmp_path, shards, capsys):
    # MoeModel over 24 features and 8 classes: 1 mixture is 584 parameters (0.0022 MB), 3 are 1,368 (0.0052 MB).
    search = {"moe_num_mixtures": {"type": "int", "low": 1, "high": 3}}
    path = tune_file(tmp_path / "tune.yaml", shards, search, model="MoeModel", num_epochs=1, max_model_size_mb=0.004,
                     tune={"enqueue": [{"moe_num_mixtures": 3}, {"moe_num_mixtures": 1}], "pruner": "none"})
    result = tune_in_process(capsys, "--config", path, "--n_trials", "2")
    assert result["n_trials"] == {**result["n_trials"], "pruned": 1, "complete": 1, "fail": 0, "waiting": 0}
    too_large, fitting = load_study(result["study_dir"]).trials
    assert too_large.state.name == "PRUNED" and not too_large.intermediate_values
    assert ("--model MoeModel has 1,368 parameters, 0.005 MB, over --max_model_size_mb 0.004"
            in too_large.user_attrs["fail_reason"])
    assert not os.path.exists(too_large.user_attrs["train_dir"])
    assert fitting.state.name == "COMPLETE" and result["best_params"] == {"moe_num_mixtures": 1}
    assert "over --max_model_size_mb 0.004" in (Path(result["study_dir"]) / "leaderboard.txt").read_text()

# Resuming explores, interrupted points retry a bounded number of times -------------------------------------------

@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_resumed_study_samples_new_points_and_the_same_ones_on_the_same_history(tmp_path, shards, capsys,
                                                                                  sampler):
    """Each run used to re-seed the sampler with --seed: trials 2 and 3 re-ran the points of trials 0 and 1
    (TPE draws its first n_startup_trials at random too; trial 3 below is modelled by TPE)."""
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": SEARCH["base_learning_rate"]},
                     model="LogisticModel", num_epochs=1,
                     tune={"pruner": "none", "sampler": sampler, "n_startup_trials": 3})
    tune_in_process(capsys, "--config", path, "--n_trials", "2")
    shutil.copytree(tmp_path / "study", tmp_path / "copy")
    tune_in_process(capsys, "--config", path, "--n_trials", "4")
    tune_in_process(capsys, "--config", path, "--n_trials", "4", "--study_dir", str(tmp_path / "copy"))
    points = [trial.params for trial in load_study(tmp_path / "study").trials]
    assert len({params["base_learning_rate"] for params in points}) == 4
    assert [trial.params for trial in load_study(tmp_path / "copy").trials] == points


def test_the_retry_limit_holds_per_parameter_set(tmp_path):
    """An interrupted point is re-queued at most MAX_RETRIES (2) times, also when it comes back as a trial that
    is not a retry (e.g. sampled again): counted from the study's history, not from the re-queued trial."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="retries")
    point = {"x": 0.25}
    for _ in range(4):  # a fresh trial on the same point each time, as a resumed run sampling it again
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, params=point,
                                                  distributions={"x": optuna.distributions.FloatDistribution(0, 1)}))
        record_interruption(study, study.trials[-1], "interrupted: killed by the test")
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    # Trials 0 and 2 were re-queued (as 1 and 3: interruptions 1 and 2); trials 4 and 5 were not (3 and 4).
    assert [(t.system_attrs["fixed_params"], t.user_attrs["retry_of"], t.user_attrs["retries"]) for t in waiting] == [
        (point, 0, 1), (point, 2, 2)]
    assert len(study.trials) == 6


# A killed study leaves no orphaned jobs; best.yaml is current while trials run --------------------------------

def _children_of() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> set[int]:
    tree, found, frontier = _children_of(), set(), [pid]
    while frontier:
        for child in tree.get(frontier.pop(), []):
            found.add(child)
            frontier.append(child)
    return found


def running(pids: set[int]) -> set[int]:
    """The pids still alive (a zombie, dead but not reaped by its new parent, does not count)."""
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(pid)
        except OSError:
            pass
    return alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_study_leaves_no_orphaned_jobs_and_a_rerun_completes_it(tmp_path, shards):
    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": SEARCH["base_learning_rate"]},
                     tune={"pruner": "none"}, model="LogisticModel", num_epochs=40)
    study_dir = tmp_path / "study"
    log_path = tmp_path / "tune.log"  # the jobs inherit it: what they logged, should one outlive the kill
    with open(log_path, "w") as log_file:
        process = yt8m_process("tune", "--config", path, "--n_trials", "3", "--n_jobs", "2",
                               stdout=subprocess.DEVNULL, stderr=log_file)
    jobs: set[int] = set()
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            # trials/ appears once the study's tables exist; then wait for both jobs to run a trial.
            study = load_study(study_dir) if (study_dir / "trials").exists() else None
            if study is not None and len(worker_pids(study)) == 2:
                break
            time.sleep(0.1)
        assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING] * 2
        jobs = descendants(process.pid)
        assert worker_pids(study) <= jobs
        process.kill()
        process.wait()
        deadline = time.time() + 30  # each records its trial interrupted first: slow on a loaded machine
        while running(jobs) and time.time() < deadline:
            time.sleep(0.1)
        assert not running(jobs), \
            f"trial jobs outlived the killed `yt8m tune`; its log:\n{log_path.read_text()[-4000:]}"
    finally:
        process.kill()
        for pid in running(jobs):
            os.kill(pid, signal.SIGKILL)
    # They died with it: their trials are interrupted (FAIL, re-queued), or left RUNNING when the interrupt was
    # lost, and no other trial ran (orphans used to finish theirs and start more).
    states = optuna.trial.TrialState
    after_kill = load_study(study_dir).trials
    assert {t.state for t in after_kill[:2]} <= {states.FAIL, states.RUNNING}
    assert {t.state for t in after_kill[2:]} <= {states.WAITING}

    resumed = finish(yt8m_process("tune", "--config", path, "--n_trials", "3", "--n_jobs", "2",
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    assert resumed["n_trials"] == {"complete": 3, "pruned": 0, "fail": 0, "interrupted": 2, "running": 0,
                                   "waiting": 0}
    trials = load_study(study_dir).trials
    retried = {trial.user_attrs["retry_of"]: trial.params for trial in trials if "retry_of" in trial.user_attrs}
    assert retried == {0: trials[0].params, 1: trials[1].params}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and /proc")
def test_a_job_that_never_takes_its_stop_still_ends_after_the_grace(tmp_path):
    """A signal only asks a job's trial to stop at its next step; a job stuck where it never looks (a long call) is
    ended by its watchdog (exit 130) once the grace has passed, and a second SIGTERM meanwhile is ignored."""
    script = ("import os, time\n"
              "from yt8m.training.stopping import STOPS, noting_signals\n"
              "from yt8m.tuning.lifetime import note_interrupt, watch_over_job\n"
              "STOPS.on_signal = note_interrupt\n"
              "with noting_signals(again='ignore'):\n"
              "    watch_over_job(os.getppid(), 130, grace=1.0)\n"
              "    print('ready', flush=True)\n"
              "    while True:\n"
              "        time.sleep(0.05)  # stuck: never looks at STOPS\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    job = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert job.stdout is not None and job.stdout.readline() == "ready\n"
        job.send_signal(signal.SIGTERM)
        job.send_signal(signal.SIGTERM)  # ignored: the stop is under way
        assert job.wait(timeout=60) == 130
    finally:
        job.kill()


def test_stopping_jobs_kills_one_that_does_not_end_within_the_grace():
    class Job:
        def __init__(self, deaf: bool):
            self.deaf, self.alive, self.calls = deaf, True, []

        def terminate(self):
            self.calls.append("terminate")
            self.alive = self.deaf

        def kill(self):
            self.calls.append("kill")
            self.alive = False

        def join(self, timeout=None):
            self.calls.append("join")

        def is_alive(self):
            return self.alive

    from yt8m.tuning.lifetime import stop_jobs

    listening, deaf = Job(deaf=False), Job(deaf=True)
    stop_jobs([listening, deaf], grace=0.1)
    assert listening.calls == ["terminate", "join"]
    assert deaf.calls == ["terminate", "join", "kill", "join"] and not deaf.alive


STUDY_MARK = "YT8M_TEST_STUDY"  # set in a killed study's environment: its jobs (and their readers) inherit it


def processes_of(mark: str) -> set[int]:
    """The live processes whose environment holds STUDY_MARK=`mark` (spawned jobs' command lines name no study)."""
    wanted = f"{STUDY_MARK}={mark}".encode()
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if wanted in fh.read().split(b"\0"):
                    found.add(int(entry))
        except OSError:
            pass
    return running(found)


def wait_for_a_running_trial(study_dir: Path, process: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if (study_dir / "trials").exists():
            trials = load_study(study_dir).trials
            if any(t.state == optuna.trial.TrialState.RUNNING for t in trials):
                return
        time.sleep(0.2)
    raise AssertionError(f"no trial started running (the tune process's exit status: {process.poll()})")


KILL_ROUNDS = int(os.environ.get("YT8M_TEST_KILL_ROUNDS", "6"))


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_study_killed_at_random_points_leaves_no_process_and_a_rerun_completes_it(tmp_path, shards):
    """SIGTERM, SIGINT and SIGKILL of the tune process in turn, each at a random moment (starting up, spawning its
    jobs, mid-trial): every time, within the jobs' grace, no process of the study is left; a rerun completes it.
    KILL_ROUNDS times: 6 in the suite (two of each signal, about a minute), 20 for issue 35's proof
    (`YT8M_TEST_KILL_ROUNDS=20`, bench/README.md)."""
    import random

    path = tune_file(tmp_path / "tune.yaml", shards, {"base_learning_rate": SEARCH["base_learning_rate"]},
                     tune={"pruner": "none"}, model="LogisticModel", num_epochs=40)
    # A study that cannot finish while it is being killed, however fast the machine trains: the rerun sets the end.
    argv = ("tune", "--config", path, "--n_trials", "1000", "--n_jobs", "2")
    mark = uuid.uuid4().hex
    rng = random.Random(35)
    kinds = (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)
    for round_ in range(KILL_ROUNDS):
        with open(tmp_path / "tune.log", "w") as log_file:
            process = yt8m_process(*argv, stdout=subprocess.DEVNULL, stderr=log_file, env_extra={STUDY_MARK: mark})
        if round_ % 2:  # mid-trial: a moment into a running trial
            try:
                wait_for_a_running_trial(tmp_path / "study", process)
            except AssertionError as err:
                raise AssertionError(f"round {round_}: {err}; its log:\n{(tmp_path / 'tune.log').read_text()[-4000:]}")
            time.sleep(rng.uniform(0.0, 3.0))
        else:  # anywhere: starting up, spawning the jobs, opening the study, training
            time.sleep(rng.uniform(0.0, 10.0))
        # Each signal lands on a running study: a trial (some 10 s) outlasts the waits after one starts.
        assert process.poll() is None, f"round {round_}: the study ended before its signal"
        process.send_signal(kinds[round_ % 3])
        try:
            process.wait(timeout=90)  # a SIGTERM or SIGINT lets it stop its jobs and write the report
        finally:
            process.kill()
        deadline = time.time() + 30  # the jobs' grace (10 s) and their watchdog's poll, on a loaded machine
        while processes_of(mark) and time.time() < deadline:
            time.sleep(0.2)
        left = processes_of(mark)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, (f"round {round_} ({kinds[round_ % 3].name}): {len(left)} process(es) of the study "
                          f"outlived it; its log:\n{(tmp_path / 'tune.log').read_text()[-4000:]}")
    states = [t.state for t in load_study(tmp_path / "study").trials]
    # Enough trials that every re-queued one (waiting, or left running by a kill and re-queued when the rerun
    # opens the study) runs, and one new.
    target = sum(states.count(state) for state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.WAITING,
                                                   optuna.trial.TrialState.RUNNING)) + 1
    resumed = finish(yt8m_process(*argv[:3], "--n_trials", str(target), *argv[5:], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE))
    counts = resumed["n_trials"]
    assert counts["interrupted"] >= 1, counts  # kills landed mid-trial
    assert (counts["complete"], counts["running"], counts["waiting"]) == (target, 0, 0), counts
    completed = [t for t in load_study(tmp_path / "study").trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(completed) == target


def test_best_yaml_and_the_leaderboard_follow_each_finished_trial(tmp_path, shards):
    """Written when a trial finishes, not only when the run ends: here while trial 2 trains, they already name
    trial 1, better than trial 0."""
    search = {"base_learning_rate": {"type": "categorical", "choices": [1e-7, 0.1]},
              "num_epochs": {"type": "categorical", "choices": [1, 50]}}
    enqueue = [{"base_learning_rate": 1e-7, "num_epochs": 1}, {"base_learning_rate": 0.1, "num_epochs": 1},
               {"base_learning_rate": 0.1, "num_epochs": 50}]
    path = tune_file(tmp_path / "tune.yaml", shards, search, model="LogisticModel",
                     tune={"enqueue": enqueue, "pruner": "none"})
    study_dir = tmp_path / "study"
    process = yt8m_process("tune", "--config", path, "--n_trials", "3", stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            trials = load_study(study_dir).trials if (study_dir / "trials").exists() else []
            # Optuna reads a trial's state and its reports in separate queries: a snapshot can show the reports of a
            # trial whose state it read as WAITING just before the trial started, so both are waited for.
            if len(trials) == 3 and trials[2].intermediate_values and \
                    trials[2].state == optuna.trial.TrialState.RUNNING:
                break
            time.sleep(0.1)
        assert process.poll() is None and trials[2].state == optuna.trial.TrialState.RUNNING
        best = saved_values(study_dir / "best.yaml")
        assert (best["base_learning_rate"], best["num_epochs"]) == (0.1, 1)
        assert best["train_dir"] == str(study_dir / "best")
        board = (study_dir / "leaderboard.txt").read_text().splitlines()
        assert [line.split()[:2] for line in board[1:]] == [["1", "COMPLETE"], ["0", "COMPLETE"], ["2", "WAITING"]]
    finally:
        process.kill()
        process.wait()


# Bad tuning files and storage URLs: one error before any trial --------------------------------------------------

def run_yt8m(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "yt8m", *argv], env=env, text=True, capture_output=True,
                          timeout=120)


def test_the_train_section_is_checked_like_a_train_config_before_the_study_starts(tmp_path, shards):
    """`batch_size: -5` used to fail every trial; a misspelt model among the choices is named too."""
    search = {"model": {"type": "categorical", "choices": ["LogisticModel", "MoeModl"]},
              "num_epochs": {"type": "categorical", "choices": [1, 0]}}
    path = tune_file(tmp_path / "tune.yaml", shards, search, batch_size=-5)
    result = run_yt8m("tune", "--config", path, "--n_trials", "1")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    error = result.stderr[result.stderr.index("yt8m tune: error:"):]
    assert "batch_size" in error and "-5" in error
    assert "MoeModl" in error
    assert "search.num_epochs value 0" in error
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize("storage, expected", [
    ("postgresql://yt8m:s3cret@127.0.0.1:1/db", "cannot open the study database postgresql://yt8m:***@127.0.0.1:1/db"),
    ("foo://x", "SQLAlchemy knows no database 'foo'"),
    ("mysql://yt8m:s3cret@127.0.0.1/db", "its database driver is not installed"),
    ("not a url", "--storage not a url is not a database URL"),
])
def test_an_unusable_storage_is_one_line_error(tmp_path, shards, storage, expected):
    path = tune_file(tmp_path / "tune.yaml", shards)
    result = run_yt8m("tune", "--config", path, "--storage", storage)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("yt8m tune: error: ") and expected in lines[0], result.stderr
    assert "s3cret" not in result.stderr


@pytest.mark.parametrize("text", ["train: [unclosed\n", "train: !!python/object/apply:os.getcwd []\n"])
def test_a_yaml_error_in_the_tuning_file_is_one_line_error(tmp_path, text):
    (tmp_path / "tune.yaml").write_text(text)
    result = run_yt8m("tune", "--config", str(tmp_path / "tune.yaml"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("yt8m tune: error: ") and "tune.yaml" in lines[0], result.stderr


def test_a_signal_anywhere_only_asks_to_stop_and_raises_nothing():
    """A SIGTERM used to raise KeyboardInterrupt wherever the main thread was, a finalizer included (where Python
    only prints it, and the job went on training). Now it notes a stop request, which the loop takes between steps:
    the code it lands in goes on, and the request is there to read."""
    script = ("import os, signal\n"
              "from yt8m.training.stopping import STOPS, noting_signals\n"
              "class Finalized:\n"
              "    def __del__(self):\n"
              "        os.kill(os.getpid(), signal.SIGTERM)\n"
              "with noting_signals():\n"
              "    Finalized()\n"
              "    print('went on', flush=True)\n"
              "    print(STOPS.reason().message, flush=True)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", script], env=env, text=True, capture_output=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "went on\nstopped by SIGTERM\n"), result.stderr
    assert "Traceback" not in result.stderr
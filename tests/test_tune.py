"""`yt8m tune` and `yt8m tune-report` on tiny synthetic shards: the tuning file and its one-error validation,
resuming (also after a SIGKILL), parallel jobs, pruning, failing trials, the report and best.yaml.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
import yaml

from yt8m import cli
from yt8m.tune.space import TuneSettings, load_tune_spec
from yt8m.tune.objective import TrialObjective
from yt8m.tune.study import (
    BudgetLock,
    create_pruner,
    create_sampler,
    interrupted_trials,
    open_storage,
    open_study,
    state_counts,
    with_installed_driver,
    worker_identity,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
NUM_CLASSES = 8
FEATURE_SIZES = (16, 8)
SEARCH = {
    "model": {"type": "categorical", "choices": ["LogisticModel", "MoeModel"]},
    "base_learning_rate": {"type": "float", "low": 1e-3, "high": 0.3, "log": True},
    "moe_num_mixtures": {"type": "int", "low": 1, "high": 3, "when": {"model": "MoeModel"}},
}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    from yt8m.data.synthetic import write_synthetic

    root = tmp_path_factory.mktemp("synthetic")
    write_synthetic(str(root), kind="video", num_classes=NUM_CLASSES, train_videos=240, validate_videos=120,
                    test_videos=0, shards=2, feature_sizes=FEATURE_SIZES, seed=3)
    return root / "video"


def tune_file(path: Path, shards: Path, search: dict = SEARCH, tune: dict | None = None, **train) -> str:
    document = {
        "train": {"train_data_pattern": str(shards / "train-*.tfrecord"),
                  "eval_data_pattern": str(shards / "validate-*.tfrecord"),
                  "feature_names": "mean_rgb,mean_audio", "feature_sizes": ",".join(map(str, FEATURE_SIZES)),
                  "num_classes": NUM_CLASSES, "batch_size": 30, "num_epochs": 2, "num_readers": 0,
                  "log_every_steps": 100, **train},
        "search": search,
        "objective": {"metric": "gap", "direction": "maximize"},
        "tune": {"study_dir": str(path.parent / "study"), "n_startup_trials": 1, **(tune or {})},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def tune_in_process(capsys, *argv: str) -> dict:
    assert cli.main(["tune", *argv]) == 0, capsys.readouterr().err[-3000:]
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def yt8m_process(*argv: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "yt8m", *argv], env=env, text=True, **popen)


def finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


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
    path = tune_file(tmp_path / "tune.yaml", shards, search, tune={"sampler": "annealing"}, learning_rate=0.1)
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
                     "search.batch_size: 'when' refers to 'optimizer', which is not a field searched above it",
                     "search.num_epochs: 'num_epochs' holds integers; use type: int",
                     "objective.metric 'accuracy' is not a validation metric",
                     "tune.sampler 'annealing'", "tune.pruner 'sometimes'"]:
        assert expected in err
    assert "10 problem(s)" in err
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize("name", ["tune_video.yaml", "tune_frame.yaml"])
def test_example_configs_are_valid(name):
    spec = load_tune_spec(str(REPO_ROOT / "configs" / name))
    assert spec.search and spec.enqueue and spec.settings.study_dir == os.path.join("studies", name[:-5])


def test_when_makes_a_field_conditional(tmp_path, shards):
    spec = load_tune_spec(tune_file(tmp_path / "tune.yaml", shards))
    logistic = spec.sample(optuna.trial.FixedTrial({"model": "LogisticModel", "base_learning_rate": 0.01}))
    moe = spec.sample(optuna.trial.FixedTrial({"model": "MoeModel", "base_learning_rate": 0.01,
                                               "moe_num_mixtures": 3}))
    assert logistic == {"model": "LogisticModel", "base_learning_rate": 0.01}
    assert moe["moe_num_mixtures"] == 3
    config = spec.trial_config(moe, str(tmp_path / "trial"))
    assert (config.model, config.moe_num_mixtures, config.num_classes) == ("MoeModel", 3, NUM_CLASSES)
    assert config.start_new_model and config.train_dir == str(tmp_path / "trial")


def test_flags_override_the_file_and_names_default_from_it(tmp_path, shards):
    path = tune_file(tmp_path / "video_search.yaml", shards, tune={"n_trials": 3, "sampler": "tpe"})
    document = yaml.safe_load(Path(path).read_text())
    del document["tune"]["study_dir"]
    Path(path).write_text(yaml.safe_dump(document))
    settings = load_tune_spec(path, {"n_trials": 7, "sampler": "random"}).settings
    assert (settings.n_trials, settings.sampler) == (7, "random")
    assert settings.study_name == "video_search"
    assert settings.study_dir == os.path.join("studies", "video_search")


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_samplers_are_seeded(tmp_path, shards, sampler):
    spec = load_tune_spec(tune_file(tmp_path / "tune.yaml", shards))

    def sampled(seed: int) -> list[dict]:
        settings = TuneSettings(sampler=sampler, seed=seed, n_startup_trials=2)
        study = optuna.create_study(sampler=create_sampler(settings), direction="maximize")
        study.optimize(lambda trial: spec.sample(trial)["base_learning_rate"], n_trials=5)
        return [trial.params for trial in study.trials]

    assert sampled(1) == sampled(1)
    assert sampled(1) != sampled(2)


def test_pruner_choice():
    expected = {"median": optuna.pruners.MedianPruner, "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
                "hyperband": optuna.pruners.HyperbandPruner, "none": optuna.pruners.NopPruner}
    for name, cls in expected.items():
        assert type(create_pruner(TuneSettings(pruner=name), num_epochs=3)) is cls


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

    # --keep_best 1: only the best trial keeps its checkpoints.
    with_checkpoints = sorted(p.parent.name for p in study_dir.glob("trials/trial-*/checkpoints"))
    assert with_checkpoints == [f"trial-{more['best_trial']}"]

    assert cli.main(["tune-report", str(study_dir)]) == 0
    out = capsys.readouterr().out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["best_value"] == more["best_value"]
    assert "trial  state     gap" in out and "COMPLETE" in out
    for name in ("optimization_history", "intermediate_values", "parallel_coordinate", "param_importances"):
        assert Path(report["plots"][name]).stat().st_size > 0
    best = yaml.safe_load((study_dir / "best.yaml").read_text())
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
                     tune={"pruner": "none"}, model="LogisticModel", num_epochs=12)
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
    study, other_job = (open_study(spec, open_storage(spec.settings), job) for job in (0, 1))
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

    class Lock(BudgetLock):
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
    # Two "machines": each its own study dir, one database.
    processes = [yt8m_process("tune", "--config", path, "--n_trials", "4", "--storage", url, "--study_name", name,
                              "--study_dir", str(tmp_path / machine), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for machine in ("a", "b")]
    for process in processes:
        finish(process)
    study = load_study("", name, with_installed_driver(url))
    counts = state_counts(study)  # surplus trials of a race between the machines would be "interrupted"
    assert counts["complete"] == 4 and counts["fail"] == counts["running"] == counts["waiting"] == 0
    assert len(worker_pids(study)) == 2
    params = [json.dumps(trial.params, sort_keys=True) for trial in study.trials]
    assert len(set(params)) == len(params)  # the same command on two machines samples different points


@pytest.mark.parametrize("report_every_steps, first_report, examples", [(0, 1, 240), (4, 4, 120)])
def test_pruning_stops_a_hopeless_trial(tmp_path, shards, capsys, report_every_steps, first_report, examples):
    """Reports each epoch (step = epochs done) or every 4 training steps (step = global step); 240 videos, batch 30."""
    search = {"base_learning_rate": {"type": "float", "low": 1e-7, "high": 0.5, "log": True}}
    enqueue = [{"base_learning_rate": 0.1}, {"base_learning_rate": 1e-7}]
    path = tune_file(tmp_path / "tune.yaml", shards, search, model="LogisticModel", num_epochs=4,
                     tune={"enqueue": enqueue, "n_startup_trials": 1, "report_every_steps": report_every_steps})
    result = tune_in_process(capsys, "--config", path, "--n_trials", "2", "--study_name", "pruned")
    trials = load_study(result["study_dir"], "pruned").trials
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED"]
    assert list(trials[1].intermediate_values) == [first_report]
    assert trials[1].user_attrs["examples"] == examples and trials[0].user_attrs["examples"] == 4 * 240

    unpruned = tune_in_process(capsys, "--config", path, "--n_trials", "2", "--study_name", "unpruned",
                               "--pruner", "none")
    assert unpruned["n_trials"]["complete"] == 2


def test_failing_trials_are_recorded_and_the_study_goes_on(tmp_path, shards, capsys):
    search = {"optimizer": {"type": "categorical", "choices": ["SGD", "NoSuchOptimizer"]},
              "base_learning_rate": {"type": "categorical", "choices": [0.1, 1.0e+38]}}
    enqueue = [{"optimizer": "NoSuchOptimizer", "base_learning_rate": 0.1},
               {"optimizer": "SGD", "base_learning_rate": 1.0e+38},
               {"optimizer": "SGD", "base_learning_rate": 0.1}]
    path = tune_file(tmp_path / "tune.yaml", shards, search, model="LogisticModel", clip_gradient_norm=0.0,
                     tune={"enqueue": enqueue, "pruner": "none"})
    result = tune_in_process(capsys, "--config", path, "--n_trials", "3")
    assert result["n_trials"]["fail"] == 2 and result["n_trials"]["complete"] == 1
    trials = load_study(result["study_dir"]).trials
    assert "NoSuchOptimizer" in trials[0].user_attrs["fail_reason"]
    assert "nan" in trials[1].user_attrs["fail_reason"].lower()
    assert result["best_params"] == enqueue[2]

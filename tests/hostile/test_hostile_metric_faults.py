"""A metric of one's own that fails at run time (raises in compute or update, returns a string, returns nan), from
`yt8m train`, `yt8m eval` and `yt8m tune` as a user runs them: one line naming the metric and the call, and a nan
never a best value (not the run's, not a trial's)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from cli_outcome import yt8m  # noqa: F401  (a fixture)

from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, tiny_data  # noqa: F401  (a fixture)

pytestmark = pytest.mark.hostile

METRICS = '''
import math
import os


class Counting:
    higher_is_better = True

    def __init__(self, num_classes):
        self.videos = 0

    def update(self, predictions, labels):
        self.videos += len(predictions)

    def merge(self, other):
        self.videos += other.videos


class Raises(Counting):
    def compute(self):
        return self.videos / 0


class RaisesInUpdate(Counting):
    def update(self, predictions, labels):
        raise KeyError("labels")

    def compute(self):
        return 0.0


class Stringy(Counting):
    def compute(self):
        return "high"


class NotANumber(Counting):
    def compute(self):
        return math.nan


class FailsOnce(Counting):
    """Fails in the first process that evaluates with it (a marker file in the working directory), then finite."""

    def compute(self):
        if not os.path.exists("failed_once"):
            open("failed_once", "w").close()
            return self.failure()
        return self.videos / 1000


class NanOnce(FailsOnce):
    def failure(self):
        return math.nan


class RaisesOnce(FailsOnce):
    def failure(self):
        raise RuntimeError("a bug of the metric's own")


class StringOnce(FailsOnce):
    def failure(self):
        return "high"
'''

FAULTS = [
    ("Raises", "metric mymetrics:Raises: Raises.compute raised ZeroDivisionError: division by zero (at "),
    ("RaisesInUpdate", "metric mymetrics:RaisesInUpdate: RaisesInUpdate.update raised KeyError: 'labels' (at "),
    ("Stringy", "metric mymetrics:Stringy: Stringy.compute returned 'high' (a str), not a number"),
    ("NotANumber", "metric mymetrics:NotANumber: NotANumber.compute returned nan: a value must be a finite number"),
]


@pytest.fixture
def user_dir(tmp_path) -> Path:
    (tmp_path / "mymetrics.py").write_text(METRICS)
    return tmp_path


def train(yt8m, user_dir: Path, data: dict, *flags: str):
    return yt8m("train", "--train_data_pattern", data["train_pattern"], "--eval_data_pattern",
                data["validate_pattern"], "--train_dir", str(user_dir / "run"), "--feature_names",
                "mean_rgb,mean_audio", "--feature_sizes", ",".join(map(str, FEATURE_SIZES)), "--num_classes",
                str(NUM_CLASSES), "--batch_size", "60", "--num_epochs", "1", "--num_readers", "0", *flags,
                cwd=str(user_dir), timeout=120)


@pytest.mark.parametrize("flag, metric, line", [("--metrics", *fault) for fault in FAULTS]
                         + [("--best_metric", *FAULTS[3])],
                         ids=[metric for metric, _ in FAULTS] + ["NotANumber as --best_metric"])
def test_a_failing_metric_in_training_is_one_line_naming_it(yt8m, user_dir, tiny_data, flag, metric, line):
    outcome = train(yt8m, user_dir, tiny_data, flag, f"mymetrics:{metric}")
    error = outcome.assert_clean_error(line)
    if metric.startswith("Raises"):
        assert "mymetrics.py:" in error  # where the user's code raised
    assert not list((user_dir / "run").rglob("metrics.json"))  # nothing exported or recorded on it


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_data) -> Path:
    """A run trained without metrics of one's own, which eval is then asked for."""
    from yt8m import train as train_in_process

    run = tmp_path_factory.mktemp("trained") / "run"
    train_in_process(train_data_pattern=tiny_data["train_pattern"], train_dir=str(run), num_classes=NUM_CLASSES,
                     feature_names="mean_rgb,mean_audio", feature_sizes=",".join(map(str, FEATURE_SIZES)),
                     batch_size=60, num_epochs=1, num_readers=0)
    return run


@pytest.mark.parametrize("metric, line", FAULTS, ids=[metric for metric, _ in FAULTS])
def test_a_failing_metric_in_eval_is_one_line_naming_it(yt8m, user_dir, tiny_data, trained_run, metric, line):
    outcome = yt8m("eval", "--train_dir", str(trained_run), "--eval_data_pattern", tiny_data["validate_pattern"],
                   "--run_once", "--metrics", f"mymetrics:{metric}", cwd=str(user_dir), timeout=120)
    outcome.assert_clean_error(line)


@pytest.mark.parametrize("metric, line", [
    ("NanOnce", "NanOnce.compute returned nan"),
    ("RaisesOnce", "RaisesOnce.compute raised RuntimeError: a bug of the metric's own (at "),
    ("StringOnce", "StringOnce.compute returned 'high' (a str), not a number"),
])
def test_a_trial_whose_metric_fails_fails_with_that_line_and_the_study_goes_on(yt8m, user_dir, tiny_data, metric,
                                                                              line):
    document = {
        "train": {"train_data_pattern": tiny_data["train_pattern"], "eval_data_pattern": tiny_data["validate_pattern"],
                  "feature_names": "mean_rgb,mean_audio", "feature_sizes": ",".join(map(str, FEATURE_SIZES)),
                  "num_classes": NUM_CLASSES, "batch_size": 60, "num_epochs": 1, "num_readers": 0},
        "search": {"base_learning_rate": {"type": "float", "low": 0.001, "high": 0.1, "log": True}},
        "objective": {"metric": f"mymetrics:{metric}", "direction": "maximize"},
        "tune": {"study_dir": str(user_dir / "study"), "n_trials": 2, "pruner": "none"},
    }
    (user_dir / "tune.yaml").write_text(yaml.safe_dump(document))
    outcome = yt8m("tune", "--config", str(user_dir / "tune.yaml"), cwd=str(user_dir), timeout=300)
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{user_dir / 'study' / 'study.db'}")
    failed, complete = (sorted(study.get_trials(states=[state]), key=lambda t: t.number)
                        for state in (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE))
    assert [trial.number for trial in failed] == [0]
    assert line in failed[0].user_attrs["fail_reason"]
    assert [trial.number for trial in complete] == [1] and 0 < complete[0].value < 1
    assert study.best_value == complete[0].value
    assert outcome.assert_success()["best_value"] == complete[0].value  # the command's summary

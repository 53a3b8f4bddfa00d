"""`yt8m ensemble` through the CLI on tiny synthetic data: runs, ONNX exports and CSV / JSON-lines prediction files;
fitted weights (never below any input's GAP); output identical to `yt8m predict`'s; missing videos named; and
`yt8m tune-report --ensemble_top K` on a tiny study."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
import yaml

from workflow_fixtures import NUM_CLASSES, tiny_data, tiny_train_config, trained_dir  # noqa: F401  (fixtures)
from yt8m.cli import main as cli_main
from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset
from yt8m.eval.metrics import EvaluationMetrics, calculate_gap
from yt8m.inference.ensemble import FitObjective, fit_ensemble, fit_weights, opened_inputs
from yt8m.io.checkpoints import latest_checkpoint
from yt8m.models.checkpoints import build_model_from_checkpoint
from yt8m.tasks.metrics import METRICS, register_metric

SPEC = FeatureSpec(["mean_rgb", "mean_audio"], [16, 8], frame_features=False, num_classes=NUM_CLASSES)


@pytest.fixture(scope="module")
def second_run(tiny_data, tmp_path_factory) -> Path:
    """A LogisticModel run on the same data (a weaker, different input), with exports of its evaluations."""
    from yt8m.training import train

    train_dir = tmp_path_factory.mktemp("second") / "run"
    train(tiny_train_config(tiny_data, train_dir, model="LogisticModel", num_epochs=2, seed=11,
                            eval_data_pattern=tiny_data["validate_pattern"]))
    return train_dir


def run_cli(capsys, *argv: str) -> dict:
    assert cli_main(list(argv)) == 0, capsys.readouterr().err[-3000:]
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def ensemble(capsys, data: dict, *argv: str) -> dict:
    return run_cli(capsys, "ensemble", *argv, "--num_classes", str(NUM_CLASSES), "--num_readers", "0")


def predict(capsys, data: dict, train_dir: Path, split: str, output: Path, *extra: str) -> dict:
    return run_cli(capsys, "predict", "--train_dir", str(train_dir), "--input_data_pattern", data[f"{split}_pattern"],
                   "--output_file", str(output), "--num_readers", "0", *extra)


@pytest.mark.parametrize("output_format", ["csv", "jsonl"])
def test_one_run_alone_writes_exactly_what_predict_writes(tiny_data, trained_dir, second_run, tmp_path, capsys,
                                                         output_format):
    predicted, combined = tmp_path / f"predict.{output_format}", tmp_path / f"ensemble.{output_format}"
    predict(capsys, tiny_data, trained_dir, "test", predicted, "--top_k", "5", "--output_format", output_format)
    summary = ensemble(capsys, tiny_data, str(trained_dir), str(second_run), "--weights", "1,0",
                       "--input_data_pattern", tiny_data["test_pattern"], "--output_file", str(combined),
                       "--top_k", "5", "--output_format", output_format)
    assert combined.read_bytes() == predicted.read_bytes()
    assert summary["videos"] == 48 and [i["weight"] for i in summary["inputs"]] == [1.0, 0.0]


def test_fitted_weights_score_at_least_every_input_and_the_file_is_a_submission(tiny_data, trained_dir, second_run,
                                                                               tmp_path, capsys):
    output = tmp_path / "ensemble.csv"
    summary = ensemble(capsys, tiny_data, str(trained_dir), str(second_run), "--fit_weights_on",
                       tiny_data["validate_pattern"], "--input_data_pattern", tiny_data["validate_pattern"],
                       "--output_file", str(output))
    fit = summary["fit"]
    assert fit["videos"] == 64 and sum(fit["weights"]) == pytest.approx(1.0)
    assert all(fit["ensemble"]["gap"] >= single["gap"] for single in fit["inputs"])
    assert fit["ensemble"]["gap"] >= fit["equal_weights_gap"]
    # Each input's validation GAP is the one `yt8m eval` reports for its final checkpoint.
    evaluated = run_cli(capsys, "eval", "--train_dir", str(trained_dir), "--eval_data_pattern",
                        tiny_data["validate_pattern"], "--run_once", "--num_readers", "0")
    assert fit["inputs"][0]["gap"] == pytest.approx(evaluated["gap"], abs=1e-6)
    # The written file scores as the fit said, with `yt8m score`.
    scored = run_cli(capsys, "score", "--predictions", str(output), "--labels", tiny_data["validate_labels"],
                     "--num_classes", str(NUM_CLASSES))
    assert scored["gap"] == pytest.approx(fit["ensemble"]["gap"], abs=1e-4)


def test_prediction_files_csv_and_jsonl_ensemble_as_their_runs(tiny_data, trained_dir, second_run, tmp_path, capsys):
    csv_file, jsonl_file = tmp_path / "first.csv", tmp_path / "second.jsonl"
    predict(capsys, tiny_data, trained_dir, "test", csv_file, "--top_k", str(NUM_CLASSES))
    predict(capsys, tiny_data, second_run, "test", jsonl_file, "--top_k", str(NUM_CLASSES), "--output_format", "jsonl")
    from_files, from_runs = tmp_path / "files.jsonl", tmp_path / "runs.jsonl"
    summary = ensemble(capsys, tiny_data, str(csv_file), str(jsonl_file), "--weights", "0.7,0.3", "--output_file",
                       str(from_files), "--output_format", "jsonl")
    assert [i["kind"] for i in summary["inputs"]] == ["predictions", "predictions"] and summary["videos"] == 48
    ensemble(capsys, tiny_data, str(trained_dir), str(second_run), "--weights", "0.7,0.3", "--input_data_pattern",
             tiny_data["test_pattern"], "--output_file", str(from_runs), "--output_format", "jsonl")
    files_rows = [json.loads(line) for line in from_files.read_text().splitlines()]
    runs_rows = {row["video_id"]: row for row in map(json.loads, from_runs.read_text().splitlines())}
    assert len(files_rows) == len(runs_rows) == 48
    for row in files_rows:  # the files hold 6 decimals
        expected = runs_rows[row["video_id"]]
        assert row["predictions"] == pytest.approx(expected["predictions"], abs=2e-6)
        assert row["class_indexes"][:3] == expected["class_indexes"][:3]


def test_a_small_top_k_file_warns_and_its_unlisted_classes_count_zero(tiny_data, trained_dir, tmp_path, capsys,
                                                                      caplog):
    listed = tmp_path / "top2.csv"
    predict(capsys, tiny_data, trained_dir, "test", listed, "--top_k", "2")
    output = tmp_path / "out.csv"
    ensemble(capsys, tiny_data, str(listed), str(listed), "--output_file", str(output), "--top_k", "4")
    assert "lists at most 2 classes per video" in caplog.text
    for line in output.read_text().splitlines()[1:]:
        values = [float(v) for v in line.split(",")[1].split()[1::2]]
        assert len(values) == 4 and values[2:] == [0.0, 0.0]


def test_onnx_exports_and_training_exports_are_inputs(tiny_data, trained_dir, second_run, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    onnx_dir = tmp_path / "onnx"
    run_cli(capsys, "export", "--train_dir", str(trained_dir), "--output", str(onnx_dir))
    best = sorted((second_run / "export" / "best").iterdir())[-1]
    from_exports, from_runs = tmp_path / "exports.csv", tmp_path / "runs.csv"
    summary = ensemble(capsys, tiny_data, str(onnx_dir), str(best), "--input_data_pattern", tiny_data["test_pattern"],
                       "--output_file", str(from_exports))
    assert [i["kind"] for i in summary["inputs"]] == ["export", "run"]
    ensemble(capsys, tiny_data, str(trained_dir), str(best), "--input_data_pattern", tiny_data["test_pattern"],
             "--output_file", str(from_runs))
    exported_rows, run_rows = from_exports.read_text().splitlines(), from_runs.read_text().splitlines()
    assert [row.split(",")[0] for row in exported_rows] == [row.split(",")[0] for row in run_rows]
    for exported_row, run_row in zip(exported_rows[1:], run_rows[1:]):
        assert [float(v) for v in exported_row.split(",")[1].split()[1::2]] == pytest.approx(
            [float(v) for v in run_row.split(",")[1].split()[1::2]], abs=2e-6)


def test_a_video_missing_from_an_input_is_named_and_nothing_is_written(tiny_data, trained_dir, tmp_path, capsys):
    complete = tmp_path / "complete.csv"
    predict(capsys, tiny_data, trained_dir, "test", complete, "--top_k", str(NUM_CLASSES))
    lines = complete.read_text().splitlines()
    short = tmp_path / "short.csv"
    short.write_text("\n".join(lines[:1] + lines[8:]) + "\n")  # the first 7 videos left out
    output = tmp_path / "out.csv"
    argv = ["ensemble", str(trained_dir), str(short), "--num_classes", str(NUM_CLASSES), "--num_readers", "0",
            "--input_data_pattern", tiny_data["test_pattern"], "--output_file", str(output)]
    assert cli_main(argv) == 1
    error = capsys.readouterr().err
    missing = [line.split(",")[0] for line in lines[1:6]]
    assert f"{short}: 7 of the 48 videos of {tiny_data['test_pattern']} are missing" in error
    assert all(repr(video_id) in error for video_id in missing) and "and 2 more" in error
    assert not output.exists()
    # Among prediction files alone, the first one's videos are the ones every other must hold.
    assert cli_main(["ensemble", str(complete), str(short), "--num_classes", str(NUM_CLASSES), "--output_file",
                     str(output)]) == 1
    assert f"{short}: 7 of the 48 videos of {complete} are missing" in capsys.readouterr().err


def test_extra_videos_of_a_file_are_ignored_and_counted(tiny_data, trained_dir, tmp_path, capsys):
    both = tmp_path / "both.csv"
    predict(capsys, tiny_data, trained_dir, "test", both, "--top_k", str(NUM_CLASSES))
    validate = tmp_path / "validate.csv"
    predict(capsys, tiny_data, trained_dir, "validate", validate, "--top_k", str(NUM_CLASSES))
    with open(both, "a") as out:
        out.writelines(validate.read_text().splitlines(keepends=True)[1:])
    summary = ensemble(capsys, tiny_data, str(trained_dir), str(both), "--input_data_pattern",
                       tiny_data["test_pattern"], "--output_file", str(tmp_path / "out.csv"))
    assert summary["videos"] == 48 and summary["ignored_videos"] == {str(both): 64}


def test_bad_weights_are_one_error(tiny_data, trained_dir, tmp_path, capsys):
    for weights, expected in (("1", "--weights lists 1 weights for 2 inputs"),
                              ("1,-1", "--weights must be finite, non-negative")):
        assert cli_main(["ensemble", str(trained_dir), str(trained_dir), "--weights", weights, "--output_file",
                         str(tmp_path / "out.csv"), "--input_data_pattern", tiny_data["test_pattern"]]) == 1
        assert expected in capsys.readouterr().err


def weighted_predictions(data: dict, train_dirs: list[str], weights: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """The runs' probabilities on the validation shards mixed by `weights`, computed here from each run's own
    predictions of every class (not through yt8m's ensemble), and the labels."""
    labels = torch.cat([batch.labels for batch in YT8MDataset(data["validate_pattern"], SPEC, 64)]).numpy()
    mixed = 0
    for train_dir, weight in zip(train_dirs, weights):
        model = build_model_from_checkpoint(latest_checkpoint(train_dir)).network
        with torch.no_grad():
            mixed = mixed + weight * torch.cat([model(batch.features)["predictions"]
                                                for batch in YT8MDataset(data["validate_pattern"], SPEC, 64)]).numpy()
    return mixed, labels


def weighted_gap(data: dict, train_dirs: list[str], weights: list[float]) -> float:
    """GAP@20 on the validation shards of the runs' probabilities mixed by `weights`."""
    return calculate_gap(*weighted_predictions(data, train_dirs, weights))


def weighted_map(data: dict, train_dirs: list[str], weights: list[float]) -> float:
    """mAP (over the classes with labels) on the validation shards of the runs' probabilities mixed by `weights`."""
    mixed, labels = weighted_predictions(data, train_dirs, weights)
    with EvaluationMetrics(NUM_CLASSES, 20) as metrics:
        metrics.accumulate(mixed.astype(np.float32), labels)
        return metrics.get()["map"]


def test_fit_weights_climbs_to_the_best_mix_deterministically():
    def gap(weights: list[float]) -> float:  # best at (0.25, 0.75, 0)
        return -((weights[0] - 0.25) ** 2 + (weights[1] - 0.75) ** 2 + weights[2] ** 2)

    weights, best = fit_weights(gap, 3)
    assert weights == pytest.approx([0.25, 0.75, 0.0]) and best == pytest.approx(0.0)
    assert fit_weights(gap, 3) == (weights, best)
    assert fit_weights(lambda weights: 1.0, 1) == ([1.0], 1.0)


@pytest.mark.integration
def test_tune_report_ensembles_the_best_trials_or_the_best_of_each_model(tiny_data, tmp_path, capsys):
    # Three logistic models that learn, then an MoE that cannot in two epochs (a learning rate of 1e-6): the top 2
    # are logistic, the best of each model is the best logistic and the MoE.
    learning = [{"model": "LogisticModel", "base_learning_rate": rate} for rate in (0.1, 0.05, 0.02)]
    document = {
        "train": {"train_data_pattern": tiny_data["train_pattern"], "eval_data_pattern": tiny_data["validate_pattern"],
                  "feature_names": "mean_rgb,mean_audio", "feature_sizes": "16,8", "num_classes": NUM_CLASSES,
                  "batch_size": 60, "num_epochs": 2, "num_readers": 0, "log_every_steps": 100},
        "search": {"model": {"type": "categorical", "choices": ["LogisticModel", "MoeModel"]},
                   "base_learning_rate": {"type": "float", "low": 1e-6, "high": 0.3, "log": True}},
        "objective": {"metric": "gap", "direction": "maximize"},
        "tune": {"study_dir": str(tmp_path / "study"), "pruner": "none", "keep_best": 2,
                 "enqueue": [*learning, {"model": "MoeModel", "base_learning_rate": 1e-6}]},
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    tuned = run_cli(capsys, "tune", "--config", str(tmp_path / "tune.yaml"), "--n_trials", "4")
    study_dir = tuned["study_dir"]
    trials = optuna.load_study(study_name="tune", storage=f"sqlite:///{study_dir}/study.db").trials
    logistic = sorted((t for t in trials if t.params["model"] == "LogisticModel"), key=lambda t: -t.value)
    moe = next(t for t in trials if t.params["model"] == "MoeModel")
    assert moe.value < logistic[-1].value
    # keep_best 2 keeps the best 2 and the best of each model among the best 2: the worst logistic's files go.
    assert sorted(p.parent.name for p in Path(study_dir).glob("trials/trial-*/checkpoints")) == sorted(
        f"trial-{t.number}" for t in (*logistic[:2], moe))

    assert cli_main(["tune-report", study_dir, "--ensemble_top", "2"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out.strip().splitlines()[-1])["ensemble"]
    assert report["trials"] == [t.number for t in logistic[:2]] and report["trials"][0] == tuned["best_trial"]
    # Each member is its trial's model at the epoch its value was validated at (its best export), not its last.
    assert report["train_dirs"] == [str(Path(study_dir, "trials", f"trial-{t.number}", "export", "best",
                                             f"{t.user_attrs['best_step']:08d}")) for t in logistic[:2]]
    assert report["best_single"]["gap"] == pytest.approx(tuned["best_value"], abs=1e-6)
    assert report["gap"] == pytest.approx(weighted_gap(tiny_data, report["train_dirs"], report["weights"]), abs=1e-6)
    assert report["gap_gain"] == pytest.approx(report["gap"] - report["best_single"]["gap"], abs=1e-6)
    assert len(out.strip().splitlines()) == 1  # the JSON line; the report for a person is on stderr
    assert f"ensemble of trials {report['trials'][0]},{report['trials'][1]}" in err and "yt8m ensemble" in err

    assert cli_main(["tune-report", study_dir, "--ensemble_top", "2", "--diverse"]) == 0
    diverse = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ensemble"]
    assert diverse["trials"] == [logistic[0].number, moe.number]
    assert diverse["gap"] == pytest.approx(weighted_gap(tiny_data, diverse["train_dirs"], diverse["weights"]),
                                           abs=1e-6)
    # The worst logistic kept no checkpoints: it cannot join an ensemble.
    assert cli_main(["tune-report", study_dir, "--ensemble_top", "3"]) == 1
    assert "kept no checkpoints" in capsys.readouterr().err


def map_study(data: dict, study_dir: Path, tune_yaml: Path) -> dict:
    """A study of three logistic models (two epochs each, their learning rates apart) whose objective is mAP."""
    document = {
        "train": {"train_data_pattern": data["train_pattern"], "eval_data_pattern": data["validate_pattern"],
                  "feature_names": "mean_rgb,mean_audio", "feature_sizes": "16,8", "num_classes": NUM_CLASSES,
                  "batch_size": 60, "num_epochs": 2, "num_readers": 0, "log_every_steps": 100,
                  "model": "LogisticModel"},
        "search": {"base_learning_rate": {"type": "float", "low": 1e-3, "high": 0.3, "log": True}},
        "objective": {"metric": "map"},
        "tune": {"study_dir": str(study_dir), "pruner": "none",
                 "enqueue": [{"base_learning_rate": rate} for rate in (0.2, 0.05, 0.01)]},
    }
    tune_yaml.write_text(yaml.safe_dump(document, sort_keys=False))
    return document


@pytest.mark.integration
def test_tune_report_fits_and_reports_the_ensemble_on_the_studys_objective(tiny_data, tmp_path, capsys):
    map_study(tiny_data, tmp_path / "study", tmp_path / "tune.yaml")
    tuned = run_cli(capsys, "tune", "--config", str(tmp_path / "tune.yaml"), "--n_trials", "3")
    assert cli_main(["tune-report", tuned["study_dir"], "--ensemble_top", "2"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out.strip().splitlines()[-1])["ensemble"]
    objective = report["objective"]
    assert (objective["metric"], objective["direction"]) == ("map", "maximize")
    # The best single trial's figure is its validated objective value, the study's best value.
    assert objective["best_single"] == pytest.approx(tuned["best_value"], abs=1e-6)
    assert objective["ensemble"] == report["map"] == pytest.approx(
        weighted_map(tiny_data, report["train_dirs"], report["weights"]), abs=1e-6)
    # Fitted for mAP: never below either member's mAP, nor equal weights'.
    assert objective["ensemble"] >= max(objective["best_single"], objective["equal_weights"]) - 1e-9
    assert objective["gain"] == pytest.approx(objective["ensemble"] - objective["best_single"], abs=1e-6)
    assert "fitted for the study's objective, map (maximize)" in err and f"validation map {report['map']:.5f}" in err


class MissedLabels:
    """The mean over videos of 1 - the best probability given to one of its labels: lower is better."""

    higher_is_better = False

    def __init__(self, num_classes: int):
        self.total, self.videos = 0.0, 0

    def update(self, predictions, labels):
        best = np.where(labels > 0, predictions, 0).max(axis=1)
        self.total += float((1 - best)[labels.any(axis=1)].sum())
        self.videos += int(labels.any(axis=1).sum())

    def compute(self):
        return self.total / self.videos

    def merge(self, other):
        self.total, self.videos = self.total + other.total, self.videos + other.videos


def test_weights_fitted_for_a_metric_of_ones_own_that_lower_is_better(tiny_data, trained_dir, second_run):
    register_metric(MissedLabels)
    try:
        with opened_inputs([str(trained_dir), str(second_run)], NUM_CLASSES) as inputs:
            fitted = fit_ensemble(inputs, tiny_data["validate_pattern"], NUM_CLASSES, num_readers="0",
                                  objective=FitObjective("MissedLabels", maximize=False))
    finally:
        METRICS.remove("MissedLabels")
    value = fitted["ensemble"]["MissedLabels"]
    assert fitted["objective"] == "MissedLabels"
    assert value <= min(single["MissedLabels"] for single in fitted["inputs"]) + 1e-9
    assert value <= fitted["equal_weights_objective"] + 1e-9
    mixed, labels = weighted_predictions(tiny_data, [str(trained_dir), str(second_run)], fitted["weights"])
    expected = MissedLabels(NUM_CLASSES)
    expected.update(mixed, labels)
    assert value == pytest.approx(expected.compute(), abs=1e-5)


def test_a_loss_objective_is_refused_in_one_line(tiny_data, trained_dir):
    with opened_inputs([str(trained_dir)], NUM_CLASSES) as inputs, pytest.raises(ValueError, match="give no loss"):
        fit_ensemble(inputs, tiny_data["validate_pattern"], NUM_CLASSES, objective=FitObjective("loss", False))

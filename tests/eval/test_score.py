"""`yt8m score` end to end through the CLI: results, coverage errors, --allow_missing, malformed lines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from yt8m.cli import main as cli_main
from yt8m.eval.metrics import EvaluationMetrics
from yt8m.eval.score import read_labels_csv, read_predictions_csv

LABELS = "VideoId,Labels\naaaa,3 1\nbbbb,\ncccc,2\n"
PREDICTIONS = "VideoId,LabelConfidencePairs\naaaa,3 0.9 0 0.5\nbbbb,2 0.8\ncccc,2 0.7 1 0.6 0 0.1\n"


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run_score(capsys, tmp_path, predictions: str = PREDICTIONS, labels: str = LABELS, *flags: str):
    code = cli_main(["score", "--predictions", write(tmp_path, "predictions.csv", predictions),
                     "--labels", write(tmp_path, "labels.csv", labels), "--num_classes", "5", *flags])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_score_prints_the_metrics_of_the_submission(capsys, tmp_path):
    code, result, _ = run_score(capsys, tmp_path)
    assert code == 0
    # Pool by score: a3 .9 (+), b2 .8, c2 .7 (+), c1 .6, a0 .5, c0 .1; 3 labels (a1 never predicted).
    assert result["gap"] == pytest.approx((1 / 1 + 2 / 3) / 3)
    assert result["hit_at_one"] == pytest.approx(2 / 3)
    assert result["perr"] == pytest.approx((1 / 2 + 0 + 1) / 3)
    assert result["map"] == pytest.approx((0 + 1 / 2 + 1) / 3)  # classes 1, 2, 3 have labels
    assert result["map_all_classes"] == pytest.approx((1 / 2 + 1) / 5)
    assert result["num_videos"] == 3
    assert set(result) == {"gap", "map", "map_all_classes", "hit_at_one", "perr", "num_videos"}


def test_score_equals_the_metrics_on_the_dense_matrices(capsys, tmp_path):
    rng = np.random.default_rng(0)
    num_classes, videos = 30, 200
    scores = np.full((videos, num_classes), -np.inf, dtype=np.float32)
    truth = (rng.random((videos, num_classes)) < 0.1).astype(np.float32)
    label_lines, prediction_lines = ["VideoId,Labels"], ["VideoId,LabelConfidencePairs"]
    for v in range(videos):
        classes = rng.choice(num_classes, size=25, replace=False)
        scores[v, classes] = np.round(rng.random(25), 6).astype(np.float32)
        prediction_lines.append(f"v{v}," + " ".join(f"{c} {scores[v, c]:.6f}" for c in classes))
        label_lines.append(f"v{v}," + " ".join(map(str, np.flatnonzero(truth[v]))))
    expected = EvaluationMetrics(num_classes, top_k=20)
    expected.accumulate(scores, truth)
    code = cli_main(["score", "--predictions", write(tmp_path, "p.csv", "\n".join(prediction_lines) + "\n"),
                     "--labels", write(tmp_path, "l.csv", "\n".join(label_lines) + "\n"),
                     "--num_classes", str(num_classes)])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    for name, value in result.items():
        assert value == pytest.approx(expected.get()[name]), name


def test_top_k_limits_the_pairs_that_count(capsys, tmp_path):
    _, full, _ = run_score(capsys, tmp_path)
    _, top_one, _ = run_score(capsys, tmp_path, PREDICTIONS, LABELS, "--top_k", "1")
    assert top_one["gap"] == pytest.approx((1 / 1 + 2 / 3) / 3) == full["gap"]
    assert top_one["perr"] == pytest.approx((1 / 2 + 0 + 1) / 3)
    _, top_one_worse, _ = run_score(capsys, tmp_path, PREDICTIONS.replace("3 0.9 0 0.5", "0 0.9 3 0.5"),
                                    LABELS, "--top_k", "1")
    assert top_one_worse["gap"] == pytest.approx((1 / 3) / 3)  # a0 .9, b2 .8, c2 .7 (+)


def test_missing_and_unknown_videos_are_errors_naming_them(capsys, tmp_path):
    predictions = PREDICTIONS.replace("bbbb,2 0.8\n", "") + "zzzz,1 0.3\nyyyy,\n"
    code, _, err = run_score(capsys, tmp_path, predictions)
    assert code == 1
    assert "1 videos of" in err and "(bbbb)" in err
    assert "2 videos of" in err and "(zzzz, yyyy)" in err and "--allow_missing" in err


def test_allow_missing_scores_missing_as_nothing_and_ignores_unknown(capsys, caplog, tmp_path):
    predictions = PREDICTIONS.replace("aaaa,3 0.9 0 0.5\n", "") + "zzzz,1 0.3\n"
    code, result, _ = run_score(capsys, tmp_path, predictions, LABELS, "--allow_missing")
    assert code == 0
    assert "(aaaa): counted as predicting nothing" in caplog.text and "(zzzz): ignored" in caplog.text
    # Pool: b2 .8, c2 .7 (+), c1 .6, c0 .1; a predicts nothing.
    assert result["gap"] == pytest.approx((1 / 2) / 3)
    assert result["num_videos"] == 3


def test_many_missing_videos_show_a_few_and_the_count(capsys, tmp_path):
    labels = "VideoId,Labels\n" + "".join(f"m{i},1\n" for i in range(40)) + "aaaa,3\n"
    code, _, err = run_score(capsys, tmp_path, "VideoId,LabelConfidencePairs\naaaa,3 0.5\n", labels)
    assert code == 1 and "40 videos of" in err and "(m0, m1, m2, m3, m4, ...)" in err


@pytest.mark.parametrize("which, text, message", [
    ("predictions", "VideoId,Pairs\naaaa,1 0.5\n", "predictions.csv:1: expected the header"),
    ("predictions", PREDICTIONS + "dddd,1 0.5,2\n", "predictions.csv:5: expected 'VideoId,"),
    ("predictions", PREDICTIONS + "dddd,1 0.5 2\n", "predictions.csv:5: .*odd number"),
    ("predictions", PREDICTIONS + "dddd,x 0.5\n", "predictions.csv:5: class ids must be integers"),
    ("predictions", PREDICTIONS + "dddd,1 high\n", "predictions.csv:5: confidences must be numbers"),
    ("predictions", PREDICTIONS + "dddd,1 nan\n", "predictions.csv:5: confidences must be finite"),
    ("predictions", PREDICTIONS + "dddd,7 0.5\n", "predictions.csv:5: class id 7 is outside \\[0, 5\\)"),
    ("predictions", PREDICTIONS + "dddd,1 0.5 1 0.4\n", "predictions.csv:5: a class id appears twice"),
    ("predictions", PREDICTIONS + "aaaa,1 0.5\n", "predictions.csv:5: video 'aaaa' is already on line 2"),
    ("labels", "VideoId,Labels\naaaa,3 -1\n", "labels.csv:2: class id -1 is outside"),
    ("labels", "VideoId,Labels\n\naaaa,3\n,1\n", "labels.csv:4: expected 'VideoId,"),
    ("labels", "VideoId,Labels\n", "labels.csv lists no videos"),
])
def test_malformed_files_are_errors_naming_the_line(capsys, tmp_path, which, text, message):
    files = {"predictions": PREDICTIONS, "labels": LABELS, which: text}
    code, _, err = run_score(capsys, tmp_path, files["predictions"], files["labels"])
    assert code == 1
    assert re.search(message, err), err


def test_readers_return_ids_in_file_order(tmp_path):
    labels = read_labels_csv(write(tmp_path, "l.csv", "\ufeffVideoId,Labels\r\nb,4 1 4\r\na,\r\n"), num_classes=5)
    assert list(labels) == ["b", "a"]
    assert labels["b"].tolist() == [1, 4] and labels["a"].tolist() == []
    predictions = read_predictions_csv(write(tmp_path, "p.csv", PREDICTIONS), num_classes=5)
    classes, confidences = predictions["cccc"]
    assert classes.tolist() == [2, 1, 0] and confidences.tolist() == [0.7, 0.6, 0.1]


def many_videos(count: int) -> tuple[list[str], list[str]]:
    """Labels and predictions lines (without header) of `count` videos."""
    labels = [f"v{i},{i % 5}" for i in range(count)]
    predictions = [f"v{i},{i % 5} 0.5 {(i + 1) % 5} 0.25" for i in range(count)]
    return labels, predictions


@pytest.mark.parametrize("duplicate_line, bad_line, expected", [
    (12_000, 12_500, "predictions.csv:12000: video 'v5' is already on line 7"),  # a later batch than line 7
    (12_500, 12_000, "predictions.csv:12000: confidences must be numbers"),
    (9_000, 11_000, "predictions.csv:9000: video 'v5' is already on line 7"),  # checked with a later batch
])
def test_the_first_problem_in_line_order_is_reported_across_batches(capsys, tmp_path, duplicate_line, bad_line,
                                                                    expected):
    labels, predictions = many_videos(15_000)
    predictions[duplicate_line - 2] = "v5,1 0.5"
    predictions[bad_line - 2] = f"v{bad_line},1 high"
    code, _, err = run_score(capsys, tmp_path, "\n".join(["VideoId,LabelConfidencePairs", *predictions]) + "\n",
                             "\n".join(["VideoId,Labels", *labels]) + "\n")
    assert code == 1
    assert expected in err, err


def test_score_leaves_no_temporary_files(capsys, tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert run_score(capsys, tmp_path)[0] == 0
    assert run_score(capsys, tmp_path, PREDICTIONS + "aaaa,1 0.5\n")[0] == 1
    assert os.listdir(scratch) == []


def test_score_through_the_cli_as_a_user_runs_it(tmp_path):
    labels, predictions = many_videos(3_000)
    predictions[2_500] = "v17,1 0.5"  # line 2502
    files = {name: tmp_path / f"{name}.csv" for name in ("labels", "predictions")}
    files["labels"].write_text("\n".join(["VideoId,Labels", *labels]) + "\n")
    files["predictions"].write_text("\n".join(["VideoId,LabelConfidencePairs", *predictions]) + "\n")
    result = subprocess.run([sys.executable, "-m", "yt8m", "score", "--predictions", str(files["predictions"]),
                             "--labels", str(files["labels"]), "--num_classes", "5", "--allow_missing"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"yt8m score: error: {files['predictions']}:2502: video 'v17' is already on line 19"]
    predictions[2_500] = "v2500,0 0.5"
    files["predictions"].write_text("\n".join(["VideoId,LabelConfidencePairs", *predictions[:2_990]]) + "\n")
    result = subprocess.run([sys.executable, "-m", "yt8m", "score", "--predictions", str(files["predictions"]),
                             "--labels", str(files["labels"]), "--num_classes", "5", "--allow_missing"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["num_videos"] == 3_000
    assert "10 videos of" in result.stderr and "(v2990, v2991, v2992, v2993, v2994, ...)" in result.stderr

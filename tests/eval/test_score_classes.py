"""`yt8m score`'s class count on 20-class data: the run's (--train_dir) or the vocabulary's, map_all_classes averaged
over those 20; the 2018 vocabulary's 3862 only where nothing gives the data's, with a line saying so."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest

import yt8m
from yt8m.cli import main as cli_main
from yt8m.data.making.synthetic import write_synthetic

CLASSES = 20


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory) -> dict:
    """A 20-class run trained a little, its predictions on the validate split, and that split's labels CSV."""
    root = tmp_path_factory.mktemp("twenty")
    data = write_synthetic(str(root), kind="video", num_classes=CLASSES, train_videos=128, validate_videos=64,
                           test_videos=0, shards=1, feature_sizes=(8, 4), seed=5)
    run, predictions = root / "run", root / "predictions.csv"
    yt8m.train(train_data_pattern=data["train"][0], train_dir=str(run), feature_names="mean_rgb", feature_sizes=8,
               num_classes=CLASSES, batch_size=32, num_epochs=1, num_readers=0)
    yt8m.predict(train_dir=str(run), input_data_pattern=data["validate"][0], output_file=str(predictions),
                 num_readers=0)
    with open(data["validate_labels"]) as fh:
        labelled = {int(label) for row in list(csv.reader(fh))[1:] for label in row[1].split()}
    assert 0 < len(labelled) <= CLASSES
    return {"run": run, "predictions": predictions, "labels": data["validate_labels"], "labelled": len(labelled)}


def score(capsys, scored_run: dict, *flags: str) -> tuple[int, dict, str]:
    code = cli_main(["score", "--predictions", str(scored_run["predictions"]), "--labels", scored_run["labels"],
                     *flags])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else {}, err


def write_vocabulary(path: Path, classes: int) -> str:
    rows = ["Index,Name"] + [f"{index},class {index}" for index in reversed(range(classes))]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_map_all_classes_averages_over_the_runs_classes(capsys, caplog, scored_run):
    with caplog.at_level(logging.INFO, "yt8m.eval.score"):
        code, result, _ = score(capsys, scored_run, "--train_dir", str(scored_run["run"]))
    assert code == 0 and result["map"] > 0.01
    assert result["map_all_classes"] == pytest.approx(result["map"] * scored_run["labelled"] / CLASSES)
    assert "3862" not in caplog.text


def test_map_all_classes_averages_over_the_vocabularys_classes(capsys, scored_run, tmp_path):
    vocabulary = write_vocabulary(tmp_path / "vocabulary.csv", CLASSES)
    code, result, _ = score(capsys, scored_run, "--vocabulary_file", vocabulary)
    assert code == 0
    assert result["map_all_classes"] == pytest.approx(result["map"] * scored_run["labelled"] / CLASSES)


def test_without_a_count_the_2018_vocabularys_is_used_and_said(capsys, caplog, scored_run):
    with caplog.at_level(logging.INFO, "yt8m.eval.score"):
        code, result, _ = score(capsys, scored_run)
    assert code == 0
    assert result["map_all_classes"] == pytest.approx(result["map"] * scored_run["labelled"] / 3862)
    lines = [record.getMessage() for record in caplog.records if "3862" in record.getMessage()]
    assert lines == ["scoring over 3862 classes, the 2018 vocabulary's (map_all_classes averages over them): no "
                     "--num_classes, --train_dir or --vocabulary_file gives the data's"]


def test_counts_that_disagree_are_one_line(capsys, scored_run, tmp_path):
    vocabulary = write_vocabulary(tmp_path / "vocabulary.csv", 12)
    code, _, err = score(capsys, scored_run, "--train_dir", str(scored_run["run"]), "--vocabulary_file", vocabulary)
    assert code == 1
    assert err.strip().splitlines() == [
        f"yt8m score: error: the class counts disagree: --train_dir {scored_run['run']} has {CLASSES}, "
        f"--vocabulary_file {vocabulary} has 12"]
    code, _, err = score(capsys, scored_run, "--train_dir", str(tmp_path))
    assert code == 1 and "is not a yt8m train dir (no config.yaml)" in err

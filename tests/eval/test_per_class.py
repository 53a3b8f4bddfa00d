"""`yt8m eval --per_class FILE`: each class's AP, positives and training videos (a vocabulary's TrainVideoCount, or
counted in the run's training shards) with its name and vertical looked up by Index; the plots beside it."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from workflow_fixtures import NUM_CLASSES, tiny_data, trained_dir  # noqa: F401  (fixtures)
from yt8m import cli
from yt8m.eval.score import read_labels_csv


def eval_per_class(capsys, data: dict, train_dir, output, *flags: str) -> dict:
    assert cli.main(["eval", "--eval_data_pattern", data["validate_pattern"], "--train_dir", str(train_dir),
                     "--run_once", "--num_readers", "0", "--per_class", str(output), *flags]) == 0
    return json.loads(capsys.readouterr().out)


def read_rows(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_per_class_ap_adds_up_to_the_map_with_names_and_training_videos(tiny_data, trained_dir, tmp_path, capsys):
    result = eval_per_class(capsys, tiny_data, trained_dir, tmp_path / "classes.csv", "--vocabulary_file",
                            tiny_data["vocabulary"])
    rows = read_rows(tmp_path / "classes.csv")
    assert [int(row["class"]) for row in rows] == list(range(NUM_CLASSES))
    scored = [row for row in rows if int(row["positives"])]
    assert np.mean([float(row["ap"]) for row in scored]) == pytest.approx(result["map"], abs=1e-6)
    labels = read_labels_csv(tiny_data["validate_labels"], NUM_CLASSES).values()
    assert [int(row["positives"]) for row in rows] == np.bincount(np.concatenate(list(labels)),
                                                                 minlength=NUM_CLASSES).tolist()
    # The vocabulary's rows are ordered by TrainVideoCount, as the real file's: names come by Index.
    assert [(row["name"], row["vertical"]) for row in rows[:2]] == [("Class 0", "Vertical 00"),
                                                                    ("Class 1", "Vertical 01")]
    assert result["per_class"]["train_videos_from"] == f"{tiny_data['vocabulary']} (TrainVideoCount)"
    for plot in result["per_class"]["plots"].values():
        with open(plot, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"

    # Without a vocabulary the run's training shards are counted: the same numbers synth wrote.
    counted = eval_per_class(capsys, tiny_data, trained_dir, tmp_path / "counted.csv")
    assert counted["per_class"]["train_videos_from"] == tiny_data["train_pattern"]
    assert [row["train_videos"] for row in read_rows(tmp_path / "counted.csv")] == [row["train_videos"]
                                                                                     for row in rows]
    assert {row["name"] for row in read_rows(tmp_path / "counted.csv")} == {""}


def test_per_class_refuses_segment_labels(tiny_data, trained_dir, tmp_path, capsys):
    assert cli.main(["eval", "--eval_data_pattern", tiny_data["validate_pattern"], "--train_dir", str(trained_dir),
                     "--run_once", "--per_class", str(tmp_path / "c.csv"), "--segment_labels"]) == 1
    assert "--per_class reports the classes of video labels" in capsys.readouterr().err

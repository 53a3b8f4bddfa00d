"""`yt8m predict`: a well-formed, complete Kaggle CSV that `yt8m score` accepts, with or without labels."""

from __future__ import annotations

import csv
import json

import pytest

from workflow_fixtures import NUM_CLASSES, tiny_data, trained_dir  # noqa: F401  (fixtures)
from yt8m.predict import main
from yt8m.score import main as score_main
from yt8m.score import read_labels_csv


def predict(data: dict, train_dir, split: str, output, *extra: str) -> dict:
    return main(["--input_data_pattern", data[f"{split}_pattern"], "--train_dir", str(train_dir),
                 "--output_file", str(output), "--num_readers", "0", *extra])


def read_rows(path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


@pytest.mark.parametrize("split", ["test", "validate"])  # test shards carry no labels
def test_every_video_once_with_top_k_pairs_in_descending_order(tiny_data, trained_dir, tmp_path, split, capsys):
    output = tmp_path / "predictions.csv"
    assert predict(tiny_data, trained_dir, split, output, "--top_k", "5", "--batch_size", "10") == 0
    summary = json.loads(capsys.readouterr().out)
    header, rows = read_rows(output)
    assert header == ["VideoId", "LabelConfidencePairs"]
    expected_ids = set(read_labels_csv(tiny_data[f"{split}_labels"], NUM_CLASSES))
    assert sorted(row[0] for row in rows) == sorted(expected_ids)
    assert summary["videos"] == len(rows) == len(expected_ids)
    for video_id, pairs in rows:
        tokens = pairs.split(" ")
        classes, confidences = [int(t) for t in tokens[::2]], [float(t) for t in tokens[1::2]]
        assert len(classes) == len(set(classes)) == 5
        assert all(0 <= c < NUM_CLASSES for c in classes)
        assert confidences == sorted(confidences, reverse=True)
        assert all(len(t.split(".")[1]) == 6 for t in tokens[1::2])  # "%f"
    assert not list(tmp_path.glob("*.tmp"))


def test_score_accepts_the_predictions(tiny_data, trained_dir, tmp_path, capsys):
    output = tmp_path / "predictions.csv"
    predict(tiny_data, trained_dir, "test", output)
    capsys.readouterr()
    assert score_main(["--predictions", str(output), "--labels", tiny_data["test_labels"],
                       "--num_classes", str(NUM_CLASSES)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["num_videos"] == 48 and scores["gap"] > 0.3


def test_missing_checkpoint_is_a_clear_error(tiny_data, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no checkpoint in {tmp_path}"):
        predict(tiny_data, tmp_path, "test", tmp_path / "p.csv")

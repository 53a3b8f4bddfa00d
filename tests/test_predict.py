"""`yt8m predict`: a well-formed, complete Kaggle CSV that `yt8m score` accepts, with or without labels;
JSON lines, and `yt8m convert-predictions` back to the same CSV."""

from __future__ import annotations

import csv
import json

import pytest

from workflow_fixtures import NUM_CLASSES, tiny_data, trained_dir  # noqa: F401  (fixtures)
from yt8m.cli import main as cli_main
from yt8m.predict import convert_predictions, main
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


def test_jsonl_lists_each_videos_top_k_and_converts_to_the_csv(tiny_data, trained_dir, tmp_path, capsys):
    predict(tiny_data, trained_dir, "test", tmp_path / "p.jsonl", "--output_format", "jsonl", "--top_k", "5")
    predict(tiny_data, trained_dir, "test", tmp_path / "top3.csv", "--top_k", "3")
    records = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert sorted(r["video_id"] for r in records) == sorted(read_labels_csv(tiny_data["test_labels"], NUM_CLASSES))
    for record in records:
        assert sorted(record) == ["class_indexes", "predictions", "video_id"]
        assert len(set(record["class_indexes"])) == len(record["predictions"]) == 5
        assert record["predictions"] == sorted(record["predictions"], reverse=True)
    capsys.readouterr()
    assert cli_main(["convert-predictions", "--input", str(tmp_path / "p.jsonl"), "--output",
                     str(tmp_path / "converted.csv"), "--top_k", "3"]) == 0
    assert (tmp_path / "converted.csv").read_text() == (tmp_path / "top3.csv").read_text()


def test_conversion_ranks_unsorted_lines_by_confidence(tmp_path):
    (tmp_path / "p.jsonl").write_text(
        '{"video_id": "a", "class_indexes": [4, 7, 2], "predictions": [0.25, 0.5, 0.25]}\n\n'
        '{"video_id": "b", "class_indexes": [], "predictions": []}\n')
    assert convert_predictions(str(tmp_path / "p.jsonl"), str(tmp_path / "p.csv"), top_k=2) == 2
    assert (tmp_path / "p.csv").read_text() == "VideoId,LabelConfidencePairs\na,7 0.500000 4 0.250000\nb,\n"


@pytest.mark.parametrize("line,message", [
    ('{"video_id": "b", "class_indexes": [1]', "not a JSON object"),
    ('["b", [1], [0.5]]', "expected a JSON object, got list"),
    ('{"video_id": "b", "predictions": [0.5]}', "field 'class_indexes' is missing"),
    ('{"video_id": "", "class_indexes": [1], "predictions": [0.5]}', "field 'video_id' must be a non-empty string"),
    ('{"video_id": "b", "class_indexes": [-1], "predictions": [0.5]}', "field 'class_indexes' must be a list of non-negative"),
    ('{"video_id": "b", "class_indexes": [1], "predictions": ["high"]}', "field 'predictions' must be a list of finite"),
    ('{"video_id": "b", "class_indexes": [1, 2], "predictions": [0.5]}', r"fields 'class_indexes' \(2\) and 'predictions' \(1\)"),
    ('{"video_id": "a", "class_indexes": [1], "predictions": [0.5]}', "video 'a' is already on line 1"),
])
def test_conversion_refuses_a_bad_line_naming_file_line_and_field(tmp_path, line, message):
    source = tmp_path / "p.jsonl"
    source.write_text('{"video_id": "a", "class_indexes": [3], "predictions": [0.9]}\n' + line + "\n")
    with pytest.raises(ValueError, match=f"{source}:2: {message}"):
        convert_predictions(str(source), str(tmp_path / "p.csv"))
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize("flags,message", [
    (["--model", "exported"], "give exactly one of --train_dir"),
    (["--output_format", "parquet"], "--output_format must be one of csv, jsonl, got 'parquet'"),
    (["--top_k", "0"], "--top_k must be at least 1"),
])
def test_bad_predict_flags_are_clear_errors(tiny_data, trained_dir, tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        predict(tiny_data, trained_dir, "test", tmp_path / "p.csv", *flags)

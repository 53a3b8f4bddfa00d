"""`yt8m predict`: a well-formed, complete Kaggle CSV that `yt8m score` accepts, with or without labels;
JSON lines, and `yt8m convert-predictions` back to the same CSV."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, tiny_data, trained_dir  # noqa: F401  (fixtures)
from yt8m.cli import main as cli_main
from yt8m.commands.predict import main
from yt8m.commands.score import main as score_main
from yt8m.data.format.encode import encode_video_example
from yt8m.data.format.tfrecord import TFRecordWriter
from yt8m.data.reading.inspection import find_video
from yt8m.eval.score import read_labels_csv
from yt8m.inference.predictions import convert_predictions
from yt8m.io.checkpoints import latest_checkpoint


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
    ('{"video_id": "b,c", "class_indexes": [1], "predictions": [0.5]}',
     "field 'video_id' 'b,c' cannot be written to the CSV: a CSV field cannot hold a comma"),
    ('{"video_id": "b\\"c", "class_indexes": [1], "predictions": [0.5]}',
     "field 'video_id' 'b\"c' .*: a CSV field cannot hold a double quote"),
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


def write_shard(path, video_ids: list[str], seed: int = 0) -> list[int]:
    """A video-level shard of these ids (features of the trained model's sizes); returns each record's byte offset."""
    rng = np.random.default_rng(seed)
    offsets, at = [], 0
    with TFRecordWriter(str(path)) as writer:
        for video_id in video_ids:
            payload = encode_video_example(video_id, [1], {"mean_rgb": rng.random(FEATURE_SIZES[0], np.float32),
                                                           "mean_audio": rng.random(FEATURE_SIZES[1], np.float32)})
            writer.write(payload)
            offsets.append(at)
            at += len(payload) + 16
    return offsets


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yt8m", *argv], capture_output=True, text=True, timeout=300)


def predict_cli(pattern: str, train_dir, output, *flags: str) -> subprocess.CompletedProcess:
    return run_cli("predict", "--input_data_pattern", pattern, "--train_dir", str(train_dir), "--output_file",
                   str(output), "--num_readers", "0", *flags)


@pytest.mark.parametrize("bad_id, problem", [
    ("a,b", "a CSV field cannot hold a comma"),
    ('say "hi"', "a CSV field cannot hold a double quote"),
    ("two\nlines", "a CSV field cannot hold a line break"),
    (" padded", "a CSV field loses the spaces at its ends when read"),
    ("", "an empty id names no video"),
])
def test_ids_a_csv_cannot_hold_are_refused_naming_the_id_and_record(tiny_data, trained_dir, tmp_path, capsys,
                                                                   bad_id, problem):
    shard = tmp_path / "odd.tfrecord"
    offsets = write_shard(shard, ["fine1", "fine2", bad_id, "fine3"])
    output = tmp_path / "p.csv"
    code = cli_main(["predict", "--input_data_pattern", str(shard), "--train_dir", str(trained_dir),
                     "--output_file", str(output), "--num_readers", "0"])
    err = capsys.readouterr().err
    assert code == 1
    assert (f"{output}: cannot write video id {bad_id!r} (in {shard} (record at byte {offsets[2]})): {problem}"
            in err), err
    assert not output.exists()


def test_jsonl_holds_any_non_empty_id(tiny_data, trained_dir, tmp_path, capsys):
    shard = tmp_path / "odd.tfrecord"
    write_shard(shard, ["a,b", 'say "hi"', "two\nlines", " padded"])
    output = tmp_path / "p.jsonl"
    assert cli_main(["predict", "--input_data_pattern", str(shard), "--train_dir", str(trained_dir),
                     "--output_file", str(output), "--num_readers", "0", "--output_format", "jsonl"]) == 0
    assert [json.loads(line)["video_id"] for line in output.read_text().splitlines()] == [
        "a,b", 'say "hi"', "two\nlines", " padded"]
    write_shard(shard, ["fine", ""])
    assert cli_main(["predict", "--input_data_pattern", str(shard), "--train_dir", str(trained_dir),
                     "--output_file", str(tmp_path / "q.jsonl"), "--num_readers", "0", "--output_format", "jsonl"]) == 1
    assert "cannot write video id '' (in " in capsys.readouterr().err
    assert not (tmp_path / "q.jsonl").exists()


def test_a_duplicate_id_is_refused_through_the_cli_naming_both_records(trained_dir, tmp_path):
    first, second = tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"
    write_shard(first, ["v1", "dup", "v2"])
    offsets = write_shard(second, ["v3", "v4", "dup"], seed=1)
    output = tmp_path / "p.csv"
    output.write_text("an earlier, complete file\n")
    result = predict_cli(f"{tmp_path}/*.tfrecord", trained_dir, output, "--batch_size", "2")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == (f"yt8m predict: error: {output}: video 'dup' would be written twice, on lines 3 and 7 "
                         f"(in {first} (record at byte {offsets[1]}) and {second} (record at byte {offsets[2]})): "
                         "each video must appear once"), result.stderr
    assert "Traceback" not in result.stderr
    assert output.read_text() == "an earlier, complete file\n"


def nan_checkpoint(trained_dir, tmp_path):
    """A copy of the trained dir whose latest checkpoint's weights are all NaN."""
    copy = tmp_path / "nan_run"
    shutil.copytree(trained_dir, copy)
    path = latest_checkpoint(str(copy))
    payload = torch.load(path, weights_only=True)
    payload["model"] = {name: torch.full_like(value, float("nan")) if value.is_floating_point() else value
                        for name, value in payload["model"].items()}
    torch.save(payload, path)
    return copy


@pytest.mark.parametrize("output_format", ["csv", "jsonl"])
def test_predictions_that_are_not_finite_are_an_error_and_nothing_is_written(tiny_data, trained_dir, tmp_path,
                                                                              output_format):
    output = tmp_path / f"p.{output_format}"
    result = predict_cli(tiny_data["test_pattern"], nan_checkpoint(trained_dir, tmp_path), output,
                         "--output_format", output_format)
    assert result.returncode == 1
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("yt8m predict: error: the model's predictions are not finite (NaN or infinity) for "
                            "videos "), result.stderr
    assert "and " in error and "more in the same batch (in " in error and "record at byte 0)" in error
    assert error.endswith(f"{output} is not written")
    assert not output.exists()


KILLED_MID_WAY = """
import os, sys, time
import yt8m.inference.predictions as predict

format_rows = predict.format_rows

def format_then_wait(*args, **kwargs):
    rows = format_rows(*args, **kwargs)
    open(sys.argv[1], "w").close()  # the test kills the process once rows have been formatted
    time.sleep(600)
    return rows

predict.format_rows = format_then_wait
from yt8m.cli import main
main(sys.argv[2:])
"""


@pytest.mark.parametrize("earlier_file", [False, True])
def test_predict_killed_mid_way_leaves_no_output_and_an_earlier_one_intact(tiny_data, trained_dir, tmp_path,
                                                                           earlier_file):
    output, marker = tmp_path / "out" / "p.csv", tmp_path / "formatted"
    output.parent.mkdir()
    if earlier_file:
        output.write_text("VideoId,LabelConfidencePairs\nearlier,1 0.5\n")
    process = subprocess.Popen([sys.executable, "-c", KILLED_MID_WAY, str(marker), "predict",
                                "--input_data_pattern", tiny_data["test_pattern"], "--train_dir", str(trained_dir),
                                "--output_file", str(output), "--num_readers", "0", "--batch_size", "8"])
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "predict never got to its first batch"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    if earlier_file:
        assert output.read_text() == "VideoId,LabelConfidencePairs\nearlier,1 0.5\n"
        assert os.listdir(output.parent) != ["p.csv"]  # the half-written file lies under another name
    else:
        assert not output.exists()


def test_find_video_names_each_record_and_passes_over_a_damaged_file(tmp_path):
    damaged, good = tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"
    write_shard(damaged, ["x", "y"])
    damaged.write_bytes(damaged.read_bytes()[:-5])  # the last record cut short
    offsets = write_shard(good, ["y", "z", "y"])
    assert find_video([str(damaged), str(good)], "y") == [f"{good} (record at byte {offsets[0]})",
                                                         f"{good} (record at byte {offsets[2]})"]
    assert find_video([str(good)], "x") == []

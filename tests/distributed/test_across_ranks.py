"""`yt8m eval` and `yt8m predict` under torchrun (2 gloo processes on CPU): the shards split in contiguous blocks,
the metrics merged exactly (equal to one process's), every prediction row once in one file (in the same order), and
a failing or duplicating process failing the command as one process fails. The merges are also tested in-process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workflow_fixtures import as_flags, predict_config, tiny_train_config, train_config
from yt8m.data.making.synthetic import write_synthetic
from yt8m.distributed.across_ranks import rank_shards
from yt8m.eval.evaluate import evaluate_run
from yt8m.eval.metrics import EvaluationMetrics
from yt8m.eval.segment_metrics import SegmentMetrics
from yt8m.inference.predict import run_predict

NUM_CLASSES, FEATURE_SIZES = 12, (16, 8)


def test_rank_shards_are_contiguous_blocks_that_cover_every_path_once():
    paths = [f"shard-{index}" for index in range(7)]
    blocks = [rank_shards(paths, rank, 3) for rank in range(3)]
    assert blocks == [paths[0:2], paths[2:4], paths[4:7]]
    assert [rank_shards(paths[:2], rank, 3) for rank in range(3)] == [[], [paths[0]], [paths[1]]]


def _scores_with_ties(videos: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    scores = rng.random((videos, 30)).astype(np.float32)
    scores[::5, :4] = 1.0  # equal scores across the parts, labelled differently: their order decides GAP and mAP
    labels = (rng.random((videos, 30)) < 0.1).astype(np.float32)
    return scores, labels


def test_extended_evaluation_metrics_equal_one_accumulator_bit_for_bit():
    scores, labels = _scores_with_ties(2000, seed=1)
    whole = EvaluationMetrics(30, top_k=20, pool_budget=3000)  # spills runs to disk
    whole.accumulate(scores, labels, loss=0.5)
    parts = [EvaluationMetrics(30, top_k=20, pool_budget=2500) for _ in range(3)]
    for part, rows in zip(parts, (slice(0, 700), slice(700, 720), slice(720, 2000))):
        part.accumulate(scores[rows], labels[rows], loss=0.5)
    for part in parts[1:]:
        parts[0].extend(part.totals(), part.pooled_blocks())
    expected, merged = whole.get(), parts[0].get()
    for name in ("gap", "map", "map_all_classes", "num_videos"):
        assert merged[name] == expected[name], name
    for name in ("hit_at_one", "perr", "loss"):
        assert merged[name] == pytest.approx(expected[name], abs=1e-12), name


def test_extended_segment_metrics_equal_one_accumulator():
    scores, labels = _scores_with_ties(300, seed=2)
    weights = (np.random.default_rng(3).random(scores.shape) < 0.3).astype(np.float32)
    whole, first, second = (SegmentMetrics(30, top_n=50) for _ in range(3))
    whole.accumulate(scores, labels, weights, loss=0.25)
    first.accumulate(scores[:100], labels[:100], weights[:100], loss=0.25)
    second.accumulate(scores[100:], labels[100:], weights[100:], loss=0.25)
    first.extend(second.totals(), second.pooled_blocks())
    assert first.get() == pytest.approx(whole.get(), abs=1e-12)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """3 validate and 3 test shards (2 processes: rank 0 reads 1, rank 1 reads 2) and a briefly trained MoeModel."""
    from yt8m.training import train

    root = tmp_path_factory.mktemp("across_ranks")
    write_synthetic(str(root), kind="video", num_classes=NUM_CLASSES, train_videos=128, validate_videos=150,
                    test_videos=90, shards=3, feature_sizes=FEATURE_SIZES, seed=11)
    folder = root / "video"
    train_dir = root / "run"
    train(tiny_train_config({"train_pattern": str(folder / "train-*.tfrecord")}, train_dir, num_epochs=1))
    return {"root": root, "train_dir": train_dir, "validate": str(folder / "validate-*.tfrecord"),
            "test": str(folder / "test-*.tfrecord")}


def torchrun(command: str, values: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "yt8m", command, *as_flags(values)], env=env, capture_output=True, text=True,
                          timeout=180)


def succeeded(process: subprocess.CompletedProcess) -> dict:
    assert process.returncode == 0, process.stderr[-3000:]
    lines = process.stdout.splitlines()
    assert len(lines) == 1, process.stdout  # rank 0 alone prints
    return json.loads(lines[0])


@pytest.mark.integration
def test_eval_across_two_processes_equals_one_process(run, tmp_path):
    train_dir = tmp_path / "run"
    shutil.copytree(run["train_dir"], train_dir)
    values = dict(eval_data_pattern=run["validate"], train_dir=str(train_dir), run_once=True, num_readers=0,
                  batch_size=32)
    [single] = list(evaluate_run(dict(**values)))
    (metrics_file,) = (train_dir / "eval").glob("metrics-*.json")
    metrics_file.unlink()

    merged = succeeded(torchrun("eval", values))
    assert merged.keys() == single.keys() and merged["num_videos"] == 150
    for name, value in single.items():
        if name != "loss":
            assert merged[name] == pytest.approx(value, abs=1e-9, rel=0), name
    # Each batch's loss is a float32 mean, and the batches at the blocks' edges hold other videos than one process's.
    assert merged["loss"] == pytest.approx(single["loss"], rel=1e-6)
    assert json.loads(metrics_file.read_text()) == merged  # written once, by rank 0
    assert [path.name for path in (train_dir / "eval").glob("metrics-*.json")] == [metrics_file.name]


@pytest.mark.integration
def test_eval_report_across_two_processes_equals_one_processes(run, tmp_path):
    """--report's confusions and calibration bins are merged at rank 0 (merge_at_rank0): the same counts, the same
    hardest classes, as one process's."""
    train_dir = tmp_path / "run"
    shutil.copytree(run["train_dir"], train_dir)
    values = dict(eval_data_pattern=run["validate"], train_dir=str(train_dir), run_once=True, num_readers=0,
                  batch_size=32)
    [single] = list(evaluate_run(dict(**values, report=str(tmp_path / "one.html"))))
    merged = succeeded(torchrun("eval", {**values, "report": str(tmp_path / "two.html")}))
    assert merged["report"]["file"] == str(tmp_path / "two.html")
    assert merged["report"]["expected_calibration_error"] == pytest.approx(
        single["report"]["expected_calibration_error"], abs=1e-12)
    counted = re.compile(r'<(?:tr|li) (data-(?:bin|class|confused)=[^>]*)>')
    one = counted.findall((tmp_path / "one.html").read_text())
    assert one and counted.findall((tmp_path / "two.html").read_text()) == one


@pytest.mark.integration
@pytest.mark.parametrize("output_format", ["csv", "jsonl"])
def test_predict_across_two_processes_writes_one_file_in_one_process_order(run, tmp_path, output_format):
    values = dict(input_data_pattern=run["test"], train_dir=str(run["train_dir"]), num_readers=0, batch_size=16,
                  output_format=output_format)
    single = run_predict(predict_config(**values, output_file=str(tmp_path / "one" / "predictions")))
    out_dir = tmp_path / "two"
    summary = succeeded(torchrun("predict", {**values, "output_file": str(out_dir / "predictions")}))
    assert summary["videos"] == single["videos"] == 90 and summary["processes"] == 2
    rows = (out_dir / "predictions").read_text().splitlines()
    expected = (tmp_path / "one" / "predictions").read_text().splitlines()
    if output_format == "csv":
        assert rows == expected  # the same rows, in the same order
    else:  # full float32 scores: those of a batch at a block's edge, cut shorter, may differ in the last bit
        rows, expected = [json.loads(row) for row in rows], [json.loads(row) for row in expected]
        assert [(row["video_id"], row["class_indexes"]) for row in rows] == \
            [(row["video_id"], row["class_indexes"]) for row in expected]
        assert np.allclose([row["predictions"] for row in rows], [row["predictions"] for row in expected],
                           rtol=1e-6, atol=0)
    assert os.listdir(out_dir) == ["predictions"]


def _copied_test_shards(run, tmp_path) -> Path:
    """A copy of the 3 test shards: rank 0's block is the first, rank 1's the other two."""
    folder = tmp_path / "shards"
    folder.mkdir()
    for path in sorted(Path(run["test"]).parent.glob("test-*.tfrecord")):
        shutil.copy(path, folder / path.name)
    return folder


@pytest.mark.integration
def test_a_video_in_two_blocks_is_the_one_process_error(run, tmp_path):
    folder = _copied_test_shards(run, tmp_path)
    shutil.copy(sorted(folder.iterdir())[0], folder / "test-zz-copy.tfrecord")  # rank 0's shard, again in rank 1's
    output = tmp_path / "out" / "predictions.csv"
    values = dict(input_data_pattern=str(folder / "test-*.tfrecord"), train_dir=str(run["train_dir"]),
                  num_readers=0, batch_size=16, output_file=str(output))
    with pytest.raises(ValueError) as single:
        run_predict(predict_config(**values))
    assert "written twice" in str(single.value) and "test-zz-copy" in str(single.value)
    failed = torchrun("predict", values)
    assert failed.returncode != 0
    assert str(single.value) in failed.stderr
    assert not output.parent.exists() or os.listdir(output.parent) == []


@pytest.mark.integration
def test_a_failing_process_fails_the_command_with_its_error_and_no_output(run, tmp_path):
    folder = _copied_test_shards(run, tmp_path)
    damaged = sorted(folder.iterdir())[-1]  # in rank 1's block
    damaged.write_bytes(damaged.read_bytes()[:-7])
    output = tmp_path / "out" / "predictions.csv"
    failed = torchrun("predict", dict(input_data_pattern=str(folder / "test-*.tfrecord"),
                                      train_dir=str(run["train_dir"]), num_readers=0, output_file=str(output)))
    assert failed.returncode != 0
    assert "process 1 failed: CorruptRecordError" in failed.stderr and str(damaged) in failed.stderr
    assert not output.parent.exists() or os.listdir(output.parent) == []

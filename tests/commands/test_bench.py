"""Tests of `yt8m bench read`: one JSON line with sane figures, video and frame level, in-process and workers; its
errors as a user meets them; the `auto` rule for reader processes (runtime.reader_workers) it shares with train."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from yt8m import cli, runtime
from yt8m.data.format.encode import encode_video_example
from yt8m.data.format.tfrecord import TFRecordWriter
from yt8m.data.making.synthetic import write_synthetic
from yt8m.runtime import reader_workers

KEYS = {"examples", "batches", "seconds", "examples_per_sec", "mb_per_sec"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bench")
    for kind in ("video", "frame"):
        write_synthetic(str(folder), kind=kind, num_classes=10, train_videos=50, validate_videos=0, test_videos=0,
                        shards=2, min_frames=5, max_frames=30)
    return folder


def bench(capsys, *argv: str) -> dict:
    assert cli.main(["bench", "read", *argv]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    return json.loads(line)


@pytest.mark.parametrize("kind,workers", [("video", "0"), ("frame", "2")])
def test_bench_read_prints_one_json_line_of_figures(data_dir, capsys, kind, workers):
    flags = ["--frame_features"] if kind == "frame" else []
    result = bench(capsys, str(data_dir / kind / "train-*"), *flags, "--batch_size", "16", "--num_workers", workers,
                   "--num_classes", "10")
    assert KEYS <= set(result)
    assert result["examples"] == 50 and result["batches"] == 4
    assert result["seconds"] > 0
    assert result["examples_per_sec"] == pytest.approx(50 / result["seconds"], rel=0.02)
    file_megabytes = sum(path.stat().st_size for path in (data_dir / kind).glob("train-*")) / 1e6
    assert result["mb_per_sec"] * result["seconds"] == pytest.approx(file_megabytes, rel=0.02)


def test_bench_read_stops_after_max_batches(data_dir, capsys):
    result = bench(capsys, str(data_dir / "video" / "train-*"), "--batch_size", "8", "--max_batches", "2",
                   "--num_workers", "0", "--num_classes", "10")
    assert result["batches"] == 2 and result["examples"] == 16


def test_bench_read_reports_bad_input(data_dir, capsys):
    assert cli.main(["bench", "read", str(data_dir / "none-*"), "--num_workers", "0"]) == 1
    assert "no files match" in capsys.readouterr().err


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yt8m", *argv], capture_output=True, text=True)


def error_lines(stderr: str) -> list[str]:
    """stderr less the log lines (INFO and WARNING, with their timestamps)."""
    return [line for line in stderr.splitlines() if not re.match(r"\d\d:\d\d:\d\d (INFO|WARNING) ", line)]


@pytest.mark.parametrize("kind", ["video", "frame"])
def test_bench_read_defaults_to_auto_workers_and_says_how_many(data_dir, kind):
    flags = ["--frame_features"] if kind == "frame" else []
    result = run_cli("bench", "read", str(data_dir / kind / "train-*"), *flags, "--num_classes", "10")
    assert result.returncode == 0, result.stderr
    chosen = reader_workers("auto", kind == "frame")
    assert json.loads(result.stdout)["num_workers"] == chosen
    assert ("reading in-process" if chosen == 0 else f"reading with {chosen} worker processes") in result.stderr


def test_bench_read_of_a_shard_with_a_nan_is_a_one_line_error(tmp_path):
    path = tmp_path / "nan.tfrecord"
    good = {"mean_rgb": np.zeros(1024, np.float32), "mean_audio": np.zeros(128, np.float32)}
    bad = {"mean_rgb": np.zeros(1024, np.float32), "mean_audio": np.zeros(128, np.float32)}
    bad["mean_rgb"][500] = np.nan
    with TFRecordWriter(str(path)) as writer:
        for index in range(5):
            writer.write(encode_video_example(f"v{index}", [1], bad if index == 3 else good))
    offset = 3 * (16 + len(encode_video_example("v0", [1], good)))
    for workers in ("0", "2"):
        result = run_cli("bench", "read", str(path), "--num_workers", workers)
        assert result.returncode == 1 and error_lines(result.stderr) == [
            f"yt8m bench: error: {path}: record at byte offset {offset}: feature 'mean_rgb': expected finite values, "
            "found nan at index 500"], result.stderr


def test_bench_read_wrong_feature_size_in_workers_is_one_line_as_in_process(realdata_dir):
    pattern = str(realdata_dir / "yt8m_2018_video_validate" / "validate000[0-3].tfrecord")
    errors = []
    for workers in ("0", "2"):
        result = run_cli("bench", "read", pattern, "--feature_sizes", "1024,100", "--num_workers", workers)
        assert result.returncode == 1
        errors.append(error_lines(result.stderr))
    assert errors[0] == errors[1] and len(errors[0]) == 1, errors
    assert errors[0][0].endswith(": record at byte offset 0: feature 'mean_audio': expected float_list of 100 values, "
                                 "found float_list of 128 values")


@pytest.mark.parametrize("cpus, frame_workers", [(1, 0), (2, 0), (3, 0), (4, 2), (8, 4), (16, 8), (64, 8)])
def test_auto_reads_video_level_in_process_and_frame_level_with_spare_cores(monkeypatch, caplog, cpus, frame_workers):
    monkeypatch.setattr(runtime, "available_cpus", lambda: cpus)
    with caplog.at_level(logging.INFO, logger="yt8m"):
        assert reader_workers("auto", frame_features=False, accelerator=False) == 0
        assert reader_workers("auto", frame_features=True, accelerator=False) == frame_workers
    assert caplog.messages[0] == f"reading in-process: {cpus} CPUs, no GPU, video-level data (auto)"
    assert caplog.messages[1] == (f"reading with {frame_workers} worker processes: {cpus} CPUs, no GPU, frame-level "
                                  "data (auto)" if frame_workers else
                                  f"reading in-process: {cpus} CPUs, no GPU, frame-level data (auto)")


@pytest.mark.parametrize("cpus, workers", [(1, 1), (2, 1), (16, 15), (64, 16)])
def test_auto_on_a_gpu_machine_reads_with_every_core_but_one(monkeypatch, caplog, cpus, workers):
    monkeypatch.setattr(runtime, "available_cpus", lambda: cpus)
    with caplog.at_level(logging.INFO, logger="yt8m"):
        assert reader_workers("auto", frame_features=True, accelerator=True) == workers
        assert reader_workers("auto", frame_features=False, accelerator=True) == workers
    assert caplog.messages[0] == (f"reading with {workers} worker processes: {cpus} CPUs, a GPU machine, frame-level "
                                  "data (auto)")


def test_explicit_reader_counts_are_used_as_given_up_to_the_cpus(monkeypatch):
    monkeypatch.setattr(runtime, "available_cpus", lambda: 4)
    assert [reader_workers(value, False) for value in (0, "0", 3, "3", " 2 ", 9, "9")] == [0, 0, 3, 3, 2, 4, 4]
    for bad in ("three", "-1", -2, "2.5", None):
        with pytest.raises(ValueError, match=r"expected 'auto' or a whole number >= 0, got"):
            reader_workers(bad, True)

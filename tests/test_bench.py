"""Tests of `yt8m bench read`: one JSON line with sane figures, video and frame level, in-process and workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from yt8m import cli
from yt8m.data.synthetic import write_synthetic

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

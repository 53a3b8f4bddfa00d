"""`yt8m ensemble` against hostile inputs: confidences that are not probabilities, no inputs at all, the scratch
folders of a killed run, a train dir whose classes are not --num_classes' default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cli_outcome import yt8m_env, yt8m_here  # noqa: F401  (fixtures)

from workflow_fixtures import NUM_CLASSES, tiny_data, trained_dir  # noqa: F401  (fixtures)

pytestmark = pytest.mark.hostile

CSV = "VideoId,LabelConfidencePairs\nv1,1 0.9 2 0.5\nv2,{pairs}\nv3,0 0.1\n"
JSONL = ('{{"video_id": "v1", "class_indexes": [1], "predictions": [0.9]}}\n\n'
         '{{"video_id": "v2", "class_indexes": [1, 2], "predictions": [{confidences}]}}\n')


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("pairs, shown", [("1 7.5 2 0.25", "7.5"), ("1 0.5 2 -2", "-2")])
def test_a_csv_confidence_outside_0_1_is_refused_naming_file_line_and_video(yt8m_here, tmp_path, pairs, shown):
    good = write(tmp_path / "good.csv", CSV.format(pairs="1 0.5"))
    bad = write(tmp_path / "bad.csv", CSV.format(pairs=pairs))
    output = tmp_path / "out.csv"
    outcome = yt8m_here("ensemble", good, bad, "--num_classes", "3", "--output_file", str(output))
    outcome.assert_clean_error(f"{bad}:3: video 'v2'", shown, "outside [0, 1]")
    assert not output.exists()


def test_a_jsonl_confidence_outside_0_1_is_refused_naming_file_line_and_video(yt8m_here, tmp_path):
    good = write(tmp_path / "good.csv", CSV.format(pairs="1 0.5"))
    bad = write(tmp_path / "bad.jsonl", JSONL.format(confidences="0.5, 7.5"))
    outcome = yt8m_here("ensemble", good, bad, "--num_classes", "3", "--output_file", str(tmp_path / "out.csv"))
    outcome.assert_clean_error(f"{bad}:3: video 'v2'", "7.5", "outside [0, 1]")


def test_no_inputs_is_a_clean_error(yt8m_here, tmp_path):
    outcome = yt8m_here("ensemble", "--num_classes", "3", "--output_file", str(tmp_path / "out.csv"))
    outcome.assert_clean_error("inputs")


def test_a_train_dir_brings_its_own_number_of_classes(yt8m_here, tiny_data, trained_dir, tmp_path):
    output = tmp_path / "out.csv"
    outcome = yt8m_here("ensemble", str(trained_dir), "--input_data_pattern", tiny_data["test_pattern"],
                        "--output_file", str(output), "--num_readers", "0")
    assert outcome.assert_success()["videos"] == 48
    classes = {int(c) for line in output.read_text().splitlines()[1:] for c in line.split(",")[1].split()[0::2]}
    assert classes <= set(range(NUM_CLASSES))


def test_a_train_dir_and_a_different_num_classes_are_refused(yt8m_here, tiny_data, trained_dir, tmp_path):
    outcome = yt8m_here("ensemble", str(trained_dir), "--input_data_pattern", tiny_data["test_pattern"],
                        "--output_file", str(tmp_path / "out.csv"), "--num_readers", "0", "--num_classes", "7")
    outcome.assert_clean_error(str(trained_dir), f"{NUM_CLASSES} classes", "--num_classes")


def killed_owner_of_a_scratch_database(tmpdir: Path) -> None:
    """A process that makes its temporary database, as `yt8m ensemble` does, and is killed (kill -9)."""
    code = "import os, signal; from yt8m.io.spill import TemporaryDatabase; database = TemporaryDatabase(); " \
           "os.kill(os.getpid(), signal.SIGKILL)"
    subprocess.run([sys.executable, "-c", code], env=yt8m_env(TMPDIR=str(tmpdir)), check=False)


def test_scratch_folders_of_killed_runs_are_removed_and_a_running_ones_kept(yt8m_here, tmp_path, monkeypatch):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    killed_owner_of_a_scratch_database(tmpdir)
    stale = sorted(os.listdir(tmpdir))
    assert len(stale) == 1 and stale[0].startswith("yt8m-db-")
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    from yt8m.io.spill import TemporaryDatabase

    with TemporaryDatabase():  # a run going on beside the next one
        running = set(os.listdir(tmpdir)) - set(stale)
        files = write(tmp_path / "a.csv", CSV.format(pairs="1 0.5"))
        outcome = yt8m_here("ensemble", files, "--num_classes", "3", "--output_file", str(tmp_path / "out.csv"))
        assert outcome.assert_success()["videos"] == 3
        assert set(os.listdir(tmpdir)) == running
    assert os.listdir(tmpdir) == []
    assert json.loads(outcome.out)["output_file"] == str(tmp_path / "out.csv")


@pytest.mark.parametrize("line, message", [
    (b'{"video_id": "v2", "class_indexes": [1], "predictions": [0.\xe95]}', "not UTF-8"),
    (b"[" * 200_000, "nested too deeply"),
    (b'{"video_id": "v2", "class_indexes": [' + b"-1, " * 1_000_000 + b'1], "predictions": [0.5]}',
     "must be a list of non-negative integers"),
], ids=["not utf-8", "nested", "huge list"])
def test_a_bad_jsonl_line_is_one_short_error_naming_the_line(yt8m_here, tmp_path, line, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"video_id": "v1", "class_indexes": [1], "predictions": [0.9]}\n' + line + b"\n")
    outcome = yt8m_here("ensemble", str(bad), "--num_classes", "3", "--output_file", str(tmp_path / "out.csv"))
    assert len(outcome.assert_clean_error(f"{bad}:2: ", message)) < 600

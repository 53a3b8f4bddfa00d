"""Atomic, durable writes: unique temporary names, a full disk leaving no torn file, exports staged whole."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest
import torch

from faults import file_size_limit, files_under, fill_disk_after
from yt8m.io.checkpoints import Checkpoint, export_path, list_exports, read_export_metrics, save_checkpoint
from yt8m.io.files import (
    NAME_MAX_BYTES,
    WriteError,
    atomic_writer,
    is_temporary,
    remove_temporaries,
    temporary_owner,
    temporary_path,
    temporary_stem,
    write_file_atomically,
)
from yt8m.training.best_models import write_export


def test_temporary_names_are_unique_hidden_and_beside_the_target(tmp_path):
    target = str(tmp_path / "config.yaml")
    first, second = temporary_path(target), temporary_path(target)
    assert first != second
    assert os.path.dirname(first) == str(tmp_path)
    assert f"-{os.getpid()}-" in os.path.basename(first)
    assert os.path.basename(first).startswith(".config.yaml.tmp-")
    assert is_temporary(os.path.basename(first)) and not is_temporary("config.yaml")


@pytest.mark.parametrize("name", ["a" * 230, "b" * 231, "c" * 249 + ".x", "é" * 127, "d" * 253 + "é"])
def test_a_name_up_to_the_longest_a_file_system_takes_has_a_temporary_name_it_takes(tmp_path, name):
    temporary = os.path.basename(temporary_path(str(tmp_path / name)))
    assert len(temporary.encode()) <= NAME_MAX_BYTES and temporary_owner(temporary) == (temporary_stem(name),
                                                                                       os.getpid())
    assert temporary_stem(name) == name or temporary_stem(name) != temporary_stem(name[:-1] + "z")
    with atomic_writer(str(tmp_path / name)) as out:
        out.write("whole")
    assert (tmp_path / name).read_text() == "whole" and files_under(tmp_path) == [name]


def test_two_writers_of_one_file_do_not_share_a_temporary_file(tmp_path):
    target = tmp_path / "config.yaml"

    def outer(out):
        out.write("outer " * 1000)
        write_file_atomically(str(target), lambda inner: inner.write("inner"))

    write_file_atomically(str(target), outer)
    assert target.read_text() == "outer " * 1000  # the last rename wins, whole
    assert files_under(tmp_path) == ["config.yaml"]


def test_a_full_disk_raises_naming_the_file_and_leaves_the_old_one(tmp_path, monkeypatch):
    target = tmp_path / "best.yaml"
    target.write_text("old: 1\n")
    fill_disk_after(monkeypatch, tmp_path, budget=100)
    with pytest.raises(WriteError, match=r"could not write .*best\.yaml: No space left on device") as caught:
        write_file_atomically(str(target), lambda out: out.write("new: 2\n" * 10000))
    assert caught.value.errno == errno.ENOSPC
    assert target.read_text() == "old: 1\n"
    assert files_under(tmp_path) == ["best.yaml"]


def test_a_failing_writer_leaves_no_file(tmp_path):
    target = tmp_path / "predictions.csv"

    def fail(out):
        out.write("VideoId,LabelConfidencePairs\n")
        raise OSError(errno.EIO, "the input shard could not be read")

    with pytest.raises(OSError, match="input shard") as caught:
        write_file_atomically(str(target), fail)
    assert not isinstance(caught.value, WriteError)  # an error reading the input is not called a write error
    assert files_under(tmp_path) == []


def test_binary_writes_reach_the_file_synced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    target = tmp_path / "blob.bin"
    with atomic_writer(str(target), binary=True) as out:
        out.write(b"\x00\x01" * 10)
    assert target.read_bytes() == b"\x00\x01" * 10
    assert os.path.basename(synced[0]).startswith(".blob.bin.tmp-")  # the file, before its rename
    assert synced[1] == str(tmp_path)  # then the folder that holds the new name


def test_remove_temporaries_removes_only_unfinished_writes(tmp_path):
    (tmp_path / "config.yaml").write_text("kept")
    leftover = temporary_path(str(tmp_path / "config.yaml"))
    open(leftover, "w").close()
    staging = temporary_path(str(tmp_path / "00000004"))
    os.makedirs(os.path.join(staging, "checkpoints"))
    assert sorted(remove_temporaries(str(tmp_path))) == sorted([leftover, staging])
    assert files_under(tmp_path) == ["config.yaml"]


def make_run(tmp_path, step: int = 4):
    train_dir = tmp_path / "run"
    path = save_checkpoint(str(train_dir), Checkpoint(model={"w": torch.arange(50_000.0)}, progress={"step": step}),
                           keep=2)
    (train_dir / "config.yaml").write_text("model: MoeModel\n")
    (train_dir / "model_size.json").write_text('{"model": "MoeModel", "parameters": 50000}\n')
    return train_dir, path


def test_an_export_is_staged_whole_and_replaces_an_older_one(tmp_path):
    train_dir, checkpoint = make_run(tmp_path)
    write_export(str(train_dir), "best", checkpoint, {"global_step": 4, "gap": 0.5})
    folder = write_export(str(train_dir), "best", checkpoint, {"global_step": 4, "gap": 0.6})
    assert read_export_metrics(folder)["gap"] == 0.6
    assert files_under(train_dir / "export") == ["best", "best/00000004", "best/00000004/checkpoints",
                                                 "best/00000004/checkpoints/ckpt-00000004.pt",
                                                 "best/00000004/config.yaml", "best/00000004/metrics.json",
                                                 "best/00000004/model_size.json"]


def refuse_hard_links(source, destination):
    raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))


@pytest.mark.parametrize("kind", ["best", "final"])
def test_a_full_disk_during_an_export_keeps_the_previous_export(tmp_path, monkeypatch, kind):
    train_dir, checkpoint = make_run(tmp_path)
    previous = write_export(str(train_dir), kind, checkpoint, {"global_step": 4, "gap": 0.5})
    before = files_under(train_dir)
    monkeypatch.setattr(os, "link", refuse_hard_links)  # the checkpoint is copied, as on another filesystem
    fill_disk_after(monkeypatch, train_dir / "export", budget=1000)
    with pytest.raises(WriteError, match=r"could not write .*ckpt-00000004\.pt: No space left on device"):
        write_export(str(train_dir), kind, checkpoint, {"global_step": 4, "gap": 0.9})
    assert files_under(train_dir) == before
    assert read_export_metrics(previous)["gap"] == 0.5
    assert [step for step, _ in list_exports(str(train_dir), "best")] == ([4] if kind == "best" else [])
    assert os.path.isdir(export_path(str(train_dir), kind, 4))


def write_jsonl_predictions(path, videos: int) -> None:
    with open(path, "w") as fh:
        for number in range(videos):
            fh.write(json.dumps({"video_id": f"video{number:05d}", "class_indexes": [3, 1, 2],
                                 "predictions": [0.9, 0.5, 0.25]}) + "\n")


def test_cli_a_full_disk_while_writing_predictions_is_one_line_and_leaves_no_file(tmp_path):
    source, output = tmp_path / "p.jsonl", tmp_path / "out" / "submission.csv"
    write_jsonl_predictions(source, 5000)
    output.parent.mkdir()
    result = subprocess.run([sys.executable, "-m", "yt8m", "convert-predictions", "--input", str(source),
                             "--output", str(output)], capture_output=True, text=True,
                            preexec_fn=file_size_limit(16_384), env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    # The temporary database of ids (checked for duplicates) or the output itself meets the limit first.
    assert len(errors) == 1 and errors[0].startswith("yt8m convert-predictions: error: ")
    assert f"could not write {output}: File too large" in errors[0] or "temporary database" in errors[0]
    assert files_under(output.parent) == []

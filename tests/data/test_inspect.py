"""Tests of `yt8m inspect`: JSON lines equal to the fixture sidecars, the summary, and bad input."""

from __future__ import annotations

import json
import logging
import uuid

import numpy as np
import pytest

from conftest import as_float32, load_sidecar
from yt8m import cli
from yt8m.commands.inspect import main
from yt8m.data.format.encode import encode_video_example
from yt8m.data.format.tfrecord import CorruptRecordError, TFRecordWriter, expand_pattern

VIDEO_FILES = ["video/train00.tfrecord", "video/train01.tfrecord", "video/train02.tfrecord",
               "video_2017/train00.tfrecord", "video_gzip/train00.tfrecord.gz"]
FRAME_FILES = ["frame/train00.tfrecord", "frame/train01.tfrecord",
               "segment/validate00.tfrecord", "segment/validate01.tfrecord"]
SEGMENT_KEYS = ("segment_start_times", "segment_end_times", "segment_labels", "segment_scores")


def json_lines(capsys, *argv: str) -> list[dict]:
    assert main(list(argv) + ["--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def float_bits(values: list) -> np.ndarray:
    return as_float32(values).view(np.uint32)


@pytest.mark.parametrize("name", VIDEO_FILES)
def test_json_equals_video_sidecar(fixtures_dir, capsys, name):
    sidecar = load_sidecar(fixtures_dir / name)
    lines = json_lines(capsys, str(fixtures_dir / name))
    assert len(lines) == sidecar["num_records"]
    for line, record in zip(lines, sidecar["records"]):
        assert line["id"] == record["id"] and line["labels"] == record["labels"]
        assert sorted(line["features"]) == ["mean_audio", "mean_rgb"] and "num_frames" not in line
        for feature in ("mean_rgb", "mean_audio"):
            assert np.array_equal(float_bits(line["features"][feature]), float_bits(record[feature]))


@pytest.mark.parametrize("name", FRAME_FILES)
def test_json_equals_frame_sidecar(fixtures_dir, capsys, name):
    sidecar = load_sidecar(fixtures_dir / name)
    lines = json_lines(capsys, str(fixtures_dir / name))
    assert len(lines) == sidecar["num_records"]
    for line, record in zip(lines, sidecar["records"]):
        assert (line["id"], line["labels"], line["num_frames"]) == (record["id"], record["labels"], record["num_frames"])
        assert line["features"]["rgb"] == record["rgb"] and line["features"]["audio"] == record["audio"]
        for key in SEGMENT_KEYS:
            assert line["features"].get(key) == record.get(key)


def test_json_limit_and_forced_message_type(fixtures_dir, capsys):
    path = str(fixtures_dir / "frame/train01.tfrecord")
    assert len(json_lines(capsys, path, "--limit", "2")) == 2
    as_example = json_lines(capsys, path, "--frame_features=false", "--limit", "1")[0]
    assert "num_frames" not in as_example and "rgb" not in as_example["features"]
    video = json_lines(capsys, str(fixtures_dir / "video/train00.tfrecord"), "--frame_features", "--limit", "1")[0]
    assert video["num_frames"] == 0 and len(video["features"]["mean_rgb"]) == 1024


def test_summary_of_video_files(fixtures_dir, capsys):
    assert main([f"{fixtures_dir}/video/*.tfrecord,{fixtures_dir}/video_2017/*.tfrecord"]) == 0
    text = capsys.readouterr().out
    assert "files: 4" in text and "records: 334" in text
    assert "id key: id (272), video_id (62)" in text
    assert "mean_rgb: float_list, 1024 values (334 records)" in text
    assert "mean_audio: float_list, 128 values (334 records)" in text
    assert "videos without a labels feature: 1" in text and "ids 0..3861" in text


def test_summary_of_frame_files(fixtures_dir, capsys):
    sidecars = [load_sidecar(fixtures_dir / name) for name in FRAME_FILES]
    frames = [r["num_frames"] for s in sidecars for r in s["records"]]
    assert main([f"{fixtures_dir}/frame/*.tfrecord,{fixtures_dir}/segment/*.tfrecord"]) == 0
    text = capsys.readouterr().out
    assert f"records: {len(frames)}" in text and "messages: SequenceExample" in text
    assert "rgb: feature list of bytes_list, 1024 bytes per frame" in text
    assert "audio: feature list of bytes_list, 128 bytes per frame" in text
    assert f"frames per video: min {min(frames)}, mean {np.mean(frames):.1f}, max {max(frames)}" in text


def test_summary_of_real_2018_shards(realdata_dir, capsys):
    assert main([str(realdata_dir / "yt8m_2018_video_validate/validate000[0-3].tfrecord")]) == 0
    text = capsys.readouterr().out
    # These shards end every record with an empty feature_lists field; they are still Examples.
    assert "messages: Example (" in text and "frames per video" not in text


@pytest.mark.parametrize("name", ["video_bad_data_crc", "video_bad_length_crc", "video_truncated"])
def test_corrupt_file_fails_or_is_skipped_and_counted(fixtures_dir, capsys, caplog, name):
    path = str(fixtures_dir / "corrupt" / f"{name}.tfrecord")
    corruption = load_sidecar(fixtures_dir / "corrupt" / f"{name}.tfrecord")["corruption"]
    with pytest.raises(CorruptRecordError, match=rf"{path}: .* record at \d+"):
        main([path])
    assert cli.main(["inspect", path]) == 1
    assert path in capsys.readouterr().err
    with caplog.at_level(logging.WARNING):
        assert main([path, "--skip_corrupt"]) == 0
    text = capsys.readouterr().out
    assert f"records: {corruption['bad_record_index']}" in text
    assert f"corrupt files skipped after their last good record: 1 ({path})" in text
    assert any("skipping the rest" in rec.getMessage() for rec in caplog.records)
    assert len(json_lines(capsys, path, "--skip_corrupt")) == corruption["tf_records_read_before_error"]


def test_empty_glob_names_the_pattern(fixtures_dir, capsys):
    pattern = f"{fixtures_dir}/video/no_such_*.tfrecord"
    with pytest.raises(ValueError, match="no_such_"):
        main([pattern])
    assert cli.main(["inspect", pattern]) == 1
    assert "no_such_" in capsys.readouterr().err


def test_malformed_record_names_file_and_offset():
    path = f"memory://inspect-{uuid.uuid4().hex}/bad.tfrecord"
    good = encode_video_example("ok", [1], {"mean_rgb": np.zeros(4, np.float32)})
    with TFRecordWriter(path) as writer:
        writer.write(good)
        writer.write(b"\x0a\x05\x0a\x09")
    expanded = expand_pattern(path)[0]  # fsspec's spelling: memory:///...
    with pytest.raises(ValueError, match=rf"{expanded}: record at byte offset {12 + len(good) + 4}: field 1"):
        main([path])

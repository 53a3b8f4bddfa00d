"""Feature names that the shards do not hold (frame-level names on video-level data, or the other way round) fail in
one line that lists what the record holds and the flags that read it."""

from __future__ import annotations

import pytest

from yt8m import cli
from yt8m.data.making.synthetic import write_synthetic


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("mismatch"))
    for kind in ("video", "frame"):
        write_synthetic(root, kind=kind, num_classes=5, train_videos=8, validate_videos=4, test_videos=0, shards=1,
                        feature_sizes=(16, 8), min_frames=6, max_frames=12)
    return root


def train_error(capsys, *flags: str) -> str:
    status = cli.main(["train", "--train_dir", "unused", "--num_classes", "5", "--feature_sizes", "16,8", *flags])
    err = capsys.readouterr().err.splitlines()
    assert status == 1
    return err[-1]


def test_frame_feature_names_on_video_data_name_the_records_features(shards, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = train_error(capsys, "--train_data_pattern", f"{shards}/video/train-*", "--feature_names", "rgb,audio")
    assert line.startswith("yt8m train: error: ")
    assert line.endswith("feature 'rgb': expected float_list of 16 values, found none (missing): the record is "
                         "video-level, its features mean_rgb (16 floats), mean_audio (8 floats); read it with "
                         "--feature_names mean_rgb,mean_audio --feature_sizes 16,8")


def test_video_feature_names_on_frame_data_suggest_frame_features(shards, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = train_error(capsys, "--train_data_pattern", f"{shards}/frame/train-*", "--feature_names",
                       "mean_rgb,mean_audio")
    assert line.endswith("the record is frame-level, its feature lists rgb (16 bytes a frame), audio (8 bytes a "
                         "frame); read it with --frame_features --feature_names rgb,audio --feature_sizes 16,8")


def test_frame_features_on_video_data_suggest_reading_without_them(shards, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = train_error(capsys, "--train_data_pattern", f"{shards}/video/train-*", "--frame_features",
                       "--model", "FrameLevelLogisticModel", "--feature_names", "rgb,audio")
    assert line.endswith("feature list 'rgb': expected 16 bytes per frame, found none (missing): the record is "
                         "video-level, its features mean_rgb (16 floats), mean_audio (8 floats); read it without "
                         "--frame_features, with --feature_names mean_rgb,mean_audio --feature_sizes 16,8")

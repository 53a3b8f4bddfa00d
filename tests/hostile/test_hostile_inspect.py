"""`yt8m inspect` of a dataset laid out with symlinks: a glob matches what the shell's glob matches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_outcome import yt8m  # noqa: F401  (fixtures)

from yt8m.data.making.synthetic import write_synthetic

pytestmark = pytest.mark.hostile


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("synthetic")
    write_synthetic(str(root), kind="video", num_classes=5, train_videos=6, validate_videos=0, test_videos=0,
                    shards=2, feature_sizes=(4, 2), seed=1)
    return sorted((root / "video").glob("train-*.tfrecord"))


def test_symlinked_shards_are_matched_by_a_glob(yt8m, shards, tmp_path):
    for shard in shards:
        (tmp_path / shard.name).symlink_to(shard)
    (tmp_path / "relative.tfrecord").symlink_to(os.path.relpath(shards[0], tmp_path))
    (tmp_path / "folder.tfrecord").mkdir()  # a folder, and hidden files, are never shards
    (tmp_path / ".hidden.tfrecord").symlink_to(shards[0])
    outcome = yt8m("inspect", str(tmp_path / "*.tfrecord"), "--json")
    assert outcome.assert_success() and len(outcome.out.splitlines()) == 6 + 3


def test_a_dangling_symlink_is_named(yt8m, tmp_path):
    (tmp_path / "gone.tfrecord").symlink_to(tmp_path / "nowhere.tfrecord")
    outcome = yt8m("inspect", str(tmp_path / "*.tfrecord"))
    outcome.assert_clean_error("gone.tfrecord")

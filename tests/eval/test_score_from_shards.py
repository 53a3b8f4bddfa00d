"""Video-level `yt8m score --labels` from TFRecord shards (globs, comma-separated) scores as the labels CSV does, and
`yt8m inspect --write_labels_csv` writes that CSV from shards: real 2018 validate shards (their count from the
manifest) and synthetic frame-level ones."""

from __future__ import annotations

import json
import shutil

import numpy as np

from conftest import manifest_totals
from yt8m.cli import main as cli_main
from yt8m.data.making.synthetic import write_synthetic
from yt8m.eval.score import read_labels_csv

REAL_SHARDS = "yt8m_2018_video_validate"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli_main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def write_predictions(path, labels: dict[str, np.ndarray]) -> None:
    """A submission that ranks each video's labels first, then a wrong class: GAP short of 1, every video listed."""
    lines = ["VideoId,LabelConfidencePairs"]
    for number, (video_id, classes) in enumerate(labels.items()):
        pairs = [f"{c} {0.9 - 0.1 * rank:.2f}" for rank, c in enumerate(classes[:3].tolist())]
        lines.append(f"{video_id},{' '.join(pairs + [f'{3861 - number % 7} 0.95'])}")
    path.write_text("\n".join(lines) + "\n")


def test_real_shards_score_as_their_labels_csv(realdata_dir, tmp_path, capsys):
    shards = f"{realdata_dir}/{REAL_SHARDS}/validate011*.tfrecord,{realdata_dir}/{REAL_SHARDS}/validate012*.tfrecord"
    status, out, err = run(capsys, "inspect", shards, "--write_labels_csv", str(tmp_path / "labels.csv"))
    assert status == 0
    labels = read_labels_csv(str(tmp_path / "labels.csv"))
    expected = sum(manifest_totals(f"{REAL_SHARDS}/validate01{digit}")["records"] for digit in (1, 2))
    assert len(labels) == expected and f"records: {expected}" in out
    assert f"wrote the labels of {expected} videos to {tmp_path / 'labels.csv'}" in err
    write_predictions(tmp_path / "predictions.csv", labels)
    from_csv = run(capsys, "score", "--predictions", str(tmp_path / "predictions.csv"), "--labels",
                   str(tmp_path / "labels.csv"))
    from_shards = run(capsys, "score", "--predictions", str(tmp_path / "predictions.csv"), "--labels", shards)
    assert from_csv[0] == from_shards[0] == 0
    assert json.loads(from_shards[1]) == json.loads(from_csv[1])
    assert json.loads(from_shards[1])["num_videos"] == expected


def test_frame_level_shards_write_the_csv_synth_writes(tmp_path, capsys):
    written = write_synthetic(str(tmp_path), kind="frame", num_classes=9, train_videos=4, validate_videos=12,
                              test_videos=0, shards=3, feature_sizes=(8, 4), min_frames=3, max_frames=6)
    assert run(capsys, "inspect", f"{tmp_path}/frame/validate-*", "--write_labels_csv",
               str(tmp_path / "labels.csv"))[0] == 0
    assert (tmp_path / "labels.csv").read_text() == open(written["validate_labels"]).read()


def test_a_video_in_two_shards_is_an_error_naming_both_and_writes_nothing(tmp_path, capsys):
    write_synthetic(str(tmp_path), kind="video", num_classes=9, train_videos=4, validate_videos=6, test_videos=0,
                    shards=2, feature_sizes=(8, 4))
    first = tmp_path / "video" / "validate-00000-of-00002.tfrecord"
    shutil.copy(first, tmp_path / "video" / "validate-copy.tfrecord")
    status, out, err = run(capsys, "inspect", f"{tmp_path}/video/validate-*", "--write_labels_csv",
                           str(tmp_path / "labels.csv"))
    assert (status, out) == (1, "")
    assert err.startswith("yt8m inspect: error: video ") and "is in two records (" in err
    assert str(first) in err and "validate-copy.tfrecord" in err
    assert not list(tmp_path.glob("labels.csv*"))
    (tmp_path / "p.csv").write_text("VideoId,LabelConfidencePairs\n")
    status, _, err = run(capsys, "score", "--predictions", str(tmp_path / "p.csv"), "--labels",
                         f"{tmp_path}/video/validate-*", "--num_classes", "9")
    assert status == 1 and "is in two records (" in err and "validate-copy.tfrecord" in err

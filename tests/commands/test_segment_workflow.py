"""The 2019 segment workflow as a user runs it, one `yt8m` process per step: synth -> train a frame model on video
labels -> fine-tune it on rated segments -> predict every segment of the validate videos -> score the submissions
against the validate shards' ratings. Fine-tuning must raise the competition metric."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

NUM_CLASSES = 40
MODEL_FLAGS = ["--frame_features", "--feature_names", "rgb,audio", "--feature_sizes", "16,8", "--num_classes",
               str(NUM_CLASSES), "--model", "FrameLevelLogisticModel", "--batch_size", "32", "--num_readers", "0",
               "--base_learning_rate", "0.05", "--seed", "1", "--log_every_steps", "100"]


def yt8m(*args: str, cwd: Path) -> str:
    """Run `yt8m ARGS` in a process of its own; its stdout (the command's JSON line where it prints one)."""
    done = subprocess.run([sys.executable, "-m", "yt8m", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"yt8m {' '.join(args)}:\n{done.stderr[-3000:]}"
    return done.stdout


def submission_rows(path: Path) -> dict[int, list[str]]:
    lines = path.read_text().splitlines()
    assert lines[0] == "Class,Segments"
    return {int(cls): segments.split() for cls, segments in (line.split(",") for line in lines[1:])}


@pytest.mark.integration
def test_synth_train_finetune_predict_score(tmp_path):
    yt8m("synth", "--output_dir", ".", "--kind", "segment", "--num_classes", str(NUM_CLASSES), "--train_videos",
         "240", "--validate_videos", "80", "--test_videos", "0", "--shards", "2", "--feature_sizes", "16,8",
         "--min_frames", "30", "--max_frames", "80", "--seed", "3", cwd=tmp_path)
    train, validate = "segment/train-*.tfrecord", "segment/validate-*.tfrecord"
    yt8m("train", *MODEL_FLAGS, "--train_data_pattern", train, "--train_dir", "video_run", "--num_epochs", "3",
         cwd=tmp_path)
    yt8m("train", *MODEL_FLAGS, "--segment_labels", "--init_from", "video_run", "--train_data_pattern", train,
         "--train_dir", "segment_run", "--num_epochs", "4", cwd=tmp_path)
    # synth lists the rated classes as the 2019 segment_vocabulary.csv does: the rows a submission needs.
    rated_classes = [int(line.split(",")[0]) for line in
                     (tmp_path / "segment" / "segment_vocabulary.csv").read_text().splitlines()[1:]]

    scores = {}
    for run in ("video_run", "segment_run"):
        summary = json.loads(yt8m("predict", "--segment_labels", "--input_data_pattern", validate, "--train_dir", run,
                                  "--segment_label_ids_file", "segment/segment_vocabulary.csv", "--output_file",
                                  f"{run}.csv", "--num_readers", "0", cwd=tmp_path).strip().splitlines()[-1])
        rows = submission_rows(tmp_path / f"{run}.csv")
        assert sorted(rows) == rated_classes
        # Every segment of every validate video is a candidate of every class (30-80 frames: 6-16 segments each).
        assert all(len(segments) == summary["segments"] for segments in rows.values())
        assert 80 * 6 <= summary["segments"] <= 80 * 16
        scores[run] = json.loads(yt8m("score", "--segment_labels", "--predictions", f"{run}.csv", "--labels",
                                      validate, "--num_classes", str(NUM_CLASSES), cwd=tmp_path))
    assert scores["video_run"]["num_rated_pairs"] == scores["segment_run"]["num_rated_pairs"] > 0
    # Predicting every segment and scoring the submission gives the segment mAP eval computes on the rated segments.
    evaluated = json.loads(yt8m("eval", "--segment_labels", "--eval_data_pattern", validate, "--train_dir",
                                "segment_run", "--run_once", "--num_readers", "0", cwd=tmp_path))
    assert evaluated["segment_map"] == pytest.approx(scores["segment_run"]["segment_map"], abs=1e-9)
    assert scores["segment_run"]["segment_map"] > scores["video_run"]["segment_map"] + 0.02, scores

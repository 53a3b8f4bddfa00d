"""`yt8m demo`: every stage runs and the report says where things are (a small set, to stay fast)."""

from __future__ import annotations

import json
import os
import re

import pytest

from yt8m.commands.demo import main

pytestmark = pytest.mark.integration


def test_demo_runs_every_stage_and_reports(tmp_path, capsys):
    output = tmp_path / "demo"
    assert main(["--output_dir", str(output), "--num_classes", "20", "--train_videos", "512",
                 "--num_epochs", "2", "--tune_trials", "2", "--segment_videos", "200"]) == 0
    out, report = capsys.readouterr()
    summary = json.loads(out)  # one JSON line on stdout; the report for a person on stderr
    train_dir = output / "train_dir"
    for text in ("validate       GAP", "segments       validate segment mAP", "tune           best validate GAP",
                 "test (scored)  GAP", f"tensorboard --logdir {train_dir}", str(output / "predictions.csv"),
                 "GAP@20: every video's 20 best guesses pooled", "Hit@1: the share of videos"):
        assert text in report
    counted = re.search(r"trials: (\d+) complete(?:, (\d+) pruned)?\n", report)  # read as words, not a dict
    assert "{'complete'" not in report and counted and int(counted[1]) + int(counted[2] or 0) == 2
    assert summary["tune"]["baseline_value"] is not None  # the untuned settings were the first trial
    assert summary["validate"]["num_videos"] == summary["test"]["num_videos"] == 128
    assert os.path.exists(train_dir / "checkpoints" / "final")
    assert os.path.exists(output / "study" / "best.yaml")
    assert len(os.listdir(output / "study" / "trials")) == 2
    with open(train_dir / "eval" / "metrics-00000004.json") as fh:
        assert json.load(fh)["num_videos"] == 128
    with open(output / "predictions.csv") as fh:
        assert sum(1 for _ in fh) == 1 + 128
    with open(output / "data" / "segment" / "segment_vocabulary.csv") as fh:
        rated_classes = [line.split(",")[0] for line in fh][1:]  # the synthetic rated classes: a row each
    with open(output / "segments_fine_tuned.csv") as fh:
        assert next(fh) == "Class,Segments\n" and [line.split(",")[0] for line in fh] == rated_classes

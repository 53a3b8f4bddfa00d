"""`yt8m demo`: every stage runs and the report says where things are (a small set, to stay fast)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from yt8m.commands.demo import main

pytestmark = pytest.mark.integration


def assert_commands_run_as_printed(report: str) -> None:
    """Each command the summary prints (yt8m, tensorboard, mkdocs) is a path to an executable, or a name PATH finds."""
    commands = re.findall(r"(\S*\b(?:yt8m|tensorboard|mkdocs)) (?:train|tune|--logdir|serve)\b", report)
    assert len(commands) >= 3, report
    for command in commands:
        found = shutil.which(command) if os.sep not in command else command
        assert found and os.access(found, os.X_OK), command


def test_demo_runs_every_stage_and_reports(tmp_path, capsys):
    output = tmp_path / "demo"
    assert main(["--output_dir", str(output), "--num_classes", "20", "--train_videos", "512",
                 "--num_epochs", "2", "--tune_trials", "2", "--segment_videos", "200"]) == 0
    out, report = capsys.readouterr()
    summary = json.loads(out)  # one JSON line on stdout; the report for a person on stderr
    train_dir = output / "train_dir"
    for text in ("validate       GAP", "segments       validate segment mAP", "test (scored)  GAP",
                 str(output / "predictions.csv"), "GAP@20: every video's 20 best guesses pooled",
                 "Hit@1: the share of videos", "next steps", "Real data in 10 minutes", "docs/quickstart.md"):
        assert text in report
    counted = re.search(r"tune           (\d+) complete(?:, (\d+) pruned)?: best validate GAP", report)  # words
    assert "{'complete'" not in report and counted and int(counted[1]) + int(counted[2] or 0) == 2
    tune = summary["tune"]
    assert tune["baseline_trial"] == 0 and tune["baseline_value"] is not None  # the untuned settings went first
    # A gain is claimed only against the untuned settings' own trial (the same measurement), never against the run
    # above (its last epoch); a search that did not beat them says so.
    if tune["best_trial"] == tune["baseline_trial"]:
        assert "no trial beat the untuned settings" in report and "against the untuned" not in report
    else:
        gain = f"{tune['best_value'] - tune['baseline_value']:+.4f} against the untuned settings' trial 0"
        assert gain in report
    assert "(a trial's GAP is its best epoch's; the validate line above is the last epoch's" in report
    assert_commands_run_as_printed(report)

    # The report pages: the validate evaluation's, its classes named by the vocabulary the demo wrote; the study's.
    page = (output / "report.html").read_text()
    assert summary["report"] == str(output / "report.html") and 'data-headline="gap"' in page and "Class 0" in page
    assert summary["tune"]["page"] == str(output / "study_report.html")
    assert 'id="leaderboard"' in (output / "study_report.html").read_text()
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

"""Ctrl+C and SIGTERM only ask a run to stop: `yt8m train` stops between two steps, saves what it trained (a checkpoint
not evaluated), says so in one line with exit status 130, and the same command resumes it to the weights an
uninterrupted run ends with. A second Ctrl+C ends the process at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, tiny_data  # noqa: F401  (fixture)
from yt8m.io.checkpoints import final_checkpoint, list_checkpoints, load_checkpoint

pytestmark = pytest.mark.integration


def train_command(data: dict, train_dir: Path) -> list[str]:
    """A MoeModel run long enough to be stopped in (40 epochs of 4 steps, validated every 4 steps)."""
    return [sys.executable, "-m", "yt8m", "train", "--train_data_pattern", data["train_pattern"],
            "--eval_data_pattern", data["validate_pattern"], "--train_dir", str(train_dir), "--model", "MoeModel",
            "--feature_names", "mean_rgb,mean_audio", "--feature_sizes", ",".join(map(str, FEATURE_SIZES)),
            "--num_classes", str(NUM_CLASSES), "--batch_size", "64", "--num_epochs", "40", "--export_model_steps",
            "4", "--num_readers", "0", "--seed", "7", "--log_every_steps", "1"]


def wait_for_checkpoint(train_dir: Path, process: subprocess.Popen, step: int) -> None:
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if (train_dir / "checkpoints").exists() and any(saved >= step for saved, _ in
                                                          list_checkpoints(str(train_dir))):
            return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint of step {step} (exit status {process.poll()})")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_train_between_steps_and_the_same_command_resumes_it_exactly(tiny_data, tmp_path, signum):
    reference = tmp_path / "uninterrupted"
    assert subprocess.run(train_command(tiny_data, reference), capture_output=True).returncode == 0
    stopped = tmp_path / "stopped"
    process = subprocess.Popen(train_command(tiny_data, stopped), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    wait_for_checkpoint(stopped, process, 8)
    process.send_signal(signum)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    last = err.strip().splitlines()[-1]
    saved = list_checkpoints(str(stopped))[-1]
    assert last == (f"yt8m train: stopped by {signal.Signals(signum).name} at step {saved[0]}: its progress is in "
                    f"{saved[1]}; run the same command to resume"), err
    assert "Traceback" not in err and final_checkpoint(str(stopped)) is None
    assert bool(load_checkpoint(saved[1]).progress.get("unscheduled")) == (saved[0] % 4 != 0)

    resumed = subprocess.run(train_command(tiny_data, stopped), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    expected, got = (load_checkpoint(final_checkpoint(str(run))) for run in (reference, stopped))
    assert expected.step == got.step == 160
    for name, tensor in expected.model.items():
        torch.testing.assert_close(got.model[name], tensor, rtol=0, atol=0)
    evaluations = sorted(path.name for path in (stopped / "eval").glob("metrics-*.json"))
    assert evaluations == sorted(path.name for path in (reference / "eval").glob("metrics-*.json"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals")
def test_a_second_ctrl_c_ends_the_process_at_once(tiny_data, tmp_path):
    """The first asks for a stop at the step's end; a person pressing Ctrl+C again gets the process ended as the
    signal ends it, whatever it is doing."""
    script = ("import os, signal, time\n"
              "from yt8m.training.stopping import noting_signals\n"
              "with noting_signals():\n"
              "    print('ready', flush=True)\n"
              "    while True:\n"
              "        time.sleep(0.05)  # a step that does not end\n")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                               env={**os.environ})
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGINT)
    time.sleep(0.3)
    assert process.poll() is None  # asked to stop, still in its step
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == -signal.SIGINT


def test_a_stop_between_checkpoints_saves_one_a_resume_does_not_evaluate(tiny_data, tmp_path, monkeypatch):
    """Stopped at step 5 (checkpoints every 4): step 5 is saved, marked unscheduled; the resume trains on from it
    without evaluating it, so the run's evaluations and its final weights are those of an uninterrupted run."""
    from workflow_fixtures import tiny_train_config
    from yt8m.training import train
    from yt8m.training.stopping import STOPS, StopReason

    def config(folder: str):
        return tiny_train_config(tiny_data, tmp_path / folder, export_model_steps=4,
                                 eval_data_pattern=tiny_data["validate_pattern"])

    train(config("uninterrupted"))
    asked = iter(range(100))
    monkeypatch.setattr(STOPS, "reason", lambda: StopReason("stopped by SIGTERM", interrupted=True)
                        if next(asked) == 6 else None)  # asked before each step and at the epoch end: before step 6
    summary = train(config("stopped"))
    assert (summary["global_step"], summary["interrupted"]) == (5, True)
    saved = load_checkpoint(list_checkpoints(str(tmp_path / "stopped"))[-1][1])
    assert saved.step == 5 and saved.progress["unscheduled"] is True
    monkeypatch.undo()
    train(config("stopped"))
    expected, got = (load_checkpoint(final_checkpoint(str(tmp_path / run))) for run in ("uninterrupted", "stopped"))
    for name, tensor in expected.model.items():
        torch.testing.assert_close(got.model[name], tensor, rtol=0, atol=0)
    assert sorted(path.name for path in (tmp_path / "stopped" / "eval").glob("metrics-*.json")) == \
        sorted(path.name for path in (tmp_path / "uninterrupted" / "eval").glob("metrics-*.json"))

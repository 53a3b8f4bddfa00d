"""`yt8m train` meeting a fault while it runs: a reader process killed (as the OOM killer does) and the GPU out of
memory each end the run with one line; a killed reader's run saves what it trained and the same command resumes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, tiny_data  # noqa: F401
from yt8m import cli
from yt8m.io.checkpoints import final_checkpoint, list_checkpoints


def flags(data: dict, train_dir: Path, *extra: str) -> list[str]:
    return ["--train_data_pattern", data["train_pattern"], "--train_dir", str(train_dir), "--model", "MoeModel",
            "--feature_names", "mean_rgb,mean_audio", "--feature_sizes", ",".join(map(str, FEATURE_SIZES)),
            "--num_classes", str(NUM_CLASSES), "--export_model_steps", "100000", "--log_every_steps", "1",
            "--seed", "7", *extra]


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` and that run its command line (its forked DataLoader workers)."""
    own = Path(f"/proc/{pid}/cmdline").read_bytes()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if entry.name.isdigit() and int(stat.rpartition(")")[2].split()[1]) == pid and \
                    (entry / "cmdline").read_bytes() == own:
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def train_killing_its_reader(argv: list[str]) -> subprocess.CompletedProcess:
    """`yt8m train ARGV` whose reader is killed with SIGKILL once the log shows a trained step."""
    process = subprocess.Popen([sys.executable, "-m", "yt8m", "train", *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    err = []
    for line in process.stderr:
        err.append(line)
        if " step " in line and "| epoch 1/" in line:
            for worker in children(process.pid):
                os.kill(worker, signal.SIGKILL)
            break
    rest, tail = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, rest, "".join(err) + tail)


def test_a_killed_reader_ends_the_run_in_one_line_with_a_checkpoint_and_the_same_command_resumes(tiny_data,
                                                                                                  tmp_path):
    argv = flags(tiny_data, tmp_path / "run", "--num_readers", "1", "--batch_size", "1", "--num_epochs", "2")
    killed = train_killing_its_reader(argv)
    assert killed.returncode == 1, killed.stderr[-3000:]
    assert "Traceback" not in killed.stderr
    line = killed.stderr.strip().splitlines()[-1]
    assert line.startswith("yt8m train: error: reader process (DataLoader worker, pid "), line
    assert "killed by signal 9 (SIGKILL): likely out of memory" in line and "MiB resident" in line, line
    saved = [path for _, path in list_checkpoints(str(tmp_path / "run"))]
    assert len(saved) == 1 and f"saved {saved[0]} (step " in line and "run the same command to resume" in line, line
    assert final_checkpoint(str(tmp_path / "run")) is None

    again = subprocess.run([sys.executable, "-m", "yt8m", "train", *argv], capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {saved[0]}" in again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["global_step"] == 2 * 240


def out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("patched, where", [
    ("yt8m.training.stepper.Stepper.step", "a training step"),
    ("yt8m.training.validation.evaluate_model", "a validation batch"),
])
def test_running_out_of_gpu_memory_is_one_line_naming_the_batch_size_and_the_flag(tiny_data, tmp_path, monkeypatch,
                                                                                  capsys, patched, where):
    monkeypatch.setattr(patched, out_of_memory)
    argv = flags(tiny_data, tmp_path / "run", "--num_readers", "0", "--batch_size", "32", "--num_epochs", "1",
                 "--export_model_steps", "2", "--eval_data_pattern", tiny_data["validate_pattern"])
    assert cli.main(["train", *argv]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"yt8m train: error: out of GPU memory in {where} at --batch_size 32: lower --batch_size (with "
        f"--numbatches_to_aggregate to keep the examples per optimizer step), or free GPU memory")

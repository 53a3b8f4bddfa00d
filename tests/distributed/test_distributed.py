"""Distributed training on CPU: 2 gloo processes under torchrun on unevenly sharded data, resumption in one
process, the watching evaluator beside the job, an elastic restart after a killed worker, and --num_gpu.

The data split is checked with YT8M_TRAINED_IDS_DIR (each process logs the video ids it trains on).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from workflow_fixtures import as_flags, train_config
from yt8m.commands.train import main
from yt8m.data.format.tfrecord import expand_pattern, read_records
from yt8m.data.making.synthetic import write_synthetic
from yt8m.eval.evaluate import evaluate_run
from yt8m.io.checkpoints import final_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from yt8m.training import train
from yt8m.training.trained_ids import TRAINED_IDS_ENV

pytestmark = pytest.mark.integration

NUM_CLASSES, FEATURE_SIZES, TRAIN_VIDEOS = 12, (16, 8), 250


@pytest.fixture(scope="module")
def uneven_data(tmp_path_factory) -> dict:
    """250 training videos in 3 shards: with 2 processes, rank 0 reads two of them and rank 1 one."""
    root = tmp_path_factory.mktemp("uneven")
    write_synthetic(str(root), kind="video", num_classes=NUM_CLASSES, train_videos=TRAIN_VIDEOS,
                    validate_videos=32, test_videos=0, shards=3, feature_sizes=FEATURE_SIZES, seed=5)
    train = str(root / "video" / "train-*.tfrecord")
    shard_sizes = [sum(1 for _ in read_records(path)) for path in expand_pattern(train)]
    return {"train": train, "validate": str(root / "video" / "validate-*.tfrecord"), "shard_sizes": shard_sizes}


def config_values(data: dict, train_dir: Path, **overrides) -> dict:
    values = dict(train_data_pattern=data["train"], train_dir=str(train_dir), model="MoeModel",
                  feature_names="mean_rgb,mean_audio", feature_sizes=",".join(map(str, FEATURE_SIZES)),
                  num_classes=NUM_CLASSES, batch_size=16, num_epochs=2, export_model_steps=4, num_readers=0,
                  log_every_steps=100, metrics_every_steps=100)
    return {**values, **overrides}


def start_torchrun(values: dict, *torchrun_flags: str, ids_dir: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if ids_dir is not None:
        env[TRAINED_IDS_ENV] = str(ids_dir)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               *torchrun_flags, "-m", "yt8m", "train", *as_flags(values)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, timeout: float = 120) -> tuple[dict, str]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    lines = out.splitlines()
    assert len(lines) == 1, out  # rank 0 alone prints the summary
    return json.loads(lines[0]), err


def trained_ids(ids_dir: Path) -> dict[int, collections.Counter]:
    """epoch -> how often each video id was trained on, over all processes."""
    per_epoch: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for path in ids_dir.glob("rank-*.txt"):
        for line in path.read_text().splitlines():
            epoch, video_id = line.split()
            per_epoch[int(epoch)][video_id] += 1
    return per_epoch


def test_two_processes_split_every_epoch_and_resume_in_one(uneven_data, tmp_path, monkeypatch):
    """Job 1 stops late in epoch 2, after rank 1's share has run out; job 2 (2 processes) finishes epoch 2;
    then one process trains epoch 3. The watching evaluator runs beside job 1."""
    train_dir, ids_dir = tmp_path / "run", tmp_path / "ids"
    ids_dir.mkdir()
    sizes = uneven_data["shard_sizes"]
    rank_batches = [math.ceil((sizes[0] + sizes[2]) / 16), math.ceil(sizes[1] / 16)]  # whole files dealt in turn
    steps_per_epoch = max(rank_batches)  # the longer share sets it; the other joins with zero-weight steps
    stop_at = steps_per_epoch + rank_batches[1] + 1
    assert stop_at < 2 * steps_per_epoch

    watched: list[int] = []
    watcher = dict(eval_data_pattern=uneven_data["validate"], train_dir=str(train_dir), num_readers=0,
                         poll_interval_secs=0.05)
    thread = threading.Thread(target=lambda: watched.extend(r["global_step"] for r in evaluate_run(watcher)),
                              daemon=True)
    thread.start()
    first, _ = finish(start_torchrun(config_values(uneven_data, train_dir, max_steps=stop_at), ids_dir=ids_dir))
    assert first["global_step"] == stop_at and first["processes"] == 2
    thread.join(timeout=60)
    assert not thread.is_alive(), "the watching evaluator did not exit after the final checkpoint"
    assert watched and watched[-1] == stop_at and watched == sorted(set(watched))

    summary, err = finish(start_torchrun(config_values(uneven_data, train_dir), ids_dir=ids_dir))
    assert "where its readers stood" in err  # each process goes on from its positions (rank 1 with its stand-in)
    assert summary["global_step"] == 2 * steps_per_epoch
    assert summary["examples"] == 2 * TRAIN_VIDEOS  # global: the learning-rate decay counts these
    epochs = trained_ids(ids_dir)
    assert sorted(epochs) == [0, 1]
    for counts in epochs.values():
        assert len(counts) == TRAIN_VIDEOS and set(counts.values()) == {1}
    assert len([name for name in os.listdir(train_dir) if name.startswith("events.out")]) == 2  # rank 0's, per job

    monkeypatch.setenv(TRAINED_IDS_ENV, str(ids_dir))
    resumed = train(train_config(**config_values(uneven_data, train_dir, num_epochs=3)))
    assert resumed["global_step"] == summary["global_step"] + math.ceil(TRAIN_VIDEOS / 16)
    assert resumed["examples"] == 3 * TRAIN_VIDEOS and resumed["processes"] == 1
    third = trained_ids(ids_dir)[2]
    assert len(third) == TRAIN_VIDEOS and set(third.values()) == {1}


def test_resuming_mid_epoch_under_another_world_size_restarts_that_epoch(uneven_data, tmp_path, monkeypatch,
                                                                          caplog):
    values = config_values(uneven_data, tmp_path / "run", num_epochs=1, max_steps=5)
    train(train_config(**values))
    path = final_checkpoint(values["train_dir"])
    checkpoint = load_checkpoint(path)
    assert checkpoint.progress["batches_in_epoch"] == 5
    checkpoint.progress["world_size"] = 2  # as if 2 processes had written it
    save_checkpoint(values["train_dir"], checkpoint, keep=5)
    ids_dir = tmp_path / "ids"
    ids_dir.mkdir()
    monkeypatch.setenv(TRAINED_IDS_ENV, str(ids_dir))
    with caplog.at_level(logging.WARNING, logger="yt8m.train"):
        summary = train(train_config(**{**values, "max_steps": None}))
    assert "that epoch starts over" in caplog.text
    assert summary["global_step"] == 5 + math.ceil(TRAIN_VIDEOS / 16)
    counts = trained_ids(ids_dir)[0]
    assert len(counts) == TRAIN_VIDEOS and set(counts.values()) == {1}


def worker_pids(torchrun_pid: int) -> list[int]:
    children = []
    for task in os.listdir(f"/proc/{torchrun_pid}/task"):
        with open(f"/proc/{torchrun_pid}/task/{task}/children") as fh:
            children += [int(pid) for pid in fh.read().split()]
    return sorted(children)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="finds torchrun's workers through /proc")
def test_elastic_restart_resumes_from_the_last_checkpoint(uneven_data, tmp_path):
    train_dir = tmp_path / "run"
    values = config_values(uneven_data, train_dir, batch_size=8, num_epochs=20, export_model_steps=20,
                           eval_data_pattern=uneven_data["validate"], eval_steps=1)
    process = start_torchrun(values, "--max-restarts", "1")
    first = train_dir / "checkpoints" / "ckpt-00000020.pt"
    deadline = time.monotonic() + 90
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert first.exists()
    os.kill(worker_pids(process.pid)[-1], signal.SIGKILL)
    summary, err = finish(process)

    sizes = uneven_data["shard_sizes"]
    steps_per_epoch = math.ceil((sizes[0] + sizes[2]) / 8)
    assert "resuming from" in err
    assert summary["global_step"] == 20 * steps_per_epoch and summary["examples"] == 20 * TRAIN_VIDEOS
    assert summary["best_step"] is not None
    assert final_checkpoint(str(train_dir)).endswith(f"ckpt-{summary['global_step']:08d}.pt")
    assert [step for step, _ in list_checkpoints(str(train_dir))][-1] == summary["global_step"]
    assert (train_dir / "export" / "final" / "metrics.json").exists()


RANK_1_SEES_FEWER = """\
import os, sys
from yt8m.cli import main
if os.environ["RANK"] == "1":  # as if this process's view of the shared folder missed a file
    at = sys.argv.index("--train_data_pattern") + 1
    sys.argv[at] = sys.argv[at].replace("train-*", "train-0000[01]-*")
sys.exit(main(sys.argv[1:]))
"""


def test_processes_that_list_different_files_stop_in_one_line_before_reading(uneven_data, tmp_path):
    script = tmp_path / "rank_view.py"
    script.write_text(RANK_1_SEES_FEWER)
    train_dir = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
               "train", *as_flags(config_values(uneven_data, train_dir))]
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("yt8m")]
    assert errors == [f"yt8m train: error: the processes listed different training shards ({uneven_data['train']}) "
                      "(process 0: 3 files, process 1: 2 files): every process must read the same files (one shared "
                      "folder or bucket); nothing was read"], done.stderr[-3000:]
    assert not re.search(r'File ".*/yt8m/', done.stderr)  # no traceback of ours (torchrun prints its own)
    assert not train_dir.exists()  # nothing written


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="with 2 GPUs, --num_gpu 2 relaunches for real")
def test_num_gpu_without_gpus_names_the_torchrun_command():
    with pytest.raises(ValueError, match=r"--num_gpu 2: this machine has 0 CUDA GPU\(s\).*\n.*torchrun --standalone "
                                         r"--nproc_per_node=2 -m yt8m train --train_data_pattern x --num_gpu 2"):
        main(["--train_data_pattern", "x", "--num_gpu", "2"])

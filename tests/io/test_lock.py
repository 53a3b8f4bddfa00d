"""The train-dir lock: one holder at a time across processes, the holder named, released when it dies."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from yt8m.io.files import temporary_path
from yt8m.io.lock import LOCK_FILE, TrainDirInUse, TrainDirLock, train_dir_holder

HOLD = """
import os, sys, time
from yt8m.io.lock import TrainDirLock
TrainDirLock(sys.argv[1]).acquire()
worker = os.fork()  # like a DataLoader worker, which outlives a killed trainer for a few seconds
if worker == 0:
    time.sleep(60)
    os._exit(0)
print("held", worker, flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path):
    """A subprocess holding the lock of tmp_path/run, until it is killed."""
    train_dir = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(train_dir)], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        held, worker = process.stdout.readline().split()
        assert held == "held"
        yield process, train_dir
    finally:
        process.kill()
        process.wait()
        if worker is not None:
            os.kill(int(worker), signal.SIGKILL)


def test_a_second_holder_fails_at_once_naming_the_first(holder):
    process, train_dir = holder
    started = time.monotonic()
    with pytest.raises(TrainDirInUse) as caught:
        TrainDirLock(str(train_dir)).acquire()
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert message.startswith(f"train dir {train_dir} is in use by another `yt8m train` "
                              f"(host {socket.gethostname()}, pid {process.pid}, since ")
    assert isinstance(caught.value, OSError)  # the yt8m command prints OSErrors as one line


def test_the_probe_names_the_holder_without_taking_the_lock(holder):
    process, train_dir = holder
    found = train_dir_holder(str(train_dir))
    assert (found["host"], found["pid"]) == (socket.gethostname(), process.pid)
    assert "since" in found
    with pytest.raises(TrainDirInUse):  # the probe changed nothing
        TrainDirLock(str(train_dir)).acquire()


def test_sigkill_of_the_holder_releases_the_lock_while_its_forked_worker_lives_on(holder):
    process, train_dir = holder
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert train_dir_holder(str(train_dir)) is None
    with TrainDirLock(str(train_dir)):
        found = train_dir_holder(str(train_dir))
        assert found["pid"] == os.getpid()  # the new holder's identity replaced the dead one's


def test_release_lets_the_next_one_in_and_no_lock_is_no_holder(tmp_path):
    train_dir = str(tmp_path / "run")
    assert train_dir_holder(train_dir) is None  # no lock file yet
    lock = TrainDirLock(train_dir).acquire()
    with pytest.raises(TrainDirInUse):  # a second open of the lock file, even in this process
        TrainDirLock(train_dir).acquire()
    lock.release()
    assert train_dir_holder(train_dir) is None
    with TrainDirLock(train_dir):
        pass
    with open(os.path.join(train_dir, LOCK_FILE)) as fh:
        assert json.load(fh)["pid"] == os.getpid()


def test_the_holder_removes_what_a_killed_writer_left_half_written(tmp_path):
    train_dir = tmp_path / "run"
    (train_dir / "checkpoints").mkdir(parents=True)
    (train_dir / "export" / "best").mkdir(parents=True)
    kept = train_dir / "checkpoints" / "ckpt-00000004.pt"
    kept.write_bytes(b"a checkpoint")
    leftovers = [temporary_path(str(train_dir / "checkpoints" / "ckpt-00000008.pt")),
                 temporary_path(str(train_dir / "export" / "final")),
                 temporary_path(str(train_dir / "export" / "best" / "00000008"))]
    for path in leftovers:
        open(path, "w").close()
    with TrainDirLock(str(train_dir)):
        assert not any(os.path.exists(path) for path in leftovers)
    assert kept.read_bytes() == b"a checkpoint"

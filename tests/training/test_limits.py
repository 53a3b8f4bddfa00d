"""`yt8m train` estimates what it will hold before holding it: a RAM cache against the memory available (streaming,
or refusing with --cache_in_memory_required), reader slots against /dev/shm, checkpoints against the disk."""

from __future__ import annotations

import errno
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from workflow_fixtures import as_flags, tiny_data, tiny_train_config  # noqa: F401
from yt8m.cli import main as cli_main
from yt8m.config import config_values
from yt8m.data.making.synthetic import write_synthetic
from yt8m.data.reading import memory_budget
from yt8m.data.reading.cache_estimate import estimate_cache, fill_batch_bytes
from yt8m.data.reading.dataset import YT8MDataset
from yt8m.data.reading.memory_budget import GiB, MemoryUse
from yt8m.runtime import share_machine_among
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.data.reading.spec import FeatureSpec
from yt8m.io import storage
from yt8m.io.checkpoints import list_checkpoints
from yt8m.models.model_size import ModelSize
from yt8m.training import TrainConfig, memory_checks
from yt8m.training.memory_checks import SLACK, memory_watch, run_memory


def train_flags(data: dict, train_dir: Path, **overrides) -> list[str]:
    values = config_values(tiny_train_config(data, train_dir, **overrides))
    defaults = config_values(TrainConfig())
    return as_flags({name: value for name, value in values.items()
                     if name not in defaults or value != defaults[name] or name in overrides})


def warnings_with(caplog, text: str) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno >= logging.WARNING and text in record.getMessage()]


def memory_left(monkeypatch, room: int, what: str = memory_budget.MACHINE_MEMORY, used: int = 0) -> None:
    """The memory in use as `used` of a limit (`what`) that leaves `room`."""
    monkeypatch.setattr(memory_budget, "memory_use", lambda: MemoryUse(used, used + room, what))


def little_memory(monkeypatch) -> None:
    """The machine as one whose memory left is the run's slack alone: no cache of the tiny data (about 34 KB) fits."""
    memory_left(monkeypatch, SLACK)


@pytest.mark.parametrize("kind, gzip", [("video", False), ("frame", False), ("video", True)])
def test_the_cache_estimate_is_within_15_percent_of_the_cache_filled(tmp_path, kind, gzip):
    frame = kind == "frame"
    write_synthetic(str(tmp_path), kind=kind, num_classes=20, train_videos=300, validate_videos=0, test_videos=0,
                    shards=3, feature_sizes=(16, 8), min_frames=5, max_frames=40, seed=4, gzip=gzip)
    names = ["rgb", "audio"] if frame else ["mean_rgb", "mean_audio"]
    spec = FeatureSpec(feature_names=names, feature_sizes=[16, 8], frame_features=frame, num_classes=20)
    dataset = YT8MDataset(str(tmp_path / kind / "train-*"), spec, 64, ReadOptions(cache_in_memory=True))
    estimate = estimate_cache(dataset.paths, spec, batch_size=64)
    dataset.load_cache()
    assert dataset.cache is not None
    assert abs(estimate.records - len(dataset.cache)) <= 0.15 * len(dataset.cache)
    cached = dataset.cache.videos.nbytes + fill_batch_bytes(spec, 64, len(dataset.cache))  # and the fill batch
    assert abs(estimate.nbytes - cached) <= 0.15 * cached


def test_an_empty_first_shard_is_passed_over_by_the_estimate(tiny_data, tmp_path):
    empty = tmp_path / "a-empty.tfrecord"
    empty.write_bytes(b"")
    spec = FeatureSpec(feature_names=["mean_rgb", "mean_audio"], feature_sizes=[16, 8], num_classes=20)
    estimate = estimate_cache([str(empty), *tiny_data["train"]], spec)
    assert estimate.records == 240


def test_a_cache_that_does_not_fit_is_streamed_with_one_warning(tiny_data, tmp_path, monkeypatch, caplog):
    little_memory(monkeypatch)
    caplog.set_level(logging.INFO)
    flags = train_flags(tiny_data, tmp_path / "run", cache_in_memory=True,
                        eval_data_pattern=tiny_data["validate_pattern"])
    assert cli_main(["train", *flags]) == 0
    validation, training = warnings_with(caplog, "RAM cache")
    assert "RAM cache of the validation data" in validation and "RAM cache of the training data" in training
    assert "streaming the shards instead" in training and "--cache_in_memory false" in training
    assert list_checkpoints(str(tmp_path / "run"))  # trained to the end, streaming


def test_a_cache_that_fits_is_filled_and_logged(tiny_data, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    assert cli_main(["train", *train_flags(tiny_data, tmp_path / "run", cache_in_memory=True)]) == 0
    assert any("caching the training data in RAM: estimate" in record.getMessage() for record in caplog.records)
    assert not warnings_with(caplog, "RAM cache")


@pytest.mark.parametrize("cache", [True, False])
def test_each_training_shard_is_sized_once_for_the_whole_run(tiny_data, tmp_path, monkeypatch, cache):
    """The shuffle buffers' cap, the cache estimate, the ETA and the sources' weights share one size a shard: on
    object storage each is a request."""
    sized: list[str] = []
    size = storage.size
    monkeypatch.setattr(storage, "size", lambda path: sized.append(path) or size(path))
    assert cli_main(["train", *train_flags(tiny_data, tmp_path / "run", cache_in_memory=cache, num_epochs=2)]) == 0
    train_shards = set(tiny_data["train"])
    counts = Counter(path for path in sized if path in train_shards)
    assert set(counts) == train_shards and set(counts.values()) == {1}, counts


def test_a_required_cache_that_does_not_fit_is_refused_in_one_line(tiny_data, tmp_path, monkeypatch, capsys):
    little_memory(monkeypatch)
    flags = train_flags(tiny_data, tmp_path / "run", cache_in_memory=True, cache_in_memory_required=True)
    assert cli_main(["train", *flags]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("yt8m train: error: --cache_in_memory_required: the RAM cache of the training data "
                            "would take an estimated")
    assert "Traceback" not in capsys.readouterr().err
    assert not list_checkpoints(str(tmp_path / "run"))


def test_a_required_cache_needs_the_cache(tiny_data, tmp_path, capsys):
    assert cli_main(["train", *train_flags(tiny_data, tmp_path / "run", cache_in_memory_required=True)]) == 1
    assert "--cache_in_memory_required stops a run whose RAM cache would not fit: it needs --cache_in_memory" in \
        capsys.readouterr().err


def test_concurrent_jobs_share_the_memory(monkeypatch):
    reserve = GiB // 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two torchrun processes on this machine: each has half
    assert memory_budget.memory_budget(reserve, lambda: 8 * GiB) == 4 * GiB - reserve
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    try:
        share_machine_among(4)
        assert memory_budget.memory_budget(reserve, lambda: 8 * GiB) == 2 * GiB - reserve
    finally:
        share_machine_among(1)
    assert memory_budget.memory_budget(reserve, lambda: 8 * GiB) == 8 * GiB - reserve
    assert memory_budget.memory_budget(reserve, lambda: reserve // 2) == 0


def test_the_memory_in_use_is_the_cgroups_memory_less_its_file_cache(tmp_path):
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job" / "memory.max").write_text("3000000000\n")
    (v2 / "job" / "memory.current").write_text("1000000000\n")
    assert memory_budget.cgroup_v2_use(str(v2), "/job") == MemoryUse(1_000_000_000, 3_000_000_000,
                                                                       "the cgroup's memory.max")
    # the page cache of files read (active or not) is reclaimed before the kernel kills: not counted as used
    (v2 / "job" / "memory.stat").write_text("anon 500000000\ninactive_file 400000000\nactive_file 100000000\n"
                                            "shmem 7\n")
    assert memory_budget.cgroup_v2_use(str(v2), "/job").room == 2_500_000_000
    (v2 / "job" / "memory.max").write_text("max\n")  # no limit
    assert memory_budget.cgroup_v2_use(str(v2), "/job") is None
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (v1 / "memory.usage_in_bytes").write_text("50\n")
    assert memory_budget.cgroup_v1_use(str(v1), "/") is None
    (v1 / "memory.limit_in_bytes").write_text("105\n")
    (v1 / "memory.stat").write_text("cache 30\ntotal_inactive_file 20\ntotal_active_file 5\ntotal_shmem 5\n")
    assert memory_budget.cgroup_v1_use(str(v1), "/elsewhere").room == 80  # a container's own cgroup is its root


def test_the_machines_memory_in_use_is_memtotal_less_memavailable(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n")
    assert memory_budget.meminfo_use(str(meminfo)) == MemoryUse(600 * 1024, 1000 * 1024, "the machine's memory")


def test_a_runs_own_memory_counts_its_optimizer_batches_slots_and_shuffle_buffers(tiny_data):
    spec = FeatureSpec(feature_names=["mean_rgb", "mean_audio"], feature_sizes=[16, 8], num_classes=20)
    pattern = tiny_data["train_pattern"]
    dataset = YT8MDataset(pattern, spec, 32, ReadOptions(shuffle=True, shuffle_buffer=3))
    memory = run_memory(ModelSize(parameters=1000, buffer_values=7), [dataset], readers=2)
    assert memory.optimizer == 1000 * 3 * 4  # the gradient and Adam's two moments, float32
    assert memory.batches == 4 * 32 * (24 * 4 + 20 * 4)  # four batches of float32 features and dense labels
    assert memory.reader_slots == 2 * 3 * 32 * 24 * 4  # 2 workers x 3 shared-memory slots of a float32 batch
    assert 2 * 3 * 60 < memory.shuffle_buffers < 2 * 3 * 200  # 2 readers x 3 records of ~100 bytes
    assert memory.reserve(streaming=False) == memory.optimizer + memory.batches + memory.reader_slots + SLACK
    assert memory.reserve(streaming=True) == memory.reserve(streaming=False) + memory.shuffle_buffers
    whole = YT8MDataset(pattern, spec, 32, ReadOptions(shuffle=True))  # 10,000 records: more than the shards hold
    shards = sum(os.path.getsize(path) for path in whole.paths)
    assert run_memory(ModelSize(1000, 7), [whole], readers=2).shuffle_buffers == shards


def test_a_run_the_machines_memory_cannot_hold_is_warned_of_at_start(tiny_data, tmp_path, monkeypatch, caplog):
    memory_left(monkeypatch, 64 * 1024 * 1024)
    caplog.set_level(logging.INFO)
    assert cli_main(["train", *train_flags(tiny_data, tmp_path / "run")]) == 0  # other processes may free it
    [warning] = warnings_with(caplog, "the kernel is likely to kill it")
    assert "more memory than it holds now, but 64.0 MiB is left of the machine's memory" in warning
    assert "gradients and optimizer state" in warning and "shuffle buffers" in warning  # it streams
    assert "lower --batch_size, --shuffle_buffer or --num_readers" in warning


def test_a_run_its_cgroup_cannot_hold_is_refused_in_one_line(tiny_data, tmp_path, monkeypatch, capsys, caplog):
    memory_left(monkeypatch, 64 * 1024 * 1024, "the cgroup's memory.max", used=2 * GiB)
    monkeypatch.setattr(memory_checks, "WATCH_SECONDS", 0.001)
    flags = train_flags(tiny_data, tmp_path / "run")
    assert cli_main(["train", *flags]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("yt8m train: error: the run will take about ") and "but 64.0 MiB is left of the cgroup's " \
        "memory.max (2.1 GiB, 2.0 GiB in use)" in line
    assert line.endswith("the kernel would kill it part-way; lower --batch_size, --shuffle_buffer or --num_readers, "
                         "or give it more memory (or --memory_check warn to try anyway)")
    assert not (tmp_path / "run").exists()  # refused before anything was trained: nothing left behind
    caplog.set_level(logging.INFO)
    assert cli_main(["train", *flags, "--memory_check", "warn"]) == 1  # tries: its memory watch then stops it
    assert warnings_with(caplog, "the kernel is likely to kill it")
    assert "error: stopped: memory in use reached 2.0 GiB, 97% of the cgroup's memory.max" in capsys.readouterr().err


def test_a_run_within_the_memory_left_is_not_warned_of(tiny_data, tmp_path, monkeypatch, caplog):
    memory_left(monkeypatch, 4 * GiB, "the cgroup's memory.max")
    caplog.set_level(logging.INFO)
    assert cli_main(["train", *train_flags(tiny_data, tmp_path / "run")]) == 0
    assert not warnings_with(caplog, "memory")


@pytest.mark.parametrize("used, warned", [(95, True), (89, False)])
def test_the_memory_watch_warns_once_near_the_limit(monkeypatch, caplog, used, warned):
    monkeypatch.setattr(memory_budget, "memory_use", lambda: MemoryUse(used * GiB, 100 * GiB, "the cgroup's memory.max"))
    caplog.set_level(logging.INFO)
    with memory_watch(seconds=0.01):
        time.sleep(0.3)  # about 30 looks
    found = warnings_with(caplog, "memory in use is")
    assert len(found) == (1 if warned else 0)
    if warned:
        assert found[0].startswith("memory in use is 95.0 GiB, 95% of the cgroup's memory.max (100.0 GiB): the "
                                   "kernel kills the run when it is reached")


def test_the_machines_memory_near_full_is_warned_of_and_the_run_goes_on(tiny_data, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(memory_checks, "WATCH_SECONDS", 0.001)
    monkeypatch.setattr(memory_budget, "memory_use", lambda: MemoryUse(99, 100, memory_budget.MACHINE_MEMORY))
    caplog.set_level(logging.INFO)
    assert cli_main(["train", *train_flags(tiny_data, tmp_path / "run")]) == 0  # other processes may hold it
    [warning] = warnings_with(caplog, "memory in use is")
    assert "99% of the machine's memory" in warning


def test_a_run_at_its_cgroups_limit_stops_in_one_line_with_a_checkpoint_and_resumes(tiny_data, tmp_path,
                                                                                   monkeypatch, capsys, caplog):
    flags = train_flags(tiny_data, tmp_path / "run", num_epochs=3)
    with monkeypatch.context() as near_the_limit:
        near_the_limit.setattr(memory_checks, "WATCH_SECONDS", 0.001)
        near_the_limit.setattr(memory_budget, "memory_use", lambda: MemoryUse(96 * GiB, 100 * GiB,
                                                                             "the cgroup's memory.max"))
        assert cli_main(["train", *flags]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("yt8m train: error: stopped: memory in use reached 96.0 GiB, 96% of the cgroup's "
                           "memory.max (100.0 GiB), where the kernel kills the run; lower --batch_size"), line
    assert "run the same command to resume" in line
    [(step, saved)] = list_checkpoints(str(tmp_path / "run"))
    assert f"saved {saved} (step {step})" in line
    caplog.set_level(logging.INFO)
    assert cli_main(["train", *flags]) == 0  # the same command, with the memory back
    assert f"resuming from {saved}" in caplog.text


@pytest.fixture(scope="module")
def frame_data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("frames")
    write_synthetic(str(root), kind="frame", num_classes=20, train_videos=96, validate_videos=0, test_videos=0,
                    shards=2, feature_sizes=(16, 8), min_frames=5, max_frames=20, seed=1)
    return {"train_pattern": str(root / "frame" / "train-*.tfrecord")}


def frame_flags(frame_data: dict, train_dir: Path, readers: int) -> list[str]:
    return ["--train_data_pattern", frame_data["train_pattern"], "--train_dir", str(train_dir), "--frame_features",
            "--feature_names", "rgb,audio", "--feature_sizes", "16,8", "--num_classes", "20", "--model", "DbofModel",
            "--max_frames", "20", "--batch_size", "16", "--num_epochs", "1", "--num_readers", str(readers),
            "--seed", "3"]


def test_frame_level_training_on_the_cpu_maps_its_batch_sized_blocks_where_they_would_grow_the_heap(
        frame_data, tiny_data, tmp_path, monkeypatch, caplog):
    calls = []
    monkeypatch.setattr("yt8m.training.data.map_frame_batch_blocks", lambda: calls.append("mapped"))
    caplog.set_level(logging.INFO)
    assert cli_main(["train", *frame_flags(frame_data, tmp_path / "small", readers=0)]) == 0
    assert calls == []  # 16 videos of 20 frames: copies of 30 KB grow no heap worth mapping them for
    monkeypatch.setattr("yt8m.training.data.HEAP_GROWTH_SHARE", 1e-9)  # as if they were a good part of the memory
    assert cli_main(["train", *frame_flags(frame_data, tmp_path / "large", readers=0)]) == 0
    assert calls == ["mapped"]
    assert "frame-level batches of 30 KiB each in float32 on the CPU: blocks over 32 MB are mapped" in caplog.text
    assert cli_main(["train", *train_flags(tiny_data, tmp_path / "videos")]) == 0
    assert calls == ["mapped"]  # video-level training keeps every block in the heap for reuse


def test_a_real_frame_batch_on_the_cpu_is_large_enough_to_map_and_a_small_one_or_a_gpus_is_not(monkeypatch):
    from types import SimpleNamespace

    from yt8m.training.data import heap_growing_frame_copies

    monkeypatch.setattr("yt8m.training.data.available_memory", lambda: 24 * GiB)
    spec = FeatureSpec(feature_names=["rgb", "audio"], feature_sizes=[1024, 128], frame_features=True)
    batch = lambda size: [SimpleNamespace(batch_size=size, spec=spec)]  # noqa: E731
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert heap_growing_frame_copies(batch(1024), cpu) == 1024 * 300 * 1152 * 4  # 1.4 GB a copy
    assert heap_growing_frame_copies(batch(64), cpu) == 0  # DbofModel's bench batch: 88 MB, kept for speed
    assert heap_growing_frame_copies(batch(1024), gpu) == 0
    video = FeatureSpec(feature_names=["mean_rgb", "mean_audio"], feature_sizes=[1024, 128])
    assert heap_growing_frame_copies([SimpleNamespace(batch_size=1024, spec=video)], cpu) == 0


@pytest.mark.parametrize("readers, free, reading", [(1, 10_000, "reading in-process instead"),
                                                    (2, 30_000, "reading with 1 worker process instead")])
def test_reader_slots_that_do_not_fit_dev_shm_fall_back_to_fewer_readers(frame_data, tmp_path, monkeypatch, caplog,
                                                                         readers, free, reading):
    # 16 videos x 20 frames x 24 bytes = 7.5 KB a slot, 3 slots a worker (23 KB), of which 90% of /dev/shm may hold
    monkeypatch.setattr(memory_budget, "shm_free_bytes", lambda: free)
    monkeypatch.setattr("yt8m.runtime.available_cpus", lambda: 2)  # 2 readers are not clamped to fewer CPUs
    caplog.set_level(logging.INFO)
    assert cli_main(["train", *frame_flags(frame_data, tmp_path / "run", readers=readers)]) == 0
    [warning] = warnings_with(caplog, "/dev/shm")
    assert reading in warning and "--shm-size=" in warning
    assert list_checkpoints(str(tmp_path / "run"))


def test_a_short_disk_is_warned_of_in_one_line(tiny_data, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(memory_budget, "disk_free_bytes", lambda path: 1000)
    caplog.set_level(logging.INFO)
    assert cli_main(["train", *train_flags(tiny_data, tmp_path / "run", keep_checkpoints=2)]) == 0
    [warning] = warnings_with(caplog, "checkpoints of about")
    assert "has 1 KiB free" in warning and "--keep_checkpoints 2" in warning


def test_a_full_disk_at_a_checkpoint_is_one_error_naming_the_file(tiny_data, tmp_path, monkeypatch, capsys):
    write = os.write

    def no_space_for_checkpoints(fd: int, data) -> int:  # the disk fills up as the first checkpoint is written
        if "ckpt-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fd, data)

    monkeypatch.setattr(os, "write", no_space_for_checkpoints)
    assert cli_main(["train", *train_flags(tiny_data, tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("yt8m train: error:") and "ckpt-" in last and "No space left on device" in last


def unshare_problem() -> str:
    """Why a private 8 MB /dev/shm cannot be mounted here ('' where it can)."""
    if not shutil.which("unshare"):
        return "no unshare command"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=8m tmpfs /dev/shm"],
                           capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"unshare -m with a tmpfs mount is not permitted: {probe.stderr.strip()}"


@pytest.mark.integration
def test_a_frame_level_run_under_an_8_mb_dev_shm_reads_in_process_and_completes(tmp_path):
    problem = unshare_problem()
    if problem:
        pytest.skip(problem)
    write_synthetic(str(tmp_path), kind="frame", num_classes=20, train_videos=128, validate_videos=0,
                    test_videos=0, shards=2, min_frames=5, max_frames=20, seed=2)
    # 64 videos x 300 frames x 1152 bytes: 22 MB a batch slot, where /dev/shm holds 8 MB
    train = [sys.executable, "-m", "yt8m", "train", "--train_data_pattern", str(tmp_path / "frame" / "train-*"),
             "--train_dir", str(tmp_path / "run"), "--frame_features", "--feature_names", "rgb,audio",
             "--feature_sizes", "1024,128", "--num_classes", "20", "--model", "FrameLevelLogisticModel",
             "--batch_size", "64", "--num_epochs", "1", "--num_readers", "1"]
    script = "mount -t tmpfs -o size=8m tmpfs /dev/shm && exec " + " ".join(map(shlex.quote, train))
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    [warning] = [line for line in result.stderr.splitlines() if "/dev/shm has" in line]
    assert "8.0 MiB free" in warning and "reading in-process instead" in warning and "--shm-size=" in warning
    assert list_checkpoints(str(tmp_path / "run"))


def memory_cgroup_to_make() -> tuple[Path | None, str]:
    """Where a child memory cgroup can be made (this process's own, cgroup v1 or v2), or why not."""
    if os.geteuid() != 0:
        return None, "making a memory cgroup needs root"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers in ("memory", ""):
            root = Path("/sys/fs/cgroup/memory" if controllers == "memory" else "/sys/fs/cgroup")
            for parent in (root / path.lstrip("/"), root):
                if parent.is_dir() and os.access(parent, os.W_OK):
                    return parent, ""
    return None, "no writable memory cgroup (v1 or v2)"


@pytest.mark.integration
def test_the_ram_cache_recipe_in_a_real_420_mb_cgroup_is_refused_in_one_line(realdata_dir, tmp_path):
    parent, problem = memory_cgroup_to_make()
    if parent is None:
        pytest.skip(problem)
    group = parent / f"yt8m_test_{os.getpid()}"
    group.mkdir()
    try:
        v1 = (group / "memory.limit_in_bytes").exists()
        (group / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(420 * 10 ** 6))
        train = [sys.executable, "-m", "yt8m", "train", "--train_data_pattern",
                 str(realdata_dir / "yt8m_2018_video_validate" / "validate*.tfrecord"), "--train_dir",
                 str(tmp_path / "run"), "--model", "LogisticModel", "--cache_in_memory", "--num_readers", "0",
                 "--batch_size", "256", "--max_steps", "40"]
        script = f'echo $$ > {shlex.quote(str(group / "cgroup.procs"))} && exec "$@"'
        result = subprocess.run(["sh", "-c", script, "sh", *train], capture_output=True, text=True, timeout=300)
    finally:
        group.rmdir()
    # Before the reckoning, the same run was killed by the kernel (rc -9) with nothing in its log.
    assert result.returncode == 1, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("yt8m train: error: the run will take about ") and "of the cgroup's memory" in line, line
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()

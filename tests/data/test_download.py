"""`yt8m download` against a loopback mirror with injected faults: dropped connections, wrong bytes, 404, a slow
server, 5xx; resuming after a kill, --shard's deterministic split, --dry_run, a full disk."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from faults import files_under, fill_disk_after
from loopback_mirror import LOCAL_PLAN, PARTITION, PLAN_PATH, Mirror, mirror, synthetic_files  # noqa: F401  (a fixture)
from yt8m import cli
from yt8m.data.making import download
from yt8m.data.making.download import DONE_LOG_SUFFIX, Source, in_shard, local_name, parse_shard

FAST = ["--backoff_secs", "0.01", "--timeout_secs", "2"]


def run(mirror: Mirror, output_dir: Path, *flags: str, capsys) -> tuple[int, dict, str]:
    """`yt8m download` in this process: (exit status, the JSON line printed, stderr)."""
    status = cli.main(["download", "--partition", PARTITION, "--base_url", mirror.url, "--output_dir",
                       str(output_dir), *FAST, *flags])
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    return status, json.loads(lines[-1]) if lines else {}, err


def local_plan(output_dir: Path) -> dict:
    return json.loads((output_dir / LOCAL_PLAN).read_text())


def left_in_plan(output_dir: Path) -> list[str]:
    """What a re-run would download: the plan's copy less the files its log lists (a run killed mid-way)."""
    log = output_dir / f"{LOCAL_PLAN}{DONE_LOG_SUFFIX}"
    done = {json.loads(line) for line in log.read_text().splitlines()} if log.exists() else set()
    return sorted(set(local_plan(output_dir)["files"]) - done)


def assert_downloaded(output_dir: Path, files: dict[str, bytes], names) -> None:
    for name in names:
        assert (output_dir / local_name(name)).read_bytes() == files[name]


def test_downloads_every_file_verified_under_the_official_names(mirror, tmp_path, capsys):
    status, summary, _ = run(mirror, tmp_path, capsys=capsys)
    assert status == 0
    assert summary["files"] == 6 and summary["failures"] == 0 and summary["remaining"] == 0
    assert summary["bytes"] == sum(len(data) for data in mirror.files.values())
    assert sorted(mirror.gets()) == sorted(mirror.files)
    assert_downloaded(tmp_path, mirror.files, mirror.files)
    assert files_under(tmp_path) == sorted([LOCAL_PLAN, "train0000.tfrecord", "train0001.tfrecord",
                                            "train0051.tfrecord", "train0114.tfrecord", "train0185.tfrecord",
                                            "train3843.tfrecord"])
    assert local_plan(tmp_path)["files"] == {}  # nothing left


def test_a_file_being_synced_leaves_its_connection_to_the_next_file(mirror, tmp_path, capsys, monkeypatch):
    """--parallel 1: while the first file is synced to the disk, the next one downloads (the one connection is free),
    and never are two files sent at once."""
    synced_during_next_get = threading.Event()
    real_fsync = os.fsync

    def slow_first_file_sync(fd: int) -> None:
        if "train" in os.readlink(f"/proc/self/fd/{fd}") and not synced_during_next_get.is_set():
            gets = len(mirror.gets())
            deadline = time.time() + 5
            while len(mirror.gets()) == gets and time.time() < deadline:
                time.sleep(0.01)
            if len(mirror.gets()) > gets:
                synced_during_next_get.set()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_first_file_sync)
    receiving, most_receiving, count = [0], [0], threading.Lock()
    held_enter, held_release = download._Held.__enter__, download._Held.release

    def enter(self):  # a connection taken: a file's bytes are being received
        held = held_enter(self)
        with count:
            receiving[0] += 1
            most_receiving[0] = max(most_receiving[0], receiving[0])
        return held

    def release(self):
        with count:
            if self._held:
                receiving[0] -= 1
        held_release(self)

    monkeypatch.setattr(download._Held, "__enter__", enter)
    monkeypatch.setattr(download._Held, "release", release)
    status, summary, _ = run(mirror, tmp_path, "--parallel", "1", capsys=capsys)
    assert status == 0 and summary["files"] == 6
    assert synced_during_next_get.is_set()
    # Counted where the client takes and gives back its connection: the server's own count of responses in flight
    # can lag a response the client already has whole (its thread not yet run again), so it may show 2 under load.
    assert most_receiving[0] == 1
    assert_downloaded(tmp_path, mirror.files, mirror.files)


def test_official_names_and_urls():
    assert local_name("validateaa.tfrecord") == "validate0000.tfrecord"
    assert local_name("validateaB.tfrecord") == "validate0027.tfrecord"  # a-z, then A-Z, then 0-9
    assert local_name("test99.tfrecord") == "test3843.tfrecord"
    assert local_name("README") == "README"  # not of the official form: kept
    official = Source("2/frame/validate", "eu")
    assert official.plan_url == "http://data.yt8m.org/2/download_plans/frame_validate.json"
    assert official.file_url("validateaa.tfrecord") == "http://eu.data.yt8m.org/2/frame/validate/validateaa.tfrecord"
    assert official.plan_filename == "2_frame_validate_download_plan.json"
    private = Source("3/frame/test", base_url="https://mirror.example.org/yt8m/")
    assert private.plan_url == "https://mirror.example.org/yt8m/3/download_plans/frame_test.json"
    assert private.file_url("testaa.tfrecord") == "https://mirror.example.org/yt8m/3/frame/test/testaa.tfrecord"


def test_shards_split_the_plan_deterministically_into_disjoint_parts():
    names = [f"train{a}{b}.tfrecord" for a in "abcXYZ019" for b in "aZ5"]
    for num_shards in (1, 2, 3, 7, 100):
        parts = [[name for name in names if in_shard(name, (i, num_shards))] for i in range(1, num_shards + 1)]
        assert sorted(name for part in parts for name in part) == sorted(names)  # each name in exactly one part
        assert parts == [[name for name in names if in_shard(name, (i, num_shards))]
                         for i in range(1, num_shards + 1)]
    # The official rule: the MD5 of the name, as a number, modulo N is I - 1.
    assert [i for i in range(1, 101) if in_shard("trainaa.tfrecord", (i, 100))] == [
        int(hashlib.md5(b"trainaa.tfrecord").hexdigest(), 16) % 100 + 1]


def test_all_shards_together_download_the_whole_plan_exactly_once(mirror, tmp_path, capsys):
    counts = []
    for i in (1, 2, 3):
        status, summary, _ = run(mirror, tmp_path, "--shard", f"{i},3", capsys=capsys)
        assert status == 0
        counts.append(summary["files"])
    assert sorted(mirror.gets()) == sorted(mirror.files)
    assert counts == [sum(in_shard(name, (i, 3)) for name in mirror.files) for i in (1, 2, 3)]
    assert_downloaded(tmp_path, mirror.files, mirror.files)
    assert local_plan(tmp_path)["files"] == {}


CAUSES = {"drop": "the connection closed after", "wrong": "MD5 mismatch", "500": "HTTP 503", "slow": "timed out"}


@pytest.mark.parametrize("fault", sorted(CAUSES))
def test_a_transient_fault_is_retried(mirror, tmp_path, capsys, caplog, fault):
    mirror.faults["trainab.tfrecord"] = [fault]
    # A timeout well under the "slow" answer's wait, yet long enough that a loaded machine's other answers arrive.
    status, summary, _ = run(mirror, tmp_path, "--timeout_secs", "1.5", capsys=capsys)
    assert status == 0 and summary["files"] == 6 and summary["failures"] == 0
    assert mirror.gets().count("trainab.tfrecord") == 2
    retried = [record.getMessage() for record in caplog.records if "retry 1 of 5" in record.getMessage()]
    assert len(retried) == 1 and retried[0].startswith("trainab.tfrecord: ")
    assert CAUSES[fault] in retried[0]
    assert_downloaded(tmp_path, mirror.files, mirror.files)
    assert local_plan(tmp_path)["files"] == {}


def test_wrong_bytes_on_every_attempt_fail_naming_the_file_and_keep_the_others(mirror, tmp_path, capsys):
    mirror.faults["trainab.tfrecord"] = ["wrong"] * 3
    status, summary, err = run(mirror, tmp_path, "--retries", "2", capsys=capsys)
    assert status == 1
    assert summary["files"] == 5 and summary["failures"] == 1 and summary["remaining"] == 1
    assert err.strip().splitlines()[-1].startswith(
        f"yt8m download: error: could not download trainab.tfrecord from {mirror.url}/{PARTITION}/trainab.tfrecord: "
        "MD5 mismatch")
    assert err.strip().endswith("(after 3 attempts)")
    assert not (tmp_path / "train0001.tfrecord").exists()
    assert files_under(tmp_path) == sorted({LOCAL_PLAN} | {local_name(n) for n in mirror.files} - {"train0001.tfrecord"})
    assert list(local_plan(tmp_path)["files"]) == ["trainab.tfrecord"]  # the others' progress is kept


def test_a_404_fails_at_once_naming_the_file(mirror, tmp_path, capsys):
    mirror.faults["trainb0.tfrecord"] = ["404"]
    status, summary, err = run(mirror, tmp_path, capsys=capsys)
    assert status == 1 and summary["failures"] == 1 and summary["files"] == 5
    assert err.strip().splitlines()[-1] == (f"yt8m download: error: could not download trainb0.tfrecord from "
                                            f"{mirror.url}/{PARTITION}/trainb0.tfrecord: HTTP 404 Not Found")
    assert mirror.gets().count("trainb0.tfrecord") == 1  # not retried
    assert list(local_plan(tmp_path)["files"]) == ["trainb0.tfrecord"]
    # The next run fetches only that file.
    status, summary, _ = run(mirror, tmp_path, capsys=capsys)
    assert status == 0 and summary["files"] == 1 and summary["already_present"] == 0
    assert mirror.gets().count("trainb0.tfrecord") == 2 and len(mirror.gets()) == 7


def test_several_failures_are_named_in_one_error(mirror, tmp_path, capsys):
    mirror.faults = {"trainaa.tfrecord": ["404"], "train99.tfrecord": ["404"]}
    status, summary, err = run(mirror, tmp_path, capsys=capsys)
    assert status == 1 and summary["failures"] == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("yt8m download: error: 2 files failed (left in the local plan for a re-run): ")
    assert "trainaa.tfrecord" in last and "train99.tfrecord" in last


def test_a_rerun_after_a_kill_fetches_only_the_rest(mirror, tmp_path):
    mirror.faults["trainb0.tfrecord"] = ["stall"]  # the 5th file of 6, in name order
    command = [sys.executable, "-m", "yt8m", "download", "--partition", PARTITION, "--base_url", mirror.url,
               "--output_dir", str(tmp_path), "--parallel", "1", *FAST]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert mirror.stalled.wait(30)
    deadline = time.monotonic() + 10
    while not any(name.startswith(".train0114.tfrecord.tmp-") for name in os.listdir(tmp_path)):
        assert time.monotonic() < deadline  # the half-written file is there, under its temporary name
        time.sleep(0.01)
    while len(left_in_plan(tmp_path)) > 2:  # the file before it, synced off the connection, is done
        assert time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "train0114.tfrecord").exists()
    assert left_in_plan(tmp_path) == ["trainb0.tfrecord", "trainc9.tfrecord"]
    fetched_before = mirror.gets()
    assert fetched_before == ["train99.tfrecord", "trainaZ.tfrecord", "trainaa.tfrecord", "trainab.tfrecord",
                              "trainb0.tfrecord"]

    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["files"] == 2 and summary["remaining"] == 0
    assert "B/s" not in result.stderr  # no progress bar where stderr is not a terminal
    assert mirror.gets()[len(fetched_before):] == ["trainb0.tfrecord", "trainc9.tfrecord"]
    assert_downloaded(tmp_path, mirror.files, mirror.files)
    assert ".train0114.tfrecord.tmp-" not in " ".join(files_under(tmp_path))  # the killed run's part was removed


def test_files_already_here_and_verified_are_not_fetched_again(mirror, tmp_path, capsys):
    assert run(mirror, tmp_path, capsys=capsys)[0] == 0
    (tmp_path / LOCAL_PLAN).unlink()  # a fresh plan: every file is checked against it
    (tmp_path / "train0000.tfrecord").write_bytes(b"not the file")  # one of them damaged
    status, summary, _ = run(mirror, tmp_path, capsys=capsys)
    assert status == 0 and summary["already_present"] == 5 and summary["files"] == 1
    assert mirror.gets().count("trainaa.tfrecord") == 2 and len(mirror.gets()) == 7
    assert_downloaded(tmp_path, mirror.files, mirror.files)


def test_dry_run_lists_the_files_and_their_size_and_fetches_none(mirror, tmp_path, capsys):
    status, listing, _ = run(mirror, tmp_path / "out", "--dry_run", "--shard", "1,2", capsys=capsys)
    names = sorted(name for name in mirror.files if in_shard(name, (1, 2)))
    assert status == 0 and listing["dry_run"] is True and listing["files"] == len(names)
    assert listing["bytes"] == sum(len(mirror.files[name]) for name in names) and listing["unknown_sizes"] == 0
    assert [entry["file"] for entry in listing["file_list"]] == [local_name(name) for name in names]
    assert mirror.gets() == []
    assert sorted(method for method, _ in mirror.requests) == ["GET"] + ["HEAD"] * len(names)  # the plan, sizes
    assert not (tmp_path / "out").exists()  # nothing written


def test_dry_run_takes_the_sizes_from_the_plan_where_it_has_them(tmp_path, capsys):
    mirror = Mirror(synthetic_files(3), with_sizes=True)
    try:
        status, listing, _ = run(mirror, tmp_path, "--dry_run", capsys=capsys)
    finally:
        mirror.close()
    assert status == 0 and listing["bytes"] == sum(len(data) for data in mirror.files.values())
    assert mirror.requests == [("GET", PLAN_PATH)]


def test_a_full_disk_names_the_file_and_leaves_no_partial_file(mirror, tmp_path, capsys, monkeypatch):
    fill_disk_after(monkeypatch, tmp_path, budget=len(mirror.plan) + 150_000)
    status, summary, err = run(mirror, tmp_path, "--parallel", "1", capsys=capsys)
    assert status == 1 and summary["failures"] == 1
    assert re.fullmatch(r"yt8m download: error: could not write \S+/train\d{4}\.tfrecord: No space left on device",
                        err.strip().splitlines()[-1])
    assert not any(name.startswith(".") for name in files_under(tmp_path))  # no temporary file left
    assert len(mirror.gets()) < 6  # no file started after the disk was full
    done = set(mirror.files) - set(local_plan(tmp_path)["files"])
    assert files_under(tmp_path) == sorted({LOCAL_PLAN} | {local_name(name) for name in done})
    assert_downloaded(tmp_path, mirror.files, done)


@pytest.mark.parametrize("flags, message", [
    (["--partition", "2/video/training"], "--partition '2/video/training': expected VERSION/KIND/SPLIT"),
    (["--partition", PARTITION, "--shard", "4,3"], "--shard '4,3': expected I,N with 1 <= I <= N"),
    (["--partition", PARTITION, "--shard", "1"], "--shard '1': expected I,N"),
    (["--partition", PARTITION, "--parallel", "0"], "--parallel must be at least 1, got 0"),
])
def test_bad_flags_are_one_line_errors(flags, message, tmp_path, capsys):
    assert cli.main(["download", *flags, "--output_dir", str(tmp_path)]) == 1
    assert message in capsys.readouterr().err


def test_a_plan_that_is_not_one_is_a_clear_error(mirror, tmp_path, capsys):
    mirror.plan = b"<html>not found</html>"
    status, _, err = run(mirror, tmp_path, capsys=capsys)
    assert status == 1 and f"{mirror.url}{PLAN_PATH} is not a download plan" in err
    mirror.plan = json.dumps({"files": {"../escape.tfrecord": "0" * 32}}).encode()
    status, _, err = run(mirror, tmp_path, capsys=capsys)
    assert status == 1 and "'../escape.tfrecord' is not a plain file name" in err
    assert files_under(tmp_path) == []


def test_parse_shard():
    assert parse_shard("1,100") == (1, 100) and parse_shard("3,3") == (3, 3)
    with pytest.raises(ValueError):
        parse_shard("0,3")


def test_two_shards_downloading_into_one_folder_keep_each_others_progress(mirror, tmp_path):
    """Both rewrite the one local plan from its log, under a lock: neither puts back the files the other did."""
    (tmp_path / LOCAL_PLAN).write_bytes(mirror.plan)  # as the first to start would have fetched it
    shards = [subprocess.Popen([sys.executable, "-m", "yt8m", "download", "--partition", PARTITION, "--base_url",
                                mirror.url, "--output_dir", str(tmp_path), "--shard", f"{i},2", "--parallel", "1",
                                *FAST], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (1, 2)]
    for process in shards:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
    assert local_plan(tmp_path)["files"] == {} and not (tmp_path / f"{LOCAL_PLAN}{DONE_LOG_SUFFIX}").exists()
    assert_downloaded(tmp_path, mirror.files, mirror.files)


def test_the_plan_log_of_a_killed_run_is_read_line_by_line_and_a_cut_line_passed_over(mirror, tmp_path, capsys):
    (tmp_path / LOCAL_PLAN).write_bytes(mirror.plan)
    (tmp_path / "train0000.tfrecord").write_bytes(mirror.files["trainaa.tfrecord"])
    (tmp_path / f"{LOCAL_PLAN}{DONE_LOG_SUFFIX}").write_text('"trainaa.tfrecord"\n"trainab.tf')  # killed mid-line
    status, summary, _ = run(mirror, tmp_path, capsys=capsys)
    assert status == 0 and summary["files"] == 5 and summary["already_present"] == 0
    assert "trainaa.tfrecord" not in mirror.gets()
    assert local_plan(tmp_path)["files"] == {} and not (tmp_path / f"{LOCAL_PLAN}{DONE_LOG_SUFFIX}").exists()

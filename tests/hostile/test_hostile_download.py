"""`yt8m download` against a hostile mirror: a server that trickles, one that sends far more than the file, a
redirect loop, a plan nested 200,000 deep, a 249-character file name, and the cost of a plan of many files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_outcome import yt8m, yt8m_here  # noqa: F401  (fixtures)

from faults import files_under
from loopback_mirror import (  # noqa: F401  (a fixture)
    LOCAL_PLAN,
    OVERSIZE_BYTES,
    PARTITION,
    PLAN_PATH,
    Mirror,
    mirror,
    synthetic_files,
)

pytestmark = pytest.mark.hostile

FAST = ["--backoff_secs", "0.01", "--retries", "1"]


def download(yt8m, mirror: Mirror, output_dir: Path, *flags: str, timeout: float = 20):
    return yt8m("download", "--partition", PARTITION, "--base_url", mirror.url, "--output_dir", str(output_dir),
                *FAST, *flags, timeout=timeout)


def test_a_file_trickled_a_byte_at_a_time_is_cut_off(yt8m, mirror, tmp_path):
    mirror.faults["trainab.tfrecord"] = ["trickle", "trickle"]
    outcome = download(yt8m, mirror, tmp_path, "--timeout_secs", "1")
    outcome.assert_clean_error("could not download trainab.tfrecord from ", "bytes/s", "(after 2 attempts)")
    assert json.loads(outcome.out)["files"] == 5
    assert not any(name.startswith(".") for name in files_under(tmp_path))  # no temporary file left


def test_a_plan_trickled_a_byte_at_a_time_is_cut_off(yt8m, mirror, tmp_path):
    mirror.faults[PLAN_PATH] = ["trickle", "trickle"]
    outcome = download(yt8m, mirror, tmp_path, "--timeout_secs", "1")
    outcome.assert_clean_error(f"could not download the download plan from {mirror.url}{PLAN_PATH}", "bytes/s")
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("fault", ["oversize", "unannounced"])
def test_a_file_larger_than_the_plan_says_is_cut_at_its_size(yt8m, tmp_path, fault):
    mirror = Mirror(synthetic_files(2), with_sizes=True)
    try:
        mirror.faults["trainab.tfrecord"] = [fault, fault]
        outcome = download(yt8m, mirror, tmp_path)
    finally:
        mirror.close()
    size = len(mirror.files["trainab.tfrecord"])
    announced = [f"announces {size + OVERSIZE_BYTES} bytes"] if fault == "oversize" else []
    outcome.assert_clean_error("could not download trainab.tfrecord", *announced, f"the plan's size, {size} bytes")
    assert mirror.bytes_sent < OVERSIZE_BYTES // 2  # both attempts stopped early: at most a few MB each
    assert not any(name.startswith(".") for name in files_under(tmp_path))


def test_a_redirect_loop_is_one_line(yt8m, mirror, tmp_path):
    mirror.faults["trainab.tfrecord"] = ["redirect"]
    outcome = download(yt8m, mirror, tmp_path)
    outcome.assert_clean_error("could not download trainab.tfrecord", "redirect")


@pytest.mark.parametrize("plan", [b"[" * 200_000, b'{"files": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"])
def test_a_deeply_nested_plan_is_a_clean_error(yt8m, mirror, tmp_path, plan):
    mirror.plan = plan
    outcome = download(yt8m, mirror, tmp_path)
    line = outcome.assert_clean_error(f"{mirror.url}{PLAN_PATH} is not a download plan")
    assert len(line) < 500
    assert files_under(tmp_path) == []


def test_a_249_character_file_name_downloads(yt8m, tmp_path):
    name = "t" * 239 + "-.tfrecord"  # its own local name (not train<two letters>)
    mirror = Mirror({name: b"the longest name a file system takes, less its temporary suffix"})
    try:
        outcome = download(yt8m, mirror, tmp_path)
    finally:
        mirror.close()
    assert outcome.assert_success()["files"] == 1
    assert (tmp_path / name).read_bytes() == mirror.files[name]


def test_a_name_too_long_for_any_file_system_is_refused_by_the_plan(yt8m, tmp_path):
    name = "t" * 300 + ".tfrecord"
    mirror = Mirror({name: b"x"})
    try:
        outcome = download(yt8m, mirror, tmp_path)
    finally:
        mirror.close()
    outcome.assert_clean_error(f"{mirror.url}{PLAN_PATH}: ", "longer than 255 bytes")
    assert files_under(tmp_path) == []


def written_bytes() -> int:
    """What this process has written so far (write calls, any file): /proc/self/io's wchar."""
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("wchar:")).split()[1])


def test_the_local_plan_costs_linear_writes_in_the_files(yt8m_here, tmp_path):
    """1,000 one-byte files: the plan's copy (about 60 KB) is not rewritten after each of them (30 MB in all)."""
    files = {f"part{index:04d}_.bin": bytes([index % 256]) for index in range(1000)}
    mirror = Mirror(files)
    try:
        before = written_bytes()
        outcome = yt8m_here("download", "--partition", PARTITION, "--base_url", mirror.url, "--output_dir",
                            str(tmp_path), *FAST, "--parallel", "8")
        written = written_bytes() - before
    finally:
        mirror.close()
    assert outcome.assert_success()["files"] == 1000
    assert written < 20 * len(mirror.plan), f"{written} bytes written for a plan of {len(mirror.plan)}"
    assert json.loads((tmp_path / LOCAL_PLAN).read_text())["files"] == {}
    assert sorted(os.listdir(tmp_path)) == sorted([LOCAL_PLAN, *files])


def test_a_huge_name_in_the_plan_is_quoted_in_part(yt8m, mirror, tmp_path):
    mirror.plan = json.dumps({"files": {"../" + "x" * (5 << 20): "0" * 32}}).encode()
    outcome = download(yt8m, mirror, tmp_path)
    line = outcome.assert_clean_error("is not a plain file name")
    assert len(line) < 600

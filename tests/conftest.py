"""Shared test paths: the fixture and real-data folders beside the repository (../shared, or $YT8M_SHARED_DIR for
a checkout elsewhere, e.g. a git worktree); a process-wide setting reset between tests; SIGINT
at its default for the commands the tests interrupt."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YT8M_SHARED_DIR", REPO_ROOT.parent / "shared"))
FIXTURES = SHARED / "fixtures" / "yt8m"
REALDATA = SHARED / "realdata"


def venv_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (os.environ by default) with the venv's commands (`yt8m`, `python`, `torchrun`) first on PATH, for a
    shell script or command line run as a user runs it."""
    env = dict(os.environ if env is None else env)
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}


def load_sidecar(path: Path) -> dict:
    """The JSON sidecar that states what a fixture file holds."""
    with open(f"{path}.json") as fh:
        return json.load(fh)


def manifest_totals(prefix: str) -> dict:
    """What ../shared/realdata/manifest.json says its files whose path starts with `prefix` hold together: files,
    records, labels_total, label_min, label_max (None without labels), and the first file's first_id and
    first_labels. Tests that count real data check these, so that more shards never break the suite."""
    with open(REALDATA / "manifest.json") as fh:
        files = sorted((entry for entry in json.load(fh)["files"] if entry["path"].startswith(prefix)),
                       key=lambda entry: entry["path"])
    if not files:
        raise LookupError(f"{REALDATA / 'manifest.json'} lists no files starting with {prefix}")
    labelled = [entry for entry in files if entry.get("label_max") is not None]
    return {"files": len(files), "records": sum(entry["records"] for entry in files),
            "labels_total": sum(entry.get("labels_total") or 0 for entry in files),
            "label_min": min((entry["label_min"] for entry in labelled), default=None),
            "label_max": max((entry["label_max"] for entry in labelled), default=None),
            "first_id": files[0]["first_id"], "first_labels": files[0].get("first_labels")}


def as_float32(values: list) -> np.ndarray:
    """Sidecar floats are shortest decimals of float32 values: parse as double, then cast (README)."""
    return np.asarray(values, dtype=np.float64).astype(np.float32)


# The longest tests (minutes each), started first: pytest-xdist hands tests out in collection order, and one of these
# handed out last kept a worker busy for minutes after the other had finished (19 min in all against about 15).
STARTED_FIRST = ("tests/test_readme.py::", "tests/tune/test_tune.py::test_a_study_killed_at_random_points")


def pytest_configure(config) -> None:
    """Ctrl+C as a terminal sends it, for the commands the tests interrupt: a suite started in the background by a
    shell without job control (`make test &` in a script) inherits SIGINT ignored, and so would every command it
    starts, which then never sees the SIGINT a test sends it (a `yt8m tune` training on, a test timing out)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a handled signal is default again after exec


def pytest_collection_modifyitems(config, items) -> None:
    """The longest tests first (STARTED_FIRST); tests marked `gpu` run where CUDA is (`pytest -m gpu` runs only
    them), elsewhere they are skipped."""
    import torch

    items.sort(key=lambda item: not item.nodeid.startswith(STARTED_FIRST))  # stable: the rest keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: the gpu tests run where one is (pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_denormal_flushing_after_test():
    """A test that runs a training command in this process (`cli.main(["train", ...])`) turns denormal flushing on
    for the process, as the command does; later tests that compare stored values bit for bit must not inherit it."""
    yield
    import torch

    torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.skip(f"fixtures not found at {FIXTURES}")
    return FIXTURES


@pytest.fixture(scope="session")
def realdata_dir() -> Path:
    if not REALDATA.is_dir():
        pytest.skip(f"real data not found at {REALDATA}")
    return REALDATA

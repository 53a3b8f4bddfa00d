"""The hostile-input suite (cli_outcome.py): `yt8m` against loopback servers (the download mirror, moto's S3) and
malformed files. Every test here is marked `hostile` (`pytest -m hostile` runs only them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_outcome import in_process_runner, process_runner


def pytest_collection_modifyitems(config, items) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.hostile)


@pytest.fixture
def yt8m(request):
    """`yt8m(*argv, timeout=, env=, cwd=)` -> Outcome: the command in a process of its own, as a user runs it."""
    return process_runner(request.node.nodeid)


@pytest.fixture
def yt8m_here(request):
    """`yt8m_here(*argv)` -> Outcome: the command in this process."""
    return in_process_runner(request.node.nodeid)

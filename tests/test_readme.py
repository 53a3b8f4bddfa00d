"""Every shell example of README.md and of the documentation site's pages (```bash and ```sh blocks) runs as written,
in one folder, in order: README.md's, then each page's in mkdocs.yml's nav order, so that a page's commands find what
an earlier page's made (the quickstart's `yt8m synth` data, its trained runs). A block that is the same, word for word,
as one met earlier runs once. The commands have the venv's `yt8m`, `python` and `torchrun` on PATH, the pages' named
YAML and Python files (a ```yaml or ```python block whose first line is `# NAME.yaml:` or `# NAME.py:`: a module the
commands import, a script they run), and a loopback mirror of data.yt8m.org behind http_proxy for the downloads.

A command that cannot run here is listed in NOT_RUN with why; one that runs with less work than written (fewer videos,
trials, processes, a smaller model) in SMALLER with why. A new command runs: it fails this test until it works or is
listed. A command followed by a `# yt8m <command>: error: ...` comment must fail with that line ("..." elides).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import string
import subprocess
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import pytest
import yaml

from conftest import REALDATA, REPO_ROOT, venv_environment

pytestmark = pytest.mark.integration

README = REPO_ROOT / "README.md"
MKDOCS = REPO_ROOT / "mkdocs.yml"
DOCS = REPO_ROOT / "docs"
COMMAND_SECONDS = 600
# A block is skipped whole where it holds one of these; a command where it holds one of COMMANDS_NOT_RUN.
BLOCKS_NOT_RUN = {
    "make demo": "make test runs this suite, and make demo builds a venv first: tests/commands/test_demo.py runs "
                 "`yt8m demo`",
    "--rdzv_endpoint HEAD:29500": "several machines (N, HEAD and k stand for yours): tests/distributed/"
                                  "test_multinode.py runs two nodes on loopback",
    "#SBATCH": "a SLURM cluster",
    "s3://my-bucket": "an S3 bucket (my-bucket stands for yours): tests/io/test_object_storage.py runs train, eval "
                      "and predict on s3:// against a loopback S3 server",
    "configs/recipes/tune_refit_ensemble.sh": "over an hour of tuning and refits on the real shards: "
                                              "tests/test_recipes.py runs the sequence whole at a test's size",
}
COMMANDS_NOT_RUN = {
    "--num_gpu 4": "four CUDA GPUs (tests/test_gpu.py runs the GPU path where there are some)",
    "FSSPEC_GS_TOKEN=anon": "Google Cloud Storage (gs://) is not reachable here; tests/io/test_object_storage.py "
                            "checks that gs options reach gcsfs",
    "--storage postgresql://user:pass@db-host/yt8m": "a PostgreSQL server at db-host: tests/tune/test_tune.py runs a "
                                                      "study shared by two processes on .ci/postgres.sh's",
}
# (text, replacement, why): applied to every command; each must apply to one at least.
SMALLER = [
    ("--train_videos 2000", "--train_videos 64 --validate_videos 32 --test_videos 32",
     "every set at a size the suite's time allows, in its 4 shards a split as written"),
    ("--n_trials 30", "--n_trials 3 --pruner none",
     "three complete trials (tune-report --ensemble_top 3 needs three), not thirty"),
    ("--n_trials 100", "--n_trials 2", "two trials, not a hundred"),
    ("--nproc_per_node 4", "--nproc_per_node 2", "two processes on the two cores the suite has"),
    ("configs/netrvlad.yaml", "configs/netrvlad.yaml --netvlad_cluster_size 8 --willow_hidden_size 64",
     "the recipe's NetRVLAD has 285M parameters (3.4 GB checkpoints); its path, smaller"),
    ("configs/transformer.yaml", "configs/transformer.yaml --transformer_layers 1 --transformer_hidden_size 96",
     "the recipe's 45M-parameter encoder over every frame takes minutes here; its path, smaller"),
    ("configs/nextvlad.yaml", "configs/nextvlad.yaml --nextvlad_hidden_size 128",
     "the recipe's NeXtVLAD has 84M parameters (1 GB checkpoints); its path, smaller"),
]
EXPECTED_ERROR = re.compile(r"# (yt8m [\w-]+: error: .*)")
NAMED_FILE = {"yaml": re.compile(r"# ([\w.-]+\.yaml):"), "python": re.compile(r"# ([\w.-]+\.py):")}
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclass
class Command:
    text: str
    line: int  # its first line in its file
    end: int  # its last
    block: str
    path: str = "README.md"  # its file, relative to the repository
    expected_error: Optional[str] = None


def fenced_blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(language, first line number, lines without the fence's indent) of each fenced block."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening or not opening.group(2):
            index += 1
            continue
        indent, language, body = len(opening.group(1)), opening.group(2), []
        index += 1
        while not FENCE.match(lines[index]):
            body.append(lines[index][indent:])
            index += 1
        yield language, index - len(body) + 1, body
        index += 1


def commands(body: list[str], first_line: int) -> list[Command]:
    """A shell block's commands: continuation lines joined; a comment right after one may be the error it must give."""
    found: list[Command] = []
    block = "\n".join(body)
    pending, start = "", 0
    for number, line in enumerate(body, start=first_line):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            expected = EXPECTED_ERROR.fullmatch(stripped)
            if expected and found and found[-1].end == number - 1:
                found[-1].expected_error = expected.group(1)
            continue
        start = start or number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip() + "\n"  # bash joins the lines, as in the README
            continue
        found.append(Command(pending + line, start, number, block))
        pending, start = "", 0
    return found


def nav_pages(nav: object) -> Iterator[str]:
    """The pages of mkdocs.yml's nav (a list of pages, `title: page` and `title: [sections]`), in order."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from nav_pages(value)


def documented_files() -> list[Path]:
    """README.md, then the site's pages in nav order: the order their examples run in."""
    return [README] + [DOCS / page for page in nav_pages(yaml.safe_load(MKDOCS.read_text())["nav"])]


def readme_commands() -> tuple[list[Command], dict[str, str]]:
    """The shell commands of README.md and the site's pages in order, a block met before left out, and their named
    YAML and Python files (name -> text)."""
    shell: list[Command] = []
    files: dict[str, str] = {}
    seen_blocks: set[str] = set()
    for path in documented_files():
        for language, first_line, body in fenced_blocks(path.read_text()):
            named = NAMED_FILE[language].match(body[0]) if language in NAMED_FILE and body else None
            if language in ("bash", "sh") and "\n".join(body) not in seen_blocks:
                seen_blocks.add("\n".join(body))
                for command in commands(body, first_line):
                    command.path = str(path.relative_to(REPO_ROOT))
                    shell.append(command)
            elif named:
                assert files.get(named.group(1), "\n".join(body) + "\n") == "\n".join(body) + "\n", named.group(1)
                files[named.group(1)] = "\n".join(body) + "\n"
    return shell, files


def skipped(command: Command) -> Optional[str]:
    for key, why in BLOCKS_NOT_RUN.items():
        if key in command.block:
            return why
    return next((why for key, why in COMMANDS_NOT_RUN.items() if key in command.text), None)


def as_run(command: Command) -> str:
    text = command.text
    for old, new, _ in SMALLER:
        text = text.replace(old, new)
    return text


def test_the_lists_name_readme_commands():
    """NOT_RUN names exactly one block or command each, SMALLER one command at least: stale entries fail."""
    shell, _ = readme_commands()
    blocks = {command.block for command in shell}
    for key in BLOCKS_NOT_RUN:
        assert sum(key in block for block in blocks) == 1, key
    for key in COMMANDS_NOT_RUN:
        assert sum(key in command.text for command in shell) == 1, key
    assert not [page for page, count in Counter(documented_files()).items() if count > 1], "a page twice in the nav"
    for old, _, _ in SMALLER:
        assert any(old in command.text for command in shell), old
    assert len(shell) > 40 and sum(skipped(command) is None for command in shell) > 35


def test_every_documented_example_runs(tmp_path):
    shell, files = readme_commands()
    lay_out(tmp_path, files)
    failures, timings = [], []
    with loopback_yt8m_mirror() as proxy:
        env = command_environment(proxy)
        for command in shell:
            if skipped(command):
                continue
            started = time.monotonic()
            failure = run(command, tmp_path, env)
            timings.append((time.monotonic() - started, f"{command.path}:{command.line}"))
            if failure:
                failures.append(failure)
    slowest = ", ".join(f"{where} {seconds:.0f} s" for seconds, where in sorted(timings, reverse=True)[:12])
    print(f"{len(timings)} commands in {sum(t for t, _ in timings):.0f} s; slowest: {slowest}")
    assert not failures, "\n\n".join(failures)


def run(command: Command, folder: Path, env: dict[str, str]) -> Optional[str]:
    """Why the command did not do what its page says, or None."""
    done = subprocess.run(["bash", "-o", "pipefail", "-c", as_run(command)], cwd=folder, env=env, text=True,
                          capture_output=True, timeout=COMMAND_SECONDS)
    where = f"{command.path}:{command.line}: {command.text}"
    if command.expected_error is None:
        return None if done.returncode == 0 else f"{where}\nexit {done.returncode}:\n{done.stderr[-2500:]}"
    last = (done.stderr.strip().splitlines() or [""])[-1]
    pieces = [piece.strip() for piece in command.expected_error.split("...") if piece.strip()]
    if done.returncode == 1 and in_order(pieces, last):
        return None
    return f"{where}\nexpected exit 1 and {command.expected_error!r}, got exit {done.returncode}: {last!r}"


def in_order(pieces: list[str], text: str) -> bool:
    position = 0
    for piece in pieces:
        position = text.find(piece, position)
        if position < 0:
            return False
        position += len(piece)
    return True


def lay_out(folder: Path, files: dict[str, str]) -> None:
    """What the examples take as there: the repository's configs, the pages' YAML and Python files, the PCA release's
    eigenvalues NeXtVLAD's recipe reads, configs/tune_video.yaml's data folder (data/synthetic/video: synth's
    data/video) and the real 2018 validate shards of "Real data in 10 minutes" (yt8m2018/: ../shared/realdata's)."""
    (folder / "configs").symlink_to(REPO_ROOT / "configs")
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "data" / "yt8m_pca").mkdir(parents=True)
    np.save(folder / "data" / "yt8m_pca" / "eigenvals.npy", np.linspace(4.0, 0.01, 1024).astype(np.float32))
    (folder / "data" / "synthetic").symlink_to(".")
    (folder / "yt8m2018").symlink_to(REALDATA / "yt8m_2018_video_validate")


def command_environment(proxy: str) -> dict[str, str]:
    """The venv's commands first on PATH; plain HTTP through the loopback mirror; no display for plots."""
    env = {name: value for name, value in os.environ.items() if name.lower() not in ("no_proxy", "http_proxy")}
    return {**venv_environment(env), "http_proxy": proxy, "MPLBACKEND": "Agg"}


# The loopback mirror ---------------------------------------------------------------------------------------------

def named_for_shard(split: str, shard: int, of: int) -> str:
    """A plan file name that the official downloader's `--shard shard,of` takes (its name's MD5 modulo `of`)."""
    for first, second in itertools.product(string.ascii_lowercase, repeat=2):
        name = f"{split}{first}{second}.tfrecord"
        if int(hashlib.md5(name.encode()).hexdigest(), 16) % of == shard - 1:
            return name
    raise AssertionError(f"no two-letter name of {split} falls in shard {shard} of {of}")


def partition_files() -> dict[str, dict[str, bytes]]:
    """Partition -> {file name: bytes}: two files each, one of them in the README's --shard."""
    return {"2/video/train": {"trainaa.tfrecord": b"a" * 1000, "trainab.tfrecord": b"b" * 2000},
            "2/frame/validate": {named_for_shard("validate", 1, 100): b"c" * 1500, "validateaa.tfrecord": b"d" * 10},
            "2/frame/train": {named_for_shard("train", 3, 100): b"e" * 700, "trainaa.tfrecord": b"f" * 10}}


class loopback_yt8m_mirror:
    """An HTTP proxy on loopback that answers as data.yt8m.org, its mirrors (us.data.yt8m.org, ...) and the README's
    private mirror (mirror.example.org/yt8m) would: the download plans and files of `partition_files()`."""

    def __init__(self) -> None:
        self.partitions = partition_files()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, url: str) -> Optional[bytes]:
        parsed = urllib.parse.urlsplit(url)
        path = parsed.path.removeprefix("/yt8m") if parsed.hostname == "mirror.example.org" else parsed.path
        plan = re.fullmatch(r"/(\d+)/download_plans/(\w+)_(\w+)\.json", path)
        if plan:
            files = self.partitions.get("/".join(plan.groups()), {})
            return json.dumps({"files": {name: hashlib.md5(data).hexdigest() for name, data in files.items()}}).encode()
        partition, _, name = urllib.parse.unquote(path).lstrip("/").rpartition("/")
        return self.partitions.get(partition, {}).get(name)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._reply(body=True)

            def do_HEAD(self) -> None:
                self._reply(body=False)

            def _reply(self, body: bool) -> None:
                data = mirror.answer(self.path)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

"""The machine's limits met by `yt8m train`, run on two checkouts in turn: what each case gave (clean line, fallback,
a kill the log explains, traceback, a kill it does not explain, hang), as a before/after table (issue 35).

    python bench/machine_limits.py --checkout before=/work/old --checkout after=. [--cases shm-8MB,kill-reader]

Each checkout runs with its own .venv's python and its src first on PYTHONPATH. Cases that need root (a memory
cgroup, a private /dev/shm or a small filesystem through `unshare -m`) or the `dev` extra (moto, for the loopback
S3) say why they were skipped. The memory cases train on the real 2018 shards (../shared/realdata).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

REPO = Path(__file__).resolve().parent.parent
REAL_SHARDS = REPO.parent / "shared" / "realdata" / "yt8m_2018_video_validate" / "validate*.tfrecord"
HANG_SECONDS = 120  # a case still running after this is a hang
FRAME_FLAGS = ["--frame_features", "--feature_names", "rgb,audio", "--feature_sizes", "1024,128", "--num_classes",
               "20", "--model", "FrameLevelLogisticModel", "--batch_size", "64"]


@dataclass
class Case:
    """A limit met by one `yt8m train` command: `setup(work)` makes its data and returns the train flags, `wrap`
    puts the command under the limit (cgroup, namespace), `during` acts on the running process (a kill), `falls_back`
    and `explains` are what a warning says for a fallback, and before a kill."""

    name: str
    what: str
    setup: Callable[[Path], list[str]]
    needs: Callable[[], str] = lambda: ""
    wrap: Callable[[list[str], Path], list[str]] = lambda command, work: command
    during: Optional[Callable[[subprocess.Popen, list[str]], None]] = None
    falls_back: tuple[str, ...] = ()
    explains: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def real_shards(work: Path) -> list[str]:
    return ["--train_data_pattern", str(REAL_SHARDS), "--model", "LogisticModel", "--cache_in_memory",
            "--num_readers", "0", "--batch_size", "256", "--max_steps", "40", "--export_model_steps", "1000"]


def synthetic(kind: str, videos: int) -> Callable[[Path], list[str]]:
    def setup(work: Path) -> list[str]:
        from yt8m.data.making.synthetic import write_synthetic  # the checkout running this script writes the data
        data = work / "data"
        if not data.exists():
            write_synthetic(str(data), kind=kind, num_classes=20, train_videos=videos, validate_videos=0,
                            test_videos=0, shards=2, min_frames=100, max_frames=300, seed=3)
        pattern = ["--train_data_pattern", str(data / kind / "train-*.tfrecord")]
        if kind == "frame":
            return [*pattern, *FRAME_FLAGS]
        return [*pattern, "--feature_names", "mean_rgb,mean_audio", "--feature_sizes", "1024,128",
                "--num_classes", "20"]
    return setup


def root_problem() -> str:
    return "" if os.geteuid() == 0 else "needs root"


def cgroup_problem() -> str:
    if root_problem():
        return root_problem()
    return "" if memory_cgroup_parent() else "no writable memory cgroup (v1 or v2)"


def memory_cgroup_parent() -> Optional[Path]:
    """Where a child memory cgroup can be made: this process's own (cgroup v1's memory controller, or v2), or the
    root a container sees as its own."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers not in ("memory", ""):
            continue
        root = Path("/sys/fs/cgroup/memory" if controllers == "memory" else "/sys/fs/cgroup")
        for parent in (root / path.lstrip("/"), root):
            if parent.is_dir() and os.access(parent, os.W_OK):
                return parent
    return None


def in_memory_cgroup(megabytes: int) -> Callable[[list[str], Path], list[str]]:
    def wrap(command: list[str], work: Path) -> list[str]:
        parent = memory_cgroup_parent()
        assert parent is not None
        group = parent / f"yt8m_limit_{uuid.uuid4().hex[:8]}"
        group.mkdir()
        v1 = (group / "memory.limit_in_bytes").exists()
        (group / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(megabytes * 10 ** 6))
        (work / "cgroup").write_text(str(group))
        script = f'echo $$ > {shlex.quote(str(group / "cgroup.procs"))} && exec "$@"'
        return ["sh", "-c", script, "sh", *command]
    return wrap


def unshare_problem() -> str:
    if root_problem() or not shutil.which("unshare"):
        return root_problem() or "no unshare command"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True)
    return "" if probe.returncode == 0 else "unshare -m with a tmpfs mount is not permitted"


def with_tmpfs(mount_point: str, size: str) -> Callable[[list[str], Path], list[str]]:
    def wrap(command: list[str], work: Path) -> list[str]:
        target = mount_point.replace("WORK", str(work))
        script = f"mkdir -p {target} && mount -t tmpfs -o size={size} tmpfs {target} && exec \"$@\""
        return ["unshare", "-m", "sh", "-c", script, "sh", *command]
    return wrap


def kill_a_reader(process: subprocess.Popen, lines: list[str]) -> None:
    """SIGKILL the run's reader processes (forked children with its command line) once it logs a step."""
    if any(" step " in line for line in lines):
        own = Path(f"/proc/{process.pid}/cmdline").read_bytes()
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rpartition(")")[2].split()[1]) == process.pid and (entry / "cmdline").read_bytes() == own:
                    os.kill(int(entry.name), signal.SIGKILL)
                    raise StopIteration


def moto_problem() -> str:
    try:
        import moto  # noqa: F401  # the dev extra's loopback S3
    except ImportError:
        return "needs moto (the dev extra)"
    return ""


@contextlib.contextmanager
def stalled_s3(work: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    """A loopback S3 (moto) holding one shard, behind a proxy that stalls every read after the upload."""
    sys.path.insert(0, str(REPO / "tests"))
    import s3fs

    from s3_server import loopback_s3_server, s3_environment, stalling_proxy
    from yt8m.data.making.synthetic import write_synthetic
    shard = write_synthetic(str(work / "data"), num_classes=20, train_videos=64, validate_videos=0, test_videos=0,
                            shards=1, feature_sizes=(1024, 128))["train"][0]
    with loopback_s3_server() as endpoint, stalling_proxy(endpoint) as (proxy, stall):
        environment = s3_environment(proxy)
        with patched_environ(environment):
            s3fs.S3FileSystem.clear_instance_cache()
            s3fs.S3FileSystem().mkdir("stalls")
            s3fs.S3FileSystem().put(shard, "stalls/train-0.tfrecord")
        stall.set()
        flags = ["--train_data_pattern", "s3://stalls/train-*.tfrecord", "--feature_names", "mean_rgb,mean_audio",
                 "--feature_sizes", "1024,128", "--num_classes", "20", "--num_epochs", "1"]
        yield flags, {**environment, "YT8M_READ_TIMEOUT_SECS": "5", "YT8M_READ_RETRIES": "1"}


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


CASES = [
    Case("cgroup-420MB", "the RAM-cache recipe (LogisticModel, 132 real shards, --cache_in_memory) in a 420 MB "
         "memory cgroup", real_shards, cgroup_problem, in_memory_cgroup(420),
         falls_back=("streaming the shards instead",),
         explains=("the kernel is likely to kill it", "memory in use is")),
    Case("cgroup-560MB", "the same in a 560 MB memory cgroup", real_shards, cgroup_problem, in_memory_cgroup(560),
         falls_back=("streaming the shards instead",),
         explains=("the kernel is likely to kill it", "memory in use is")),
    Case("cgroup-800MB", "the same in an 800 MB memory cgroup", real_shards, cgroup_problem, in_memory_cgroup(800),
         falls_back=("streaming the shards instead",),
         explains=("the kernel is likely to kill it", "memory in use is")),
    Case("shm-8MB", "frame level, 1 reader process, batch 64, /dev/shm an 8 MB tmpfs (unshare -m)",
         lambda work: [*synthetic("frame", 128)(work), "--num_readers", "1", "--num_epochs", "1"], unshare_problem,
         with_tmpfs("/dev/shm", "8m"), falls_back=("reading in-process instead",)),
    Case("kill-reader", "frame level, 1 reader process, SIGKILLed after the first logged step",
         lambda work: [*synthetic("frame", 256)(work), "--num_readers", "1", "--num_epochs", "5",
                       "--log_every_steps", "1", "--export_model_steps", "1000"],
         during=kill_a_reader, falls_back=()),
    Case("full-disk", "MoeModel (its checkpoint about 237 MB) on the real shards, the train dir on a 16 MB tmpfs "
         "(unshare -m)", lambda work: ["--train_data_pattern", str(REAL_SHARDS), "--model", "MoeModel",
                                       "--num_readers", "0", "--max_steps", "2"],
         unshare_problem, with_tmpfs("WORK/small", "16m"), falls_back=("checkpoints of about",)),
    Case("s3-stall", "video level from a loopback S3 whose reads stall after the listing", lambda work: [],
         moto_problem),
]


def run_case(case: Case, python: str, src: str, work: Path) -> tuple[str, str, float]:
    """(outcome, the line that shows it, seconds) of `case` with the checkout at `src`."""
    stack = contextlib.ExitStack()
    env = {**os.environ, "PYTHONPATH": src, "PYTHONUNBUFFERED": "1"}
    if case.name == "s3-stall":
        flags, s3_env = stack.enter_context(stalled_s3(work))
        env.update(s3_env)
    else:
        flags = case.setup(work)
    train_dir = str(work / ("small" if case.name == "full-disk" else "") / f"run-{uuid.uuid4().hex[:6]}")
    command = case.wrap([python, "-m", "yt8m", "train", *flags, "--train_dir", train_dir], work)
    started = time.monotonic()
    with stack:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                   start_new_session=True)
        lines, timed_out = watch(process, case)
    seconds = time.monotonic() - started
    with contextlib.suppress(OSError, FileNotFoundError):
        Path((work / "cgroup").read_text()).rmdir()
    return (*classify(case, process.returncode, lines, timed_out), seconds)


def watch(process: subprocess.Popen, case: Case) -> tuple[list[str], bool]:
    """The process's stderr lines, read until it ends or HANG_SECONDS pass (then its session is killed)."""
    assert process.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in process.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + HANG_SECONDS
    acting = case.during
    while process.poll() is None and time.monotonic() < deadline:
        if acting is not None:
            try:
                acting(process, lines)
            except StopIteration:
                acting = None
        time.sleep(0.2)
    timed_out = process.poll() is None
    if timed_out:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    reader.join(timeout=10)
    return lines, timed_out


def classify(case: Case, returncode: int, lines: list[str], timed_out: bool) -> tuple[str, str]:
    last = lines[-1] if lines else ""
    if timed_out:
        return "hang", last
    if any(line.startswith("Traceback") for line in lines):
        return "traceback", next((line for line in reversed(lines) if line and not line.startswith(" ")), last)
    if returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        explained = [line for line in lines if any(text in line for text in case.explains)]
        return ("kill, explained", explained[-1]) if explained else ("kill, unexplained", last)
    if returncode == 1 and last.startswith("yt8m train: error:"):
        return "clean line", last
    if returncode == 0:
        fallback = [line for line in lines if any(text in line for text in case.falls_back)]
        return ("fallback", fallback[0]) if fallback else ("ran", last)
    return f"exit {returncode}", last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", action="append", required=True, metavar="NAME=PATH",
                        help="A checkout with its .venv (before=..., after=...), run in the order given.")
    parser.add_argument("--cases", default=",".join(case.name for case in CASES))
    args = parser.parse_args()
    checkouts = [item.partition("=")[::2] for item in args.checkout]
    names = args.cases.split(",")
    print("| case | " + " | ".join(name for name, _ in checkouts) + " |")
    print("| --- " * (len(checkouts) + 1) + "|")
    for case in (case for case in CASES if case.name in names):
        problem = case.needs()
        if problem:
            print(f"| {case.name}: {case.what} | skipped: {problem} |" + " |" * (len(checkouts) - 1), flush=True)
            continue
        cells = []
        with tempfile.TemporaryDirectory(prefix=f"limits-{case.name}-") as work:
            for _, path in checkouts:
                root = Path(path).resolve()
                outcome, line, seconds = run_case(case, str(root / ".venv" / "bin" / "python"), str(root / "src"),
                                                  Path(work))
                cells.append(f"**{outcome}** ({seconds:.0f} s): `{line.strip()[:220]}`")
        print(f"| {case.name}: {case.what} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

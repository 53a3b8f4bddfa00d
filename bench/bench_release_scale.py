"""The release's shape by simulation: thousands of tiny shards in an S3 bucket (moto's server on loopback, in a
process of its own) behind a proxy that adds a fixed latency to every request, read by 1, 2 and 4 torchrun ranks;
real-size frame shards on local disk for memory; a 2-rank resume late in an epoch.

What it prints (JSON lines), part by part:
- `startup`: for N shards of ~4 videos and R ranks (LogisticModel, batch 64, default flags otherwise), each rank's
  requests before its first step, by kind (LIST pages, HEAD, GET of an object's bytes), the distinct shards it read,
  its time to step 1 from the job's launch, and its peak RSS (and its reader workers');
- `eval`: `yt8m eval` and `yt8m predict` over the N-shard bucket behind the proxy against the same shards on local
  disk (videos/s, best of --rounds, alternating);
- `frames`: `yt8m train` on real-size frame shards (1,000 videos x 300 frames each, local disk, default flags): peak
  RSS of the training process, of its reader workers and of the whole tree (sampled);
- `resume`: 2 ranks stopped at 90% of an epoch and resumed, against the uninterrupted run: the shards each reader
  opened before its first step (the read stats' line), the shuffle window its buffer's records lay in, the shards it
  had read, and whether the final weights are bit-identical.

Needs the dev extras (s3fs, moto[server]). Usage: .venv/bin/python bench/bench_release_scale.py [--parts
startup,eval,frames,resume] [--shards 100,1000,3844,10000] [--ranks 1,2,4] [--latency_ms 50]
[--work_dir /tmp/yt8m_release_scale]. `rank` is the script torchrun runs on each process (not called by hand).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from s3_server import loopback_s3_server, s3_environment, s3_environment_set

BUCKET = "yt8m-release"
FEATURES = dict(feature_names="mean_rgb,mean_audio", feature_sizes="1024,128", num_classes=3862)
SEED = 1
CODE: dict[str, str] = {}  # PYTHONPATH for the processes torchrun starts: --src, the code measured (default: yt8m's)
FRAME_FEATURES = dict(feature_names="rgb,audio", feature_sizes="1024,128", num_classes=3862, frame_features=True)


# --- a store's latency: a proxy that holds every request back a fixed time, and counts them ---------------------


class LatencyProxy:
    """A TCP proxy to an HTTP server on loopback that waits `latency` seconds before passing on each request (a
    cloud store's round trip: connections in parallel wait in parallel) and notes (time, kind) of each: LIST (a
    bucket listing's page), HEAD, GET (an object's bytes), or the method."""

    def __init__(self, upstream: str, latency: float):
        host, port = upstream.split("//")[1].rsplit(":", 1)
        self.upstream, self.latency = (host, int(port)), latency
        self.requests: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def close(self) -> None:
        self._listener.close()

    def counts(self, before: float) -> dict[str, int]:
        with self._lock:
            kinds = [kind for when, kind in self.requests if when <= before]
        return {kind: kinds.count(kind) for kind in sorted(set(kinds))}

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=_relay, args=(server, client), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        """Client to server: a chunk that opens with a method is a new request (botocore sends a request's head in
        one piece and waits for the answer before the next on a connection)."""
        try:
            while data := client.recv(1 << 16):
                kind = request_kind(data)
                if kind is not None:
                    with self._lock:
                        self.requests.append((time.time(), kind))
                    time.sleep(self.latency)
                server.sendall(data)
        except OSError:
            pass
        finally:
            server.close()
            client.close()


def request_kind(data: bytes) -> Optional[str]:
    method, _, rest = data.partition(b" ")
    if method not in (b"GET", b"HEAD", b"PUT", b"POST", b"DELETE"):
        return None
    target = rest.split(b" ", 1)[0]
    if method == b"GET" and (b"list-type=" in target or b"prefix=" in target or target.endswith(b"/")):
        return "LIST"
    return method.decode()


def _relay(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        sink.close()
        source.close()


@contextlib.contextmanager
def proxies(endpoint: str, count: int, latency: float) -> Iterator[list[LatencyProxy]]:
    made = [LatencyProxy(endpoint, latency) for _ in range(count)]
    try:
        yield made
    finally:
        for proxy in made:
            proxy.close()


# --- data: tiny shards locally and in the bucket ----------------------------------------------------------------


def tiny_shards(work: Path, endpoint: str, shards: int) -> tuple[str, str]:
    """N shards of 4 videos each (real feature sizes), on local disk and in the bucket: (local glob, s3 glob)."""
    from yt8m.data.making.synthetic import write_synthetic

    local = work / f"tiny-{shards}"
    if not (local / "video").is_dir():
        write_synthetic(str(local), kind="video", num_classes=3862, train_videos=4 * shards, validate_videos=0,
                        test_videos=0, shards=shards, seed=shards)
    with s3_environment_set(endpoint):
        import s3fs

        fs = s3fs.S3FileSystem()
        if not fs.exists(BUCKET):
            fs.mkdir(BUCKET)
        prefix = f"{BUCKET}/n{shards}"
        if len(fs.ls(prefix, refresh=True) if fs.exists(prefix) else []) < shards:
            names = sorted(str(path) for path in (local / "video").glob("train-*.tfrecord"))
            fs.put(names, prefix + "/")
    return str(local / "video" / "train-*.tfrecord"), f"s3://{BUCKET}/n{shards}/train-*.tfrecord"


# --- what each torchrun process runs -------------------------------------------------------------------------


def rank_main(argv: list[str]) -> None:
    """One torchrun process: its own proxy (by LOCAL_RANK), the training of the JSON config given, and what it
    measured written to OUT/rank-RANK.json: when its first step was taken, its peak RSS, the resume's read line."""
    spec = json.loads(argv[0])
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    if spec.get("endpoints"):
        os.environ["AWS_ENDPOINT_URL_S3"] = spec["endpoints"][local_rank]
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from yt8m.config import config_from_dict
    from yt8m.training import TrainConfig, train

    noted: dict[str, Any] = {}
    # The first optimizer step's time, through torch's global hook (so that --src can point at older code too).
    register_optimizer_step_post_hook(lambda *_: noted.setdefault("step1", time.time()))
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    logging.getLogger("yt8m.train").addHandler(handler)
    logging.getLogger("yt8m.train").setLevel(logging.INFO)
    summary = train(config_from_dict(TrainConfig, spec["config"], source="bench_release_scale"))
    usage, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    resumed = [line for line in lines.getvalue().splitlines() if "its readers opened" in line]
    result = {"rank": rank, "step1": noted.get("step1"), "peak_rss_mb": round(usage.ru_maxrss / 1024),
              "workers_peak_rss_mb": round(children.ru_maxrss / 1024), "global_step": summary["global_step"],
              "resumed": resumed[0] if resumed else None}
    Path(spec["out"], f"rank-{rank}.json").write_text(json.dumps(result))


def torchrun(ranks: int, config: dict, out: Path, endpoints: list[str], env: dict[str, str]) -> list[dict]:
    """Run `config` under torchrun on `ranks` processes; each one's measurements (and the launch time)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank-*.json"):
        stale.unlink()
    spec = json.dumps({"config": config, "out": str(out), "endpoints": endpoints})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
               os.path.abspath(__file__), "rank", spec]
    launched = time.time()
    done = subprocess.run(command, env={**os.environ, **env, **CODE}, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun failed ({done.returncode}):\n{done.stderr[-4000:]}")
    results = [json.loads(path.read_text()) for path in sorted(out.glob("rank-*.json"))]
    for result in results:
        result["launched"] = launched
    return results


def train_values(pattern: str, train_dir: Path, **overrides: Any) -> dict:
    return {"train_data_pattern": pattern, "train_dir": str(train_dir), "model": "LogisticModel", "batch_size": 64,
            "num_epochs": 1, "export_model_steps": 10**9, "log_every_steps": 10**9, "start_new_model": True,
            "seed": SEED, **FEATURES, **overrides}


# --- the parts ------------------------------------------------------------------------------------------------


def startup(args: argparse.Namespace, work: Path, endpoint: str) -> None:
    for shards in args.shards:
        _, remote = tiny_shards(work, endpoint, shards)
        for ranks in args.ranks:
            with proxies(endpoint, ranks, args.latency_ms / 1000) as store:
                results = torchrun(ranks, train_values(remote, work / "run", max_steps=1), work / "out",
                                   [proxy.url for proxy in store], s3_environment(endpoint))
                for result, proxy in zip(sorted(results, key=lambda r: r["rank"]), store):
                    counts = proxy.counts(before=result["step1"])
                    emit("startup", code=args.src or "this checkout", shards=shards, ranks=ranks, rank=result["rank"],
                         requests_before_step1=counts,
                         not_shard_reads=sum(n for kind, n in counts.items() if kind != "GET"),
                         limit=-(-shards // 1000) + 20, seconds_to_step1=round(result["step1"] - result["launched"], 1),
                         peak_rss_mb=result["peak_rss_mb"], workers_peak_rss_mb=result["workers_peak_rss_mb"])


def timed_command(argv: list[str]) -> tuple[float, str]:
    from yt8m import cli

    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        status = cli.main(argv)
    if status:
        raise RuntimeError(f"yt8m {' '.join(argv)} exited {status}")
    return time.perf_counter() - started, out.getvalue()


def eval_and_predict(args: argparse.Namespace, work: Path, endpoint: str) -> None:
    shards = args.eval_shards
    local, remote = tiny_shards(work, endpoint, shards)
    train_dir = work / "eval-run"
    timed_command(["train", *flags(train_values(local, train_dir, max_steps=2))])
    best: dict[tuple[str, str], float] = {}
    # s3: behind the latency proxy; s3_no_latency: moto's server itself (what the simulated store can serve here)
    with proxies(endpoint, 1, args.latency_ms / 1000) as (proxy,):
        stores = {"local": (local, endpoint), "s3": (remote, proxy.url), "s3_no_latency": (remote, endpoint)}
        for _ in range(args.rounds):
            for where, (pattern, url) in stores.items():
                with s3_environment_set(url):
                    for command, argv in commands(pattern, train_dir, work).items():
                        seconds, _ = timed_command(argv)
                        best[command, where] = min(seconds, best.get((command, where), float("inf")))
    for command in ("eval", "predict"):
        rates = {where: round(4 * shards / best[command, where]) for where in stores}
        emit("eval", command=command, shards=shards, videos_per_sec=rates,
             s3_share_of_local=round(rates["s3"] / rates["local"], 2),
             s3_share_of_no_latency=round(rates["s3"] / rates["s3_no_latency"], 2))


def commands(pattern: str, train_dir: Path, work: Path) -> dict[str, list[str]]:
    return {"eval": ["eval", "--train_dir", str(train_dir), "--eval_data_pattern", pattern, "--run_once"],
            "predict": ["predict", "--train_dir", str(train_dir), "--input_data_pattern", pattern,
                        "--output_file", str(work / "predictions.csv")]}


def flags(values: dict) -> list[str]:
    return [part for name, value in values.items()
            for part in ((f"--{name}",) if value is True else (f"--{name}", str(value)))]


def frames(args: argparse.Namespace, work: Path) -> None:
    """`yt8m train` on the frame shards in a process of its own, reading in-process (auto on this machine) and with
    one reader worker: the peak RSS of the training process and of its reader workers (sampled from /proc), and of
    the whole tree. On a GPU node the model's float32 working set is on the device; here it is in the training
    process, so the reader's own memory is the worker's."""
    folder = Path(args.frame_dir)
    if not (folder / "frame").is_dir():
        from yt8m.data.making.synthetic import write_synthetic

        write_synthetic(str(folder), kind="frame", num_classes=3862, train_videos=6000, validate_videos=0,
                        test_videos=0, shards=6, min_frames=300, max_frames=300, seed=1)
    for readers in ("auto", "1"):
        values = {"train_data_pattern": str(folder / "frame" / "train-*.tfrecord"),
                  "train_dir": str(work / "frame-run"), "model": "FrameLevelLogisticModel",
                  "max_steps": args.frame_steps, "start_new_model": True, "num_readers": readers, **FRAME_FEATURES}
        training, peaks, tree_peak = sampled_peaks([sys.executable, "-m", "yt8m", "train", *flags(values)],
                                                   work / "frames.log")
        emit("frames", shards=6, videos_per_shard=1000, frames_per_video=300, steps=args.frame_steps,
             num_readers=readers, training_process_peak_rss_mb=peaks.pop(training),
             reader_workers_peak_rss_mb=max(peaks.values(), default=0), tree_peak_rss_mb=tree_peak)


def sampled_peaks(command: list[str], log_path: Path) -> tuple[int, dict[int, int], int]:
    """Run `command`, sampling every 0.2 s the resident memory of it and its descendants: (its pid, {pid: that
    process's peak MB}, the tree's peak MB)."""
    peaks: dict[int, int] = {}
    tree_peak = 0
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log)
        while process.poll() is None:
            sizes = tree_rss_mb(process.pid)
            tree_peak = max(tree_peak, sum(sizes.values()))
            for pid, size in sizes.items():
                peaks[pid] = max(size, peaks.get(pid, 0))
            time.sleep(0.2)
    if process.returncode != 0:
        raise RuntimeError(log_path.read_text()[-3000:])
    return process.pid, peaks, tree_peak


def tree_rss_mb(pid: int) -> dict[int, int]:
    """The resident memory (MB) of a process and of each of its descendants, from /proc."""
    sizes, pending = {}, [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(OSError):
            pages = int(Path(f"/proc/{current}/statm").read_text().split()[1])
            sizes[current] = round(pages * os.sysconf("SC_PAGE_SIZE") / 2 ** 20)
            for task in os.listdir(f"/proc/{current}/task"):
                pending += [int(child) for child in Path(f"/proc/{current}/task/{task}/children").read_text().split()]
    return sizes


def resume(args: argparse.Namespace, work: Path, endpoint: str) -> None:
    """2 ranks: an uninterrupted epoch; the same stopped at 90% and resumed; the weights compared."""
    from yt8m.data.making.synthetic import write_synthetic

    folder = work / f"resume-{args.resume_shards}x{args.resume_shard_videos}"
    if not (folder / "video").is_dir():
        write_synthetic(str(folder), kind="video", num_classes=3862, shards=args.resume_shards, validate_videos=0,
                        test_videos=0, train_videos=args.resume_shards * args.resume_shard_videos, seed=2)
    pattern = str(folder / "video" / "train-*.tfrecord")
    values = dict(batch_size=1024, num_readers=0)
    steps = torchrun(2, train_values(pattern, work / "whole", **values), work / "out", [], {})[0]["global_step"]
    stop_at = int(steps * 0.9)
    torchrun(2, train_values(pattern, work / "cut", max_steps=stop_at, **values), work / "out", [], {})
    resumed = torchrun(2, {**train_values(pattern, work / "cut", **values), "start_new_model": False},
                       work / "out", [], {})
    identical = same_final_weights(work / "whole", work / "cut")
    for result, window in zip(sorted(resumed, key=lambda r: r["rank"]), shuffle_windows(pattern, work / "cut",
                                                                                          stop_at)):
        emit("resume", shards=args.resume_shards, videos_per_shard=args.resume_shard_videos, steps=steps,
             stopped_at=stop_at, rank=result["rank"], read_line=result["resumed"], shuffle_window=window,
             bit_identical=identical)


def same_final_weights(first: Path, second: Path) -> bool:
    import torch

    from yt8m.io.checkpoints import final_checkpoint, load_checkpoint

    a, b = (load_checkpoint(final_checkpoint(str(run))).model for run in (first, second))
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def shuffle_windows(pattern: str, train_dir: Path, step: int) -> list[int]:
    """Each rank's shuffle window at the checkpoint of `step`: the shares before the one its reader went on in that
    its buffer's records lay in (replayed from the checkpoint's positions)."""
    import numpy as np

    from yt8m.data.format.tfrecord import list_shards
    from yt8m.data.reading.read_plan import ReadOptions, ReadPlan
    from yt8m.data.reading.shuffle_stream import ShuffleBuffer, ShuffledStream, StreamPosition
    from yt8m.io.checkpoints import checkpoint_path, load_checkpoint

    checkpoint = load_checkpoint(checkpoint_path(str(train_dir), step))
    windows = []
    for rank, state in enumerate(checkpoint.reading or []):
        plan = ReadPlan(list_shards(pattern), ReadOptions(shuffle=True, seed=SEED, rank=rank,
                                                         world_size=len(checkpoint.reading)))
        plan.set_epoch(state["epoch"])
        value = state["sources"][0]["positions"][rank]
        position = StreamPosition(**{**value, "blocks": tuple(value["blocks"]),
                                     "share_records": tuple(value["share_records"])})
        shares = plan.shares(rank, len(checkpoint.reading))
        rng = plan.shuffle_stream(rank, len(checkpoint.reading))
        assert isinstance(rng, np.random.Generator)
        order = ShuffledStream(len(shares), ShuffleBuffer(state["shuffle_buffers"][0], rng), position).read_order()
        windows.append(len(order) - (len(shares) - len(position.share_records) + 1))
    return windows


def emit(part: str, **values: Any) -> None:
    print(json.dumps({"part": part, **values}), flush=True)


def main() -> None:
    if sys.argv[1:2] == ["rank"]:
        rank_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="startup,eval,frames,resume")
    parser.add_argument("--shards", default="100,1000,3844,10000", type=lambda text: [int(n) for n in text.split(",")])
    parser.add_argument("--ranks", default="1,2,4", type=lambda text: [int(n) for n in text.split(",")])
    parser.add_argument("--latency_ms", type=float, default=50.0)
    parser.add_argument("--eval_shards", type=int, default=3844)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--frame_dir", default="/tmp/yt8m_frame_real")
    parser.add_argument("--frame_steps", type=int, default=3)
    parser.add_argument("--resume_shards", type=int, default=200)
    parser.add_argument("--resume_shard_videos", type=int, default=1000)
    parser.add_argument("--work_dir", default="/tmp/yt8m_release_scale")
    parser.add_argument("--src", help="the startup part's training code (a src/ folder: another checkout's, to "
                        "measure it before a change)")
    args = parser.parse_args()
    if args.src:
        CODE["PYTHONPATH"] = os.path.abspath(args.src)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    with loopback_s3_server() as endpoint:
        if "startup" in parts:
            startup(args, work, endpoint)
        if "eval" in parts:
            eval_and_predict(args, work, endpoint)
        if "frames" in parts:
            frames(args, work)
        if "resume" in parts:
            resume(args, work, endpoint)


if __name__ == "__main__":
    main()

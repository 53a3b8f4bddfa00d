"""The cost of the local plan in `yt8m download`: N one-byte files from a loopback mirror (tests/loopback_mirror.py),
timed, with the bytes the download process wrote (/proc/self/io's wchar: files, plan, its log, requests). The cost
of the files themselves is linear in N; what grows faster is the plan's bookkeeping.

Run on demand: `.venv/bin/python bench/bench_download_plan.py --files 5000,20000`; PYTHONPATH=<another checkout>/src
measures that checkout's yt8m. Prints one JSON line per N.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from loopback_mirror import PARTITION, Mirror  # noqa: E402

# Runs `yt8m download` and prints the bytes this process wrote, last, on stderr.
_MEASURED = ("import sys; from yt8m import cli; status = cli.main(sys.argv[1:]); "
             "io = dict(line.split(': ') for line in open('/proc/self/io').read().splitlines()); "
             "print(io['wchar'], file=sys.stderr); sys.exit(status)")


def measure(count: int, parallel: int) -> dict:
    mirror = Mirror({f"part{index:06d}_.bin": bytes([index % 256]) for index in range(count)})
    try:
        with tempfile.TemporaryDirectory(prefix="yt8m-bench-plan-") as output_dir:
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", _MEASURED, "download", "--partition", PARTITION,
                                   "--base_url", mirror.url, "--output_dir", output_dir, "--parallel", str(parallel)],
                                  capture_output=True, text=True)
            seconds = time.perf_counter() - started
    finally:
        mirror.close()
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return {"files": count, "parallel": parallel, "seconds": round(seconds, 2), "plan_bytes": len(mirror.plan),
            "written_mb": round(int(done.stderr.split()[-1]) / 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="5000", help="Comma-separated plan sizes.")
    parser.add_argument("--parallel", type=int, default=4)
    args = parser.parse_args()
    for count in map(int, args.files.split(",")):
        print(json.dumps(measure(count, args.parallel)), flush=True)


if __name__ == "__main__":
    main()

"""`yt8m download`: fetch a YouTube-8M partition (or 1/N of it) by the dataset's download protocol, resumable and
verified by MD5; prints one JSON summary line (with --dry_run, the files and their total size instead)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Sequence

from yt8m.config import FlagParser
from yt8m.data.making.download import MIRRORS, RetryPolicy, Source, download, dry_run, parse_shard
from yt8m.io import storage


def _parser() -> FlagParser:
    parser = FlagParser(prog="yt8m download", description=" ".join(__doc__.split()),
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--partition", required=True,
                        help="VERSION/KIND/SPLIT as the official downloader takes it, e.g. 2/video/train, "
                             "2/frame/validate, 3/frame/test.")
    parser.add_argument("--mirror", choices=MIRRORS, default="us", help="The official mirror the files come from.")
    parser.add_argument("--shard", default="1,1",
                        help="I,N: download the I-th of N deterministic parts (the official downloader's rule).")
    parser.add_argument("--output_dir", default=".",
                        help="Folder for the files and the plan's local copy (which tracks what is left).")
    parser.add_argument("--base_url", default=None,
                        help="A private mirror serving <base_url>/<version>/download_plans/<kind>_<split>.json and "
                             "<base_url>/<partition>/<file> (no mirror prefix). Default: http://data.yt8m.org.")
    parser.add_argument("--parallel", type=int, default=4, help="Files downloaded at a time.")
    parser.add_argument("--retries", type=int, default=5,
                        help="Retries of a file after a connection reset, a timeout, HTTP 5xx or an MD5 mismatch.")
    parser.add_argument("--backoff_secs", type=float, default=1.0,
                        help="Wait before the first retry, doubled for each next one (at most 60 s).")
    parser.add_argument("--timeout_secs", type=float, default=60.0, help="Socket timeout of each request.")
    parser.add_argument("--min_bytes_per_sec", type=float, default=1024.0,
                        help="A request (plan or file) that receives fewer bytes a second than this over a "
                             "--timeout_secs window, headers included, is cut off as timed out and retried: a "
                             "server trickling a byte at a time never trips the socket timeout. 0: no minimum.")
    parser.add_argument("--dry_run", action="store_true",
                        help="List the files and their total size (the plan's sizes, else HEAD requests); "
                             "download nothing, write nothing.")
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    if args.parallel < 1 or args.retries < 0 or args.backoff_secs < 0 or args.timeout_secs <= 0 or \
            not args.min_bytes_per_sec >= 0:
        raise ValueError("--parallel must be >= 1, --retries, --backoff_secs and --min_bytes_per_sec >= 0, "
                         "--timeout_secs > 0")
    if not storage.is_local(args.output_dir):
        raise ValueError(f"--output_dir {args.output_dir}: download into a local folder (then copy it to object "
                         "storage)")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    source = Source(args.partition, args.mirror, args.base_url)
    shard = parse_shard(args.shard)
    policy = RetryPolicy(args.retries, args.backoff_secs, args.timeout_secs, args.min_bytes_per_sec)
    if args.dry_run:
        print(json.dumps(dry_run(source, args.output_dir, shard, args.parallel, policy)))
        return 0
    result = download(source, args.output_dir, shard, args.parallel, policy)
    print(json.dumps(result.summary), flush=True)
    error = result.error()
    if error is not None:
        raise error
    return 0

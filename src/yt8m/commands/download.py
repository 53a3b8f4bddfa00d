"""`yt8m download`: fetch a YouTube-8M partition (or 1/N of it) by the dataset's download protocol, resumable and
verified by MD5; prints one JSON summary line (with --dry_run, the files and their total size instead)."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from typing import Sequence

from yt8m.commands.command_line import read_command
from yt8m.data.making.download import MIRRORS, RetryPolicy, Source, download, dry_run, parse_shard
from yt8m.fields import problem_of, setting
from yt8m.io import storage


@dataclass(frozen=True)
class DownloadConfig:
    """What `yt8m download` fetches, from where, into which folder, and how it retries."""

    partition: str = setting("", "VERSION/KIND/SPLIT as the official downloader takes it, e.g. 2/video/train, "
                                 "2/frame/validate, 3/frame/test.", required=True)
    mirror: str = setting("us", "The official mirror the files come from.", choices=lambda: MIRRORS)
    shard: str = setting("1,1", "I,N: download the I-th of N deterministic parts (the official downloader's rule).")
    output_dir: str = setting(".", "Folder for the files and the plan's local copy (which tracks what is left).")
    base_url: str = setting("", "A private mirror serving <base_url>/<version>/download_plans/<kind>_<split>.json and "
                                "<base_url>/<partition>/<file> (no mirror prefix); default: http://data.yt8m.org.")
    parallel: int = setting(4, "Files downloaded at a time.", at_least=1)
    retries: int = setting(5, "Retries of a file after a connection reset, a timeout, HTTP 5xx or an MD5 mismatch.",
                           at_least=0)
    backoff_secs: float = setting(1.0, "Wait before the first retry, doubled for each next one (at most 60 s).",
                                  at_least=0)
    timeout_secs: float = setting(60.0, "Socket timeout of each request.", above=0)
    min_bytes_per_sec: float = setting(1024.0, "A request (plan or file) that receives fewer bytes a second than "
                                               "this over a --timeout_secs window, headers included, is cut off as "
                                               "timed out and retried: a server trickling a byte at a time never "
                                               "trips the socket timeout. 0: no minimum.", at_least=0)
    dry_run: bool = setting(False, "List the files and their total size (the plan's sizes, else HEAD requests); "
                                   "download nothing, write nothing.")

    def problems(self) -> list[str]:
        problems = [problem for check in (self.source, lambda: parse_shard(self.shard))
                    if (problem := problem_of(check)) is not None]
        if not storage.is_local(self.output_dir):
            problems.append(f"--output_dir {self.output_dir}: download into a local folder (then copy it to object "
                            "storage)")
        return problems

    def source(self) -> Source:
        return Source(self.partition, self.mirror, self.base_url or None)


def main(argv: Sequence[str]) -> int:
    config = read_command(DownloadConfig, argv, "yt8m download", __doc__)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    shard = parse_shard(config.shard)
    policy = RetryPolicy(config.retries, config.backoff_secs, config.timeout_secs, config.min_bytes_per_sec)
    if config.dry_run:
        print(json.dumps(dry_run(config.source(), config.output_dir, shard, config.parallel, policy)))
        return 0
    result = download(config.source(), config.output_dir, shard, config.parallel, policy)
    print(json.dumps(result.summary), flush=True)
    error = result.error()
    if error is not None:
        raise error
    return 0

"""`yt8m eval` (the starter kit's eval.py flags): a train dir's newest checkpoint evaluated once (`--run_once`), or
each new checkpoint as it comes until the run's final one; one JSON line of metrics each. Under torchrun
(`torchrun --nproc_per_node N -m yt8m eval ...`) the processes split the shards and rank 0 prints the merged metrics."""

from __future__ import annotations

import json
import logging
from typing import Sequence

from yt8m.commands.command_line import command_parser, given_values
from yt8m.distributed.ranks import env_rank, exit_without_teardown, launched_by_torchrun
from yt8m.eval.config import EvalConfig
from yt8m.eval.evaluate import evaluate_run
from yt8m.runtime import setup_logging


def main(argv: Sequence[str]) -> int:
    parser = command_parser("yt8m eval", __doc__, EvalConfig)
    values, source = given_values(EvalConfig, parser.parse_args(argv))
    setup_logging(logging.INFO if env_rank() == 0 else logging.WARNING)
    for result in evaluate_run(values, source):
        if env_rank() == 0:
            print(json.dumps(result), flush=True)
    if launched_by_torchrun():
        exit_without_teardown(0)
    return 0

"""`yt8m eval` (the starter kit's eval.py flags): a train dir's newest checkpoint evaluated once (`--run_once`), or
each new checkpoint as it comes until the run's final one; one JSON line of metrics each. Under torchrun
(`torchrun --nproc_per_node N -m yt8m eval ...`) the processes split the shards and rank 0 prints the merged metrics."""

from __future__ import annotations

import json
import logging
from typing import Sequence

from yt8m.config import EvalConfig, FlagParser, add_config_arguments, add_config_file_argument, parse_config
from yt8m.distributed.ranks import env_rank, exit_without_teardown, launched_by_torchrun
from yt8m.eval.evaluate import evaluate_checkpoints
from yt8m.models.registry import hparam_fields
from yt8m.runtime import setup_logging


def main(argv: Sequence[str]) -> int:
    parser = FlagParser(prog="yt8m eval", description=__doc__.splitlines()[0])
    add_config_file_argument(parser)
    hparams = hparam_fields()
    add_config_arguments(parser, EvalConfig, extra=hparams)
    config, given = parse_config(EvalConfig, parser.parse_args(argv), check_values=False,
                                 extra_names=[field.name for field, _ in hparams])
    setup_logging(logging.INFO if env_rank() == 0 else logging.WARNING)
    for result in evaluate_checkpoints(config, given):
        if env_rank() == 0:
            print(json.dumps(result), flush=True)
    if launched_by_torchrun():
        exit_without_teardown(0)
    return 0

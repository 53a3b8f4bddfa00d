"""`yt8m ensemble INPUT...`: the weighted average of train dirs', ONNX exports' and prediction files' probabilities.

Written as `yt8m predict` writes (the same output flags); the weights given (--weights) or fitted for GAP on labelled
shards (--fit_weights_on). Prints one JSON summary line."""

from __future__ import annotations

import json
from typing import Sequence

from yt8m.commands.command_line import command_parser, parse_config
from yt8m.inference.config import EnsembleConfig
from yt8m.inference.ensemble import run_ensemble
from yt8m.runtime import setup_logging


def main(argv: Sequence[str]) -> int:
    parser = command_parser("yt8m ensemble", __doc__, EnsembleConfig)
    config, given = parse_config(EnsembleConfig, parser.parse_args(argv))
    setup_logging()
    print(json.dumps(run_ensemble(config, num_classes_given="num_classes" in given)), flush=True)
    return 0

"""`yt8m ensemble INPUT...`: the weighted average of train dirs', ONNX exports' and prediction files' probabilities.

Written as `yt8m predict` writes (the same output flags); the weights given (--weights) or fitted for GAP on labelled
shards (--fit_weights_on). Prints one JSON summary line."""

from __future__ import annotations

import json
from typing import Sequence

from yt8m.config import FlagParser, add_config_arguments, add_config_file_argument, parse_config
from yt8m.inference.config import EnsembleConfig
from yt8m.inference.ensemble import run_ensemble
from yt8m.runtime import setup_logging


def main(argv: Sequence[str]) -> int:
    parser = FlagParser(prog="yt8m ensemble", description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="*", metavar="INPUT", help="The inputs (or --inputs A,B,...).")
    add_config_file_argument(parser)
    add_config_arguments(parser, EnsembleConfig)
    args = parser.parse_args(argv)
    if args.sources:
        if hasattr(args, "inputs"):
            parser.error("give the inputs as arguments or as --inputs, not both")
        args.inputs = args.sources
    config, given = parse_config(EnsembleConfig, args)
    setup_logging()
    print(json.dumps(run_ensemble(config, num_classes_given="num_classes" in given)), flush=True)
    return 0

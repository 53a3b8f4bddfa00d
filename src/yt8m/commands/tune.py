"""`yt8m tune --config tune.yaml`: run (or resume) a study in J trial processes until it has --n_trials
finished trials or --timeout passes, then write the report, best.yaml and plots, and print one JSON line on stdout.
"""

from __future__ import annotations

import json
import signal
from typing import Sequence

from yt8m.config import FlagParser, add_config_arguments
from yt8m.runtime import setup_logging
from yt8m.tuning.limits import RunFlags
from yt8m.tuning.report import print_leaderboard
from yt8m.tuning.runner import EXIT_INTERRUPTED, interrupt_once, raise_failures, tune_from_file
from yt8m.tuning.space import TuneSettings


def main(argv: Sequence[str]) -> int:
    parser = FlagParser(prog="yt8m tune", description=__doc__)
    parser.add_argument("--config", required=True, metavar="TUNE.yaml",
                        help="Tuning file with train:, search:, objective: and optional tune: sections.")
    add_config_arguments(parser, TuneSettings)
    add_config_arguments(parser, RunFlags)
    args = parser.parse_args(argv)
    setup_logging()
    signal.signal(signal.SIGTERM, interrupt_once)
    values = {name: value for name, value in vars(args).items() if name != "config"}
    study, spec, summary = tune_from_file(args.config, values)
    if not summary["interrupted"]:  # after Ctrl+C, the one line the runner logged says all
        print_leaderboard(study, spec)
    print(json.dumps(summary), flush=True)
    if summary["interrupted"]:
        return EXIT_INTERRUPTED
    raise_failures(summary)
    return 0

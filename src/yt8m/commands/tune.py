"""`yt8m tune --config tune.yaml`: run (or resume) a study in J trial processes until it has --n_trials
finished trials, then write the report, best.yaml and plots, and print one JSON line on stdout.
"""

from __future__ import annotations

import json
import signal
from typing import Sequence

from yt8m.config import FlagParser, add_config_arguments, field_names
from yt8m.runtime import setup_logging
from yt8m.tune.report import print_leaderboard
from yt8m.tune.runner import EXIT_INTERRUPTED, interrupt_once, run_tune
from yt8m.tune.space import TuneSettings, load_tune_spec


def main(argv: Sequence[str]) -> int:
    parser = FlagParser(prog="yt8m tune", description=__doc__)
    parser.add_argument("--config", required=True, metavar="TUNE.yaml",
                        help="Tuning file with train:, search:, objective: and optional tune: sections.")
    add_config_arguments(parser, TuneSettings)
    args = parser.parse_args(argv)
    setup_logging()
    overrides = {name: value for name, value in vars(args).items() if name in field_names(TuneSettings)}
    signal.signal(signal.SIGTERM, interrupt_once)
    spec = load_tune_spec(args.config, overrides)
    study, summary = run_tune(spec)
    print_leaderboard(study, spec)
    print(json.dumps(summary), flush=True)
    if summary["interrupted"]:
        return EXIT_INTERRUPTED
    if summary["failed_jobs"]:
        raise ChildProcessError(f"{', '.join(summary['failed_jobs'])} died; the other jobs carried on, and a dead "
                                "job's trial is re-queued as interrupted: run the same command again to finish the "
                                "study")
    return 0 if summary["best_value"] is not None else 1

"""`yt8m tune --config tune.yaml`: run (or resume) a study in J trial processes until it has --n_trials
finished trials or --timeout passes, then write the report, best.yaml and plots, and print one JSON line on stdout.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Sequence

from yt8m.config import FlagParser, add_config_arguments, config_from_dict, flag_names
from yt8m.runtime import setup_logging
from yt8m.tune.limits import RunFlags
from yt8m.tune.report import LEADERBOARD_TXT, print_leaderboard
from yt8m.tune.runner import EXIT_INTERRUPTED, interrupt_once, run_tune, with_data_patterns
from yt8m.tune.space import TuneSettings, load_tune_spec
from yt8m.tune.study import describe_counts


def main(argv: Sequence[str]) -> int:
    parser = FlagParser(prog="yt8m tune", description=__doc__)
    parser.add_argument("--config", required=True, metavar="TUNE.yaml",
                        help="Tuning file with train:, search:, objective: and optional tune: sections.")
    add_config_arguments(parser, TuneSettings)
    add_config_arguments(parser, RunFlags)
    args = parser.parse_args(argv)
    setup_logging()
    overrides = {name: value for name, value in vars(args).items() if name in flag_names(TuneSettings)}
    flags = config_from_dict(RunFlags, {name: value for name, value in vars(args).items()
                                        if name in flag_names(RunFlags)}, source="flags")
    signal.signal(signal.SIGTERM, interrupt_once)
    spec = with_data_patterns(load_tune_spec(args.config, overrides), flags.train_data_pattern,
                              flags.eval_data_pattern)
    study, summary = run_tune(spec, flags.trial_timeout)
    if not summary["interrupted"]:  # after Ctrl+C, the one line the runner logged says all
        print_leaderboard(study, spec)
    print(json.dumps(summary), flush=True)
    if summary["interrupted"]:
        return EXIT_INTERRUPTED
    if summary["failed_jobs"]:
        raise ChildProcessError(f"{', '.join(summary['failed_jobs'])} died; the other jobs carried on, and a dead "
                                "job's trial is re-queued as interrupted: run the same command again to finish the "
                                "study")
    if summary["best_value"] is None:
        raise ValueError(f"no trial completed ({describe_counts(summary['n_trials'])}): the reasons are in "
                         f"{os.path.join(summary['study_dir'], LEADERBOARD_TXT)}")
    return 0

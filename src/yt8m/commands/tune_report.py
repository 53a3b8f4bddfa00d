"""`yt8m tune-report STUDY_DIR`: the leaderboard, best.yaml and plots of a tuning study, rewritten from its database;
`--retrain_best` trains the best config again, `--ensemble_top K` ensembles the best K trials, `--refit_top K` trains
the best K again on the labelled shards. Prints the leaderboard to stderr and one JSON line to stdout; `--report
FILE.html` writes the study's page (leaderboard, best so far, what the pruner saw, importances, the best trial's
evaluation, and FILE_best_trial.html: that trial's `yt8m eval --report`)."""

from __future__ import annotations

import json
from typing import Sequence

from yt8m.commands.command_line import read_command
from yt8m.runtime import setup_logging
from yt8m.tuning.reporting import TuneReportConfig, run_tune_report


def main(argv: Sequence[str]) -> int:
    config = read_command(TuneReportConfig, argv, "yt8m tune-report", __doc__)
    setup_logging()
    print(json.dumps(run_tune_report(config)), flush=True)
    return 0

"""`yt8m tune --config tune.yaml`: run (or resume) a study in J trial processes until it has --n_trials
finished trials or --timeout passes, then write the report, best.yaml and plots, and print one JSON line on stdout.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Sequence

from yt8m.commands.command_line import command_parser
from yt8m.runtime import setup_logging
from yt8m.tuning.limits import RunFlags
from yt8m.tuning.report import print_leaderboard
from yt8m.tuning.runner import EXIT_INTERRUPTED, raise_failures, tune_from_file
from yt8m.tuning.space import PruningSettings, SamplingSettings, StudySettings

TUNING_FILE_HELP = ("Tuning file with train:, search:, objective: and optional tune: sections; the flags below "
                    "replace its tune: settings.")


@dataclass(frozen=True)
class TuneFlags:
    """`yt8m tune`'s flags: the tuning file's `tune:` settings, and the data every trial reads."""

    study: StudySettings = dataclasses.field(default_factory=StudySettings)
    sampling: SamplingSettings = dataclasses.field(default_factory=SamplingSettings)
    pruning: PruningSettings = dataclasses.field(default_factory=PruningSettings)
    data: RunFlags = dataclasses.field(default_factory=RunFlags)


def main(argv: Sequence[str]) -> int:
    parser = command_parser("yt8m tune", __doc__, TuneFlags, config_help=TUNING_FILE_HELP, config_required=True,
                            config_metavar="TUNE.yaml")
    args = parser.parse_args(argv)
    setup_logging()
    values = {name: value for name, value in vars(args).items() if name != "config"}
    study, spec, summary = tune_from_file(args.config, values)
    if not summary["interrupted"]:  # after Ctrl+C, the one line the runner logged says all
        print_leaderboard(study, spec)
    print(json.dumps(summary), flush=True)
    if summary["interrupted"]:
        return EXIT_INTERRUPTED
    raise_failures(summary)
    return 0

"""`yt8m tune-report STUDY_DIR`: the leaderboard, best.yaml and plots of a tuning study, rewritten from its
database; `--retrain_best` trains the best config again, `--ensemble_top K` ensembles the best K trials. Prints the
leaderboard to stderr and one JSON line to stdout; `--report FILE.html` writes the best trial's evaluation report
(as `yt8m eval --report`)."""

from __future__ import annotations

import json
import os
from typing import Sequence

from yt8m.config import FlagParser
from yt8m.optional import require
from yt8m.runtime import setup_logging
from yt8m.tuning.objective import MODEL_PARAM
from yt8m.tuning.refit import print_refit, refit_and_crossfit
from yt8m.tuning.report import (
    ensemble_of_best,
    print_ensemble,
    print_leaderboard,
    report_best,
    retrain_best,
    write_report,
)
from yt8m.tuning.space import load_tune_spec
from yt8m.tuning.study import STUDY_FILE, load_existing_study


def main(argv: Sequence[str]) -> int:
    parser = FlagParser(prog="yt8m tune-report", description=__doc__.splitlines()[0])
    parser.add_argument("study_dir", help="The --study_dir of a `yt8m tune` run.")
    parser.add_argument("--storage", default="", help="Storage URL, when the study is not in DIR/study.db "
                                                      "(the one saved in DIR/tune.yaml, password hidden, otherwise).")
    parser.add_argument("--retrain_best", action="store_true",
                        help="Train the best config again into DIR/best (resumes there if interrupted).")
    parser.add_argument("--train_on_validate", action="store_true",
                        help="With --retrain_best: train on the training and validation shards, into "
                             "DIR/best_train_validate (no validation score then).")
    parser.add_argument("--ensemble_top", type=int, default=None, metavar="K",
                        help="Ensemble the best K complete trials (weights fitted for GAP on the validation shards) "
                             "and report its validation metrics next to the best single trial's.")
    parser.add_argument("--refit_top", type=int, default=None, metavar="K",
                        help="Train the best K configurations again on the training and validation shards (less "
                             "--holdout) to their best epochs, into DIR/refit/, and print the command that predicts "
                             "with their ensemble (weights fitted on the trials' validation, or out of fold).")
    parser.add_argument("--crossfit_folds", type=int, default=0, metavar="F",
                        help="With --refit_top: also train each configuration F times, one fold of the labelled "
                             "shards held out each time (DIR/crossfit/), and fit the ensemble's weights on the "
                             "out-of-fold predictions; the fold models or the refits, whichever scores better on "
                             "--holdout, are the ensemble.")
    parser.add_argument("--holdout", default="", metavar="PATTERN",
                        help="With --refit_top: labelled shards of the study kept out of training and weight "
                             "fitting, to score the ensembles on (their figures are then unbiased).")
    parser.add_argument("--diverse", action="store_true",
                        help="With --ensemble_top or --refit_top: take the best trial of each searched model first, "
                             "then the next best (members that differ gain an ensemble more than near-copies).")
    parser.add_argument("--report", default="", metavar="FILE.html",
                        help="Write the best complete trial's evaluation report to this HTML file, as `yt8m eval "
                             "--report` writes it: its checkpoint that validated best, evaluated again on the study's "
                             "validation shards (needs the plots extra).")
    args = parser.parse_args(argv)
    if args.ensemble_top is not None and args.ensemble_top < 1:
        parser.error(f"--ensemble_top must be at least 1, got {args.ensemble_top}")
    if args.train_on_validate and not args.retrain_best:
        parser.error("--train_on_validate goes with --retrain_best")
    if args.refit_top is not None and args.refit_top < 1:
        parser.error(f"--refit_top must be at least 1, got {args.refit_top}")
    if (args.crossfit_folds or args.holdout) and args.refit_top is None:
        parser.error("--crossfit_folds and --holdout go with --refit_top")
    if args.diverse and args.ensemble_top is None and args.refit_top is None:
        parser.error("--diverse goes with --ensemble_top or --refit_top")
    if args.crossfit_folds and args.crossfit_folds < 2:
        parser.error(f"--crossfit_folds must be at least 2, got {args.crossfit_folds}")
    if args.report:
        require("plots", "--report")  # before the study is read or anything evaluated
    setup_logging()
    spec_path = os.path.join(args.study_dir, STUDY_FILE)
    if not os.path.exists(spec_path):
        raise ValueError(f"{args.study_dir} is not a study dir of `yt8m tune` (no {STUDY_FILE})")
    overrides = {"study_dir": args.study_dir, **({"storage": args.storage} if args.storage else {})}
    spec = load_tune_spec(spec_path, overrides)
    if "***" in spec.settings.study.storage:
        raise ValueError(f"{spec_path} holds the storage URL with its password hidden; pass --storage URL")
    if args.diverse and all(param.name != MODEL_PARAM for param in spec.search):
        raise ValueError(f"--diverse takes the best trial of each searched model, and {spec_path} does not search "
                         f"`{MODEL_PARAM}`")
    study = load_existing_study(spec.settings.study)
    summary = write_report(study, spec)
    print_leaderboard(study, spec)
    if args.ensemble_top is not None:
        summary["ensemble"] = ensemble_of_best(spec, study, args.ensemble_top, args.diverse)
        print_ensemble(summary["ensemble"])
    if args.retrain_best:
        summary["retrain"] = retrain_best(spec, study, args.train_on_validate)
    if args.refit_top is not None:
        summary["refit"] = refit_and_crossfit(spec, study, args.refit_top, args.crossfit_folds, args.holdout,
                                             args.diverse)
        print_refit(summary["refit"])
    if args.report:
        summary["report"] = report_best(spec, study, args.report)
    print(json.dumps(summary), flush=True)
    return 0

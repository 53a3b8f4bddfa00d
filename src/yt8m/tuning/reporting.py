"""What `yt8m tune-report` makes of a study (TuneReportConfig), and the making: its leaderboard, best.yaml and plots
rewritten from its database, and what the flags ask of its best trials; the command and the Python API run this."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

import optuna

from yt8m.fields import setting
from yt8m.optional import require
from yt8m.tuning.objective import MODEL_PARAM
from yt8m.tuning.refit import print_refit, refit_and_crossfit
from yt8m.tuning.report import (
    ensemble_of_best,
    print_ensemble,
    print_leaderboard,
    retrain_best,
    write_report,
)
from yt8m.tuning.space import TuneSpec, load_tune_spec
from yt8m.tuning.study import STUDY_FILE, load_existing_study
from yt8m.tuning.study_page import write_study_page


@dataclass(frozen=True)
class TuneReportConfig:
    """Which study `yt8m tune-report` reads, and what it makes of its best trials."""

    study_dir: str = setting("", "The --study_dir of a `yt8m tune` run.", required=True, positional=True)
    storage: str = setting("", "Storage URL, when the study is not in DIR/study.db (the one saved in DIR/tune.yaml, "
                               "password hidden, otherwise).")
    retrain_best: bool = setting(False, "Train the best config again into DIR/best (resumes there if interrupted).")
    train_on_validate: bool = setting(False, "With --retrain_best: train on the training and validation shards, into "
                                             "DIR/best_train_validate (no validation score then).")
    ensemble_top: Optional[int] = setting(None, "Ensemble the best K complete trials (weights fitted for the study's "
                                                "objective metric, in its direction, on the validation shards) and "
                                                "report its validation metrics next to the best single trial's.",
                                          at_least=1)
    refit_top: Optional[int] = setting(None, "Train the best K configurations again on the training and validation "
                                             "shards (less --holdout) to their best epochs, into DIR/refit/, and "
                                             "print the command that predicts with their ensemble (weights fitted "
                                             "on the trials' validation, or out of fold).", at_least=1)
    crossfit_folds: int = setting(0, "With --refit_top: also train each configuration F times, one fold of the "
                                     "labelled shards held out each time (DIR/crossfit/), and fit the ensemble's "
                                     "weights on the out-of-fold predictions; the fold models or the refits, whichever "
                                     "scores better on --holdout, are the ensemble (0: none; else at least 2).",
                                  at_least=0)
    holdout: str = setting("", "With --refit_top: labelled shards of the study kept out of training and weight "
                               "fitting, to score the ensembles on (their figures are then unbiased).")
    diverse: bool = setting(False, "With --ensemble_top or --refit_top: take the best trial of each searched model "
                                   "first, then the next best (members that differ gain an ensemble more than "
                                   "near-copies).")
    report: str = setting("", "Write the study's page to this HTML file (needs the plots extra; self-contained, "
                              "nothing fetched from the network): the best trial against the baseline, the "
                              "leaderboard, the best value so far by trial and by time, each trial's validations as "
                              "the pruner saw them, the hyper-parameters' importances (from 10 complete trials), "
                              "and the best trial's evaluation: its checkpoint that validated best, evaluated again "
                              "on the study's validation shards, its whole `yt8m eval --report` beside the page "
                              "(FILE_best_trial.html).")
    vocabulary_file: str = setting("", "With --report: the label vocabulary CSV that names the classes in the best "
                                       "trial's evaluation (default: the one its config names, if any).")

    def problems(self) -> list[str]:
        rules = [(self.train_on_validate and not self.retrain_best, "--train_on_validate goes with --retrain_best"),
                 (bool(self.crossfit_folds or self.holdout) and self.refit_top is None,
                  "--crossfit_folds and --holdout go with --refit_top"),
                 (self.diverse and self.ensemble_top is None and self.refit_top is None,
                  "--diverse goes with --ensemble_top or --refit_top"),
                 (self.crossfit_folds == 1, "--crossfit_folds must be 0 or at least 2, got 1"),
                 (bool(self.vocabulary_file) and not self.report, "--vocabulary_file goes with --report")]
        return [problem for broken, problem in rules if broken]


def run_tune_report(config: TuneReportConfig, show_leaderboard: bool = True) -> dict[str, Any]:
    """Rewrite the study's report (and, `show_leaderboard`, print its leaderboard to stderr), then do what the
    config asks of its best trials; returns the summary `yt8m tune-report` prints."""
    if config.report:
        require("plots", "--report")  # before the study is read or anything evaluated
    spec = study_spec(config)
    study = load_existing_study(spec.settings.study)
    summary = write_report(study, spec)
    if show_leaderboard:
        print_leaderboard(study, spec)
    summary.update(best_trials_work(config, spec, study))
    return summary


def study_spec(config: TuneReportConfig) -> TuneSpec:
    """The tuning file the study ran with (its study dir's copy), with --storage where given."""
    spec_path = os.path.join(config.study_dir, STUDY_FILE)
    if not os.path.exists(spec_path):
        raise ValueError(f"{config.study_dir} is not a study dir of `yt8m tune` (no {STUDY_FILE})")
    overrides = {"study_dir": config.study_dir, **({"storage": config.storage} if config.storage else {})}
    spec = load_tune_spec(spec_path, overrides)
    if "***" in spec.settings.study.storage:
        raise ValueError(f"{spec_path} holds the storage URL with its password hidden; pass --storage URL")
    if config.diverse and all(param.name != MODEL_PARAM for param in spec.search):
        raise ValueError(f"--diverse takes the best trial of each searched model, and {spec_path} does not search "
                         f"`{MODEL_PARAM}`")
    return spec


def best_trials_work(config: TuneReportConfig, spec: TuneSpec, study: optuna.Study) -> dict[str, Any]:
    """What the flags ask of the best trials: their ensemble, the best retrained, refits, the report page."""
    done: dict[str, Any] = {}
    if config.ensemble_top is not None:
        done["ensemble"] = ensemble_of_best(spec, study, config.ensemble_top, config.diverse)
        print_ensemble(done["ensemble"])
    if config.retrain_best:
        done["retrain"] = retrain_best(spec, study, config.train_on_validate)
    if config.refit_top is not None:
        done["refit"] = refit_and_crossfit(spec, study, config.refit_top, config.crossfit_folds, config.holdout,
                                          config.diverse)
        print_refit(done["refit"])
    if config.report:
        done["report"] = write_study_page(spec, study, config.report, config.vocabulary_file)
    return done

"""Refit and cross-fit (`yt8m tune-report STUDY --refit_top K [--crossfit_folds F] [--holdout PATTERN]`): a study's
best K configurations trained again on every labelled video at their best epoch counts, and, cross-fitted, each
trained F times with one fold of the labelled shards held out. The folds' out-of-fold predictions fit the ensemble's
weights (and serve as distillation targets: `--teacher` takes them); the final ensemble, the fold models' or the
refits', is the one that scores better on the held-out shards, which neither trained a member nor fitted a weight.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import optuna
from optuna.trial import FrozenTrial

from yt8m.config import config_from_dict
from yt8m.data.format.tfrecord import expand_pattern
from yt8m.inference.config import PredictConfig
from yt8m.inference.ensemble import fit_ensemble, opened_inputs, scored_ensemble
from yt8m.inference.predict import run_predict
from yt8m.io.checkpoints import final_checkpoint
from yt8m.io.files import write_file_atomically
from yt8m.io.storage import open_file
from yt8m.training import train
from yt8m.tuning.objective import best_trials, trial_best_model
from yt8m.tuning.report import WITHOUT_VALIDATION, kept_best_models, retrain_length, study_fit_objective
from yt8m.tuning.space import TuneSpec

log = logging.getLogger("yt8m.tune")

REFIT_DIR = "refit"
CROSSFIT_DIR = "crossfit"
PREDICT_SCRIPT = "predict.sh"  # in DIR/refit/
OOF_TOP_K = 100  # classes per video in the out-of-fold prediction files: ensemble.ADVISED_FILE_TOP_K


@dataclass(frozen=True)
class RefitPlan:
    """What is trained: the best trials, the labelled shards they train on (the study's training and validation
    shards less the held-out ones), those split into folds (by shard, round robin), the held-out shards, and the
    shards the ensemble's weights are fitted on (without folds: the study's validation shards less the held-out)."""

    trials: list[FrozenTrial]
    labelled: list[str]
    folds: list[list[str]]
    holdout: list[str]
    weight_shards: list[str]

    @property
    def models(self) -> int:
        return len(self.trials) * (len(self.folds) + 1)


def plan_refit(spec: TuneSpec, study: optuna.Study, top: int, folds: int, holdout: str,
               diverse: bool = False) -> RefitPlan:
    """The plan, or a ValueError saying why it cannot be made (too few trials, shards, or held-out shards among
    them). `diverse` takes the best trial of each model first."""
    best = best_trials(study, top, diverse)
    if len(best) < top:
        raise ValueError(f"--refit_top {top}: the study has {len(best)} complete trials")
    every = expand_pattern(f"{spec.train.data.train_data_pattern},{spec.eval_data_pattern}")
    held = expand_pattern(holdout) if holdout else []
    outside = sorted(set(held) - set(every))
    if outside:
        raise ValueError(f"--holdout {holdout}: {outside[0]} is not one of the study's labelled shards (held-out "
                         "shards are taken out of its training and validation shards)")
    labelled = [path for path in dict.fromkeys(every) if path not in held]
    if folds and len(labelled) < folds:
        raise ValueError(f"--crossfit_folds {folds}: {len(labelled)} labelled shards cannot make {folds} folds (a "
                         "fold is whole shards)")
    split = [labelled[index::folds] for index in range(folds)] if folds else []
    # Without folds the weights are fitted on the trials' own validation predictions: only on shards not held out,
    # so that the held-out score stays free of the weights' fit.
    weight_shards = labelled if folds else [path for path in expand_pattern(spec.eval_data_pattern)
                                            if path not in held]
    if not weight_shards:
        raise ValueError(f"--holdout {holdout}: it holds out every validation shard, so none is left to fit the "
                         "ensemble's weights on (hold out fewer, or add --crossfit_folds)")
    if not folds:  # the weights are fitted on the trials' own models: found before hours of refits, not after
        kept_best_models(spec, best, f"--refit_top {top}", "; refit fewer, or add --crossfit_folds")
    return RefitPlan(best, labelled, split, held, weight_shards)


def refit_and_crossfit(spec: TuneSpec, study: optuna.Study, top: int, folds: int = 0, holdout: str = "",
                       diverse: bool = False) -> dict[str, Any]:
    """Train the plan's models (resuming any already there), fit the ensemble weights (on the out-of-fold
    predictions; without folds, on the trials' own validation), score the candidates on the held-out shards and
    return the summary, with the command that predicts with the chosen ensemble."""
    objective = study_fit_objective(spec, f"--refit_top {top}")
    plan = plan_refit(spec, study, top, folds, holdout, diverse)
    root = os.path.abspath(spec.settings.study.study_dir)
    progress = Progress(plan.models)
    refits = [_train(spec, trial, plan.labelled, os.path.join(root, REFIT_DIR, f"trial-{trial.number}"), progress)
              for trial in plan.trials]
    num_classes = spec.trial_config(plan.trials[0].params, refits[0]).features.num_classes
    summary: dict[str, Any] = {"trials": [trial.number for trial in plan.trials], "refits": refits,
                               "labelled_shards": len(plan.labelled), "holdout": holdout,
                               "objective": objective.metric}
    if plan.folds:
        fold_dirs, oof_files = _crossfit(spec, plan, root, progress)
        summary.update(fold_dirs=fold_dirs, out_of_fold=oof_files)
        members = oof_files
    else:
        fold_dirs, members = [], [trial_best_model(spec.settings.study.study_dir, trial)
                                        for trial in plan.trials]
    with opened_inputs(members, num_classes) as inputs:
        fitted = fit_ensemble(inputs, ",".join(plan.weight_shards), num_classes, objective=objective)
    weights = fitted["weights"]
    summary.update(weights=weights, weights_fitted_on="out-of-fold predictions of the labelled shards" if plan.folds
                   else f"the trials' validation ({len(plan.weight_shards)} shards, none held out)",
                   fit=fitted["ensemble"], fit_videos=fitted["videos"])
    candidates = {"refits": (refits, weights)}
    if fold_dirs:
        candidates["folds"] = ([run for runs in fold_dirs for run in runs],
                               [weight / len(plan.folds) for weight in weights for _ in plan.folds])
    summary["chosen"] = "refits"
    if plan.holdout:
        held = ",".join(plan.holdout)
        summary["holdout_scores"] = {name: _score(runs, run_weights, held, num_classes, objective.metric)
                                     for name, (runs, run_weights) in candidates.items()}
        summary["holdout_scores"]["best_single_refit"] = _score(refits[:1], [1.0], held, num_classes,
                                                                objective.metric)
        summary["chosen"] = max(candidates, key=lambda name: objective.signed(
            summary["holdout_scores"][name][objective.metric]))
    runs, run_weights = candidates[summary["chosen"]]
    summary["predict"] = _ensemble_command(runs, run_weights, "TEST_PATTERN", "predictions.csv")
    summary["predict_script"] = _write_predict_script(os.path.join(root, REFIT_DIR, PREDICT_SCRIPT), runs,
                                                      run_weights)
    summary["seconds"] = round(progress.elapsed(), 1)
    return summary


def _crossfit(spec: TuneSpec, plan: RefitPlan, root: str, progress: "Progress") -> tuple[list[list[str]], list[str]]:
    """Each trial's fold models, and its out-of-fold predictions over every labelled shard (one JSONL file)."""
    fold_dirs, oof_files = [], []
    for trial in plan.trials:
        folder = os.path.join(root, CROSSFIT_DIR, f"trial-{trial.number}")
        runs, pieces = [], []
        for index, held in enumerate(plan.folds):
            training = [path for path in plan.labelled if path not in held]
            run = _train(spec, trial, training, os.path.join(folder, f"fold-{index}"), progress)
            pieces.append(_predict(run, held, os.path.join(folder, f"fold-{index}.jsonl")))
            runs.append(run)
        fold_dirs.append(runs)
        oof_files.append(_concatenated(pieces, os.path.join(folder, "out_of_fold.jsonl")))
    return fold_dirs, oof_files


def _train(spec: TuneSpec, trial: FrozenTrial, shards: Sequence[str], train_dir: str, progress: "Progress") -> str:
    """The trial's configuration trained on `shards` to its best epoch, in `train_dir` (resumed there)."""
    config = spec.trial_config(trial.params, train_dir, **{**retrain_length(spec, trial), **WITHOUT_VALIDATION,
                               "train_data_pattern": ",".join(shards), "start_new_model": False})
    log.info("refit %d/%d: trial %d on %d shards into %s", progress.done + 1, progress.total, trial.number,
             len(shards), train_dir)
    finished_before = final_checkpoint(train_dir) is not None
    started = time.perf_counter()
    train(config)
    progress.one_done(time.perf_counter() - started, trained=not finished_before)
    return train_dir


def _predict(run: str, shards: Sequence[str], output: str) -> str:
    config = config_from_dict(PredictConfig, {"train_dir": run, "input_data_pattern": ",".join(shards),
                                              "output_file": output, "output_format": "jsonl",
                                              "top_k": OOF_TOP_K}, source="crossfit")
    run_predict(config)
    return output


def _concatenated(pieces: Sequence[str], output: str) -> str:
    """The folds' prediction files as one (their videos are disjoint: each fold holds other shards)."""
    def write(out: Any) -> None:
        for piece in pieces:
            with open_file(piece, "r") as lines:
                for line in lines:
                    out.write(line)

    write_file_atomically(output, write)
    return output


def _ensemble_command(runs: Sequence[str], weights: Sequence[float], pattern: str, output: str) -> str:
    return (f"yt8m ensemble {' '.join(map(shlex.quote, runs))} --weights {','.join(f'{w:g}' for w in weights)} "
            f"--input_data_pattern {pattern} --output_file {output}")


def _write_predict_script(path: str, runs: Sequence[str], weights: Sequence[float]) -> str:
    """`sh PATH TEST_PATTERN [OUTPUT_FILE]` predicts with the chosen ensemble (a CSV unless OUTPUT ends .jsonl)."""
    command = _ensemble_command(runs, weights, '"${1:?usage: sh predict.sh TEST_PATTERN [OUTPUT_FILE]}"',
                                '"${2:-predictions.csv}"')
    write_file_atomically(path, lambda out: out.write(
        f"#!/bin/sh\n# The ensemble chosen by `yt8m tune-report --refit_top`: predict TEST_PATTERN's videos.\n"
        f"exec {command}\n"))
    return path


def _score(runs: Sequence[str], weights: Sequence[float], pattern: str, num_classes: int,
           objective: str) -> dict[str, Any]:
    with opened_inputs(runs, num_classes) as inputs:
        return scored_ensemble(inputs, weights, pattern, num_classes, objective=objective)


def print_refit(summary: dict[str, Any]) -> None:
    """The held-out scores (where there are) and the predict command, to stderr."""
    metric = summary["objective"]
    for name, scores in summary.get("holdout_scores", {}).items():
        own = "" if metric in ("gap", "map", "hit_at_one", "perr") else f" {metric} {scores[metric]:.5f}"
        print(f"held out ({summary['holdout']}): {name} gap {scores['gap']:.5f} map {scores['map']:.5f} hit@1 "
              f"{scores['hit_at_one']:.5f} perr {scores['perr']:.5f}{own}", file=sys.stderr)
    print(f"the ensemble ({summary['chosen']}, on the study's objective {metric}; weights fitted for it on "
          f"{summary['weights_fitted_on']}); predict with it: "
          f"{summary['predict']}", file=sys.stderr)


class Progress:
    """Models done of the plan's total, and the time left at the mean time of the models trained by this run: one
    an earlier run finished is only resumed, in seconds, and says nothing of the time the others take."""

    def __init__(self, total: int):
        self.total, self.done, self.started = total, 0, time.perf_counter()
        self.trained, self.training_seconds = 0, 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def one_done(self, seconds: float, trained: bool) -> None:
        self.done += 1
        self.trained += trained
        self.training_seconds += seconds if trained else 0.0
        resumed = self.done - self.trained
        found = f" ({resumed} found finished by an earlier run)" if resumed else ""
        left = (f"about {self.training_seconds / self.trained * (self.total - self.done):.0f} s left" if self.trained
                else "the time left is known once one trains")
        log.info("refit: %d/%d models done in %.0f s%s, %s", self.done, self.total, self.elapsed(), found, left)

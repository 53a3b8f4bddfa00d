"""The study report: leaderboard (text and CSV), best.yaml ready for `yt8m train --config`, and PNG plots; training
the best config again (`yt8m tune-report --retrain_best`), and the best trial's evaluation report (`--report`)."""

from __future__ import annotations

import csv
import json
import logging
import os
import sys
from typing import Any, Optional, Sequence, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState

from yt8m.config import load_config, save_config, with_values
from yt8m.data.reading.dataset import YT8MDataset
from yt8m.eval.evaluate import evaluate_latest, evaluate_model, resolve_eval_config
from yt8m.eval.figures import png_bytes, pyplot
from yt8m.inference.ensemble import FitObjective, fit_ensemble, opened_inputs
from yt8m.io.checkpoints import checkpoint_dir, load_latest_checkpoint
from yt8m.io.files import write_file_atomically
from yt8m.models.checkpoints import build_model_from_payload
from yt8m.optional import available
from yt8m.tasks.metrics import metric_meaning
from yt8m.tasks.video import features_task
from yt8m.training import TrainConfig, train
from yt8m.tuning.objective import (
    BEST_EPOCH_ATTR,
    BEST_STEP_ATTR,
    DUPLICATE_OF_ATTR,
    EPOCHS_ATTR,
    EXAMPLES_ATTR,
    STOPPED_ATTR,
    best_trials,
    trial_best_model,
    trial_train_dir,
    trial_value,
)
from yt8m.tuning.space import TuneSpec
from yt8m.tuning.study import (
    FAIL_REASON_ATTR,
    RETRY_OF_ATTR,
    FileLock,
    describe_counts,
    interrupted_trials,
    state_counts,
)
from yt8m.tuning.study_figures import Skipped, study_figures

log = logging.getLogger("yt8m.tune")

BEST_CONFIG = "best.yaml"
LEADERBOARD_CSV = "leaderboard.csv"
LEADERBOARD_TXT = "leaderboard.txt"
# Held while the leaderboard and best.yaml are written, by whichever process of this machine finished a trial.
REPORT_LOCK = ".report.lock"
STATE_ORDER = {"COMPLETE": 0, "PRUNED": 1, "FAIL": 2, "INTERRUPTED": 3, "RUNNING": 4, "WAITING": 5}


def leaderboard(study: optuna.Study) -> list[dict[str, Any]]:
    """One row per trial, best first: complete trials by value, then pruned (by their last report), then the rest."""
    interrupted = interrupted_trials(study)
    rows = [_row(trial, interrupted.get(trial.number)) for trial in study.get_trials(deepcopy=False)]
    sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0

    def rank(row: dict[str, Any]) -> tuple:
        value = _score(row)
        return STATE_ORDER[row["state"]], sign * value if value is not None else 0.0, row["trial"]

    return sorted(rows, key=rank)


def _row(trial: FrozenTrial, interruption: Optional[str]) -> dict[str, Any]:
    reports = trial.intermediate_values
    state = "INTERRUPTED" if interruption else trial.state.name
    reason = interruption or trial.user_attrs.get(FAIL_REASON_ATTR, "")
    if trial.state == TrialState.PRUNED and reports and not reason:
        reason = f"pruned after report step {max(reports)}"
    elif trial.state == TrialState.WAITING:
        retry_of = trial.user_attrs.get(RETRY_OF_ATTR)
        rerun = f": re-runs the parameters of interrupted trial {retry_of}" if retry_of is not None else ""
        reason = "queued" + rerun
    stopped = trial.user_attrs.get(STOPPED_ATTR)
    if DUPLICATE_OF_ATTR in trial.user_attrs:
        stopped = f"the configuration of trial {trial.user_attrs[DUPLICATE_OF_ATTR]}: its value, not trained again"
    return {"trial": trial.number, "state": state, "value": trial.value,
            "last_report": reports[max(reports)] if reports else None, "params": trial.params,
            "duration_s": round(trial.duration.total_seconds(), 1) if trial.duration else None,
            "epochs": trial.user_attrs.get(EPOCHS_ATTR), "best_epoch": trial.user_attrs.get(BEST_EPOCH_ATTR),
            "examples": trial.user_attrs.get(EXAMPLES_ATTR), "note": reason or stopped or ""}


def leaderboard_header(metric: str) -> list[str]:
    return ["trial", "state", metric, "best_epoch", "epochs", "duration_s", "params", "note"]


def leaderboard_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The leaderboard's rows as text, in leaderboard_header's columns (the text table's and the study page's)."""
    return [[str(row["trial"]), row["state"], _number(_score(row), "{:.5f}"), _number(row["best_epoch"], "{}"),
             _number(row["epochs"], "{}"), _number(row["duration_s"], "{:.1f}"), _params(row["params"]), row["note"]]
            for row in rows]


def format_leaderboard(rows: list[dict[str, Any]], metric: str) -> str:
    header = leaderboard_header(metric)
    table = leaderboard_cells(rows)
    widths = [max(len(line[i]) for line in [header] + table) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1]
             for line in [header] + table]
    return "\n".join(line.rstrip() for line in lines)


def _score(row: dict[str, Any]) -> Optional[float]:
    """The final value, or for a pruned trial the last value it reported."""
    return row["value"] if row["value"] is not None else row["last_report"]


def _number(value: Any, form: str) -> str:
    return "-" if value is None else form.format(value)


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
                    for name, value in params.items())


def best_trial(study: optuna.Study) -> Optional[FrozenTrial]:
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return study.best_trial if complete else None


def best_train_config(spec: TuneSpec, trial: FrozenTrial) -> TrainConfig:
    """The best trial's config, training into <study_dir>/best (resuming there if interrupted) as long as the trial
    trained to its best validation."""
    return spec.trial_config(trial.params, os.path.join(os.path.abspath(spec.settings.study.study_dir), "best"),
                             start_new_model=False, **retrain_length(spec, trial))


# A retrain without validation shards (on training + validation shards, a refit, a fold) trains to the trial's best
# epoch: what acts on validations (early stopping, learning-rate halving) is off, as there are none.
WITHOUT_VALIDATION = {"eval_data_pattern": "", "checkpoint_every_epoch": False, "early_stopping_patience": 0,
                      "lr_halving_patience": 0, "revert_to_best": False}


def retrain_length(spec: TuneSpec, trial: FrozenTrial) -> dict[str, Any]:
    """How long a retrain of the trial trains: to the epoch its value was validated at (num_epochs), or to the step
    where trials report by steps or by examples (max_steps: the examples it had seen at the same batch size);
    nothing for a trial without one recorded."""
    if BEST_STEP_ATTR not in trial.user_attrs:
        return {}
    pruning = spec.settings.pruning
    # A trial validated before its first epoch ended (a --max_steps within one) is retrained to that step too.
    if pruning.report_every_steps or pruning.resource == "examples" or not trial.user_attrs[BEST_EPOCH_ATTR]:
        return {"max_steps": trial.user_attrs[BEST_STEP_ATTR]}
    return {"num_epochs": trial.user_attrs[BEST_EPOCH_ATTR]}


def baseline_trial(study: optuna.Study, spec: TuneSpec) -> Optional[FrozenTrial]:
    """The first complete trial of `tune.enqueue`'s first settings: the baseline the search is to beat."""
    if not spec.enqueue:
        return None
    settings = spec.enqueue[0]
    return next((trial for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if all(trial.params.get(name) == value for name, value in settings.items())), None)


def write_report(study: optuna.Study, spec: TuneSpec) -> dict[str, Any]:
    """Write leaderboard, best.yaml and plots into the study dir; return the summary printed as JSON."""
    study_dir = spec.settings.study.study_dir
    best = write_leaderboard_and_best(study, spec)
    plots = save_plots(study, study_dir, spec.metric)
    best_path = os.path.abspath(os.path.join(study_dir, BEST_CONFIG))
    baseline = baseline_trial(study, spec)
    return {"best_value": best.value if best else None, "best_params": best.params if best else None,
            "best_trial": best.number if best else None, "metric": spec.metric, "n_trials": state_counts(study),
            "baseline_trial": baseline.number if baseline else None,
            "baseline_value": baseline.value if baseline else None,
            "study_dir": os.path.abspath(study_dir), "best_config": best_path if best else None, "plots": plots}


def explain_best(best_value: float, baseline_value: float, baseline_name: str, study: optuna.Study,
                 metric: str) -> str:
    """What a person should make of the best tuned result beside a baseline's: a gain, nothing found yet (too few
    trials), or a difference of the size run-to-run noise makes."""
    sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
    gain = sign * (best_value - baseline_value)
    complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    difference = best_value - baseline_value
    head = f"{metric} {best_value:.4f} against {baseline_value:.4f} for {baseline_name} ({difference:+.4f})"
    if gain > 0:
        return (f"{head}: better. A gain of a few thousandths can be run-to-run noise (seeds, data order): "
                "`yt8m tune-report STUDY --retrain_best` trains the best settings again to check it holds.")
    return (f"{head}: the search has not beaten it yet. {complete} complete trial(s) are too few (TPE samples at "
            "random until it has a model of the results), and the same settings differ by about this much between "
            "runs (noise): run more trials (a larger --n_trials resumes the study) before trusting either.")


def write_leaderboard_and_best(study: optuna.Study, spec: TuneSpec) -> Optional[FrozenTrial]:
    """Rewrite the leaderboard and best.yaml from the study's trials as they are now; returns the best trial.

    Every job calls it when it finishes a trial, so best.yaml names the best so far even while trials run or
    after a kill. The trials are read under a lock, so that a job that read them earlier cannot write last.
    """
    study_dir = spec.settings.study.study_dir
    with FileLock(os.path.join(study_dir, REPORT_LOCK)).held():
        rows = leaderboard(study)
        best = best_trial(study)
        write_file_atomically(os.path.join(study_dir, LEADERBOARD_TXT),
                              lambda out: out.write(format_leaderboard(rows, spec.metric) + "\n"))
        write_file_atomically(os.path.join(study_dir, LEADERBOARD_CSV), lambda out: _write_csv(rows, out))
        best_path = os.path.join(study_dir, BEST_CONFIG)
        if best is not None:
            save_config(best_train_config(spec, best), best_path)
        elif os.path.exists(best_path):
            os.remove(best_path)  # a stale best.yaml from another study in this dir would mislead
    return best


def _write_csv(rows: list[dict[str, Any]], out: TextIO) -> None:
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["trial"])
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "params": json.dumps(row["params"])})


def save_plots(study: optuna.Study, study_dir: str, metric: str) -> dict[str, str]:
    """The study's figures (study_figures) as PNGs in the study dir, each by name its path or "skipped: why"; none
    without the plots extra (said once)."""
    if not available("plots", "the study's plots are not drawn"):
        return {}
    plt = pyplot()
    results = {}
    for name, figure in study_figures(plt, study, metric).items():
        if isinstance(figure, Skipped):
            results[name] = f"skipped: {figure.why}"
            continue
        path = os.path.join(study_dir, f"{name}.png")
        _write_bytes(path, png_bytes(plt, figure))
        results[name] = os.path.abspath(path)
    return results


def _write_bytes(path: str, data: bytes) -> None:
    # write_file_atomically opens a text file; the bytes go to the binary file beneath it.
    write_file_atomically(path, lambda out: out.buffer.write(data))


def print_leaderboard(study: optuna.Study, spec: TuneSpec) -> None:
    """The leaderboard, what its metric means, the best trial and how it compares with the baseline, to stderr
    (stdout carries the command's one JSON line)."""
    plain_metric = spec.metric.rpartition("/")[2]
    lines = [f"study '{spec.settings.study.study_name}' ({spec.direction} validation {spec.metric}): "
             f"{describe_counts(state_counts(study))}",
             f"{spec.metric}: {metric_meaning(plain_metric)}",
             format_leaderboard(leaderboard(study), spec.metric)]
    best = best_trial(study)
    if best is not None:
        lines.append(f"best: trial {best.number}, {spec.metric} {best.value:.5f}; train it with: "
                     f"yt8m train --config {os.path.join(spec.settings.study.study_dir, BEST_CONFIG)}")
        baseline = baseline_trial(study, spec)
        if baseline is not None:
            name = f"the baseline, trial {baseline.number} (tune.enqueue's first settings)"
            lines.append(explain_best(trial_value(best), trial_value(baseline), name, study, spec.metric))
    print("\n".join(lines), file=sys.stderr)


def retrain_best(spec: TuneSpec, study: optuna.Study, train_on_validate: bool) -> dict[str, Any]:
    """Train best.yaml again; on train+validate data into best_train_validate, else scored on validation."""
    best = best_trial(study)
    if best is None:
        raise ValueError(f"study '{spec.settings.study.study_name}' has no complete trial to retrain")
    config = load_config(TrainConfig, os.path.join(spec.settings.study.study_dir, BEST_CONFIG))
    if train_on_validate:
        config = with_values(  # no held-out data is left to evaluate on
            config, train_data_pattern=f"{config.data.train_data_pattern},{spec.eval_data_pattern}",
            train_dir=os.path.join(os.path.abspath(spec.settings.study.study_dir), "best_train_validate"),
            **WITHOUT_VALIDATION)
    train_dir = config.checkpoints.train_dir
    log.info("retraining trial %d's config in %s", best.number, train_dir)
    result: dict[str, Any] = {"train_dir": train_dir, **train(config)}
    if not train_on_validate:
        result["validation"] = evaluate_train_dir(train_dir, spec.eval_data_pattern, config)
    return result


def evaluate_train_dir(train_dir: str, pattern: str, config: TrainConfig) -> dict[str, Any]:
    """Metrics of a train dir's latest checkpoint on `pattern`, read and scored as `config` trained it."""
    found = load_latest_checkpoint(train_dir)
    if found is None:
        raise FileNotFoundError(f"no checkpoint in {train_dir}/checkpoints: the retrained run wrote none")
    path, checkpoint = found
    trained = build_model_from_payload(checkpoint, path)
    batches = YT8MDataset(pattern, trained.features, config.schedule.batch_size)
    return evaluate_model(trained.network, batches, features_task(trained.features, config.loss,
                                                                  top_n=config.validation.top_n))


def report_best(spec: TuneSpec, study: optuna.Study, path: str, vocabulary_file: str = "") -> dict[str, Any]:
    """`yt8m eval --report` of the best complete trial: its model at the checkpoint its value was validated at
    (trial_best_model), evaluated on the study's validation shards, read and scored as its train dir says (nothing
    written there), the HTML report written to `path`, its classes named by `vocabulary_file` where given."""
    best = best_trial(study)
    if best is None:
        raise ValueError(f"--report: study '{spec.settings.study.study_name}' has no complete trial to report on")
    (model,) = kept_best_models(spec, [best], "--report")
    config = resolve_eval_config({"train_dir": model, "eval_data_pattern": spec.eval_data_pattern, "run_once": True,
                                  "report": path, "vocabulary_file": vocabulary_file}, "tune-report --report")
    log.info("evaluating the best trial, %d, for the report %s", best.number, path)
    return {"trial": best.number, "train_dir": model, **evaluate_latest(config)}


def kept_best_models(spec: TuneSpec, trials: Sequence[FrozenTrial], flag: str, advice: str = "") -> list[str]:
    """The trials' best models (trial_best_model), or a ValueError naming the first whose checkpoints and exports
    `keep_best` removed."""
    study_dir = spec.settings.study.study_dir
    for trial in trials:
        train_dir = trial_train_dir(study_dir, trial)
        if not os.path.isdir(checkpoint_dir(train_dir)):
            raise ValueError(f"{flag}: trial {trial.number} kept no checkpoints in {train_dir} (tune.keep_best is "
                             f"{spec.settings.study.keep_best}: only the best trials keep theirs{advice})")
    return [trial_best_model(study_dir, trial) for trial in trials]


def study_fit_objective(spec: TuneSpec, flag: str) -> FitObjective:
    """The study's objective as an ensemble's weights are fitted for it: its metric (with tasks, TASK/METRIC's
    METRIC, of the first task's predictions) and its direction; a ValueError naming `flag` where it cannot be."""
    objective = FitObjective(spec.metric.rpartition("/")[2], spec.direction == "maximize")
    problem = objective.problem()
    if problem:
        raise ValueError(f"{flag}: the study's objective is {spec.metric}, but {problem}")
    return objective


def ensemble_of_best(spec: TuneSpec, study: optuna.Study, count: int, diverse: bool = False) -> dict[str, Any]:
    """The ensemble of the best `count` complete trials (the best of each model first where `diverse`; each its
    model at the checkpoint its value was validated at), its weights fitted for the study's objective on its
    validation shards, and its validation metrics next to the best single trial's (measured alike)."""
    objective = study_fit_objective(spec, f"--ensemble_top {count}")
    best = best_trials(study, count, diverse)
    if len(best) < count:
        raise ValueError(f"--ensemble_top {count}: study '{spec.settings.study.study_name}' has {len(best)} "
                         "complete trials of distinct configurations")
    models = kept_best_models(spec, best, f"--ensemble_top {count}")
    num_classes = spec.trial_config(best[0].params, models[0]).features.num_classes
    with opened_inputs(models, num_classes) as inputs:
        fitted = fit_ensemble(inputs, spec.eval_data_pattern, num_classes, objective=objective)
    single, ensemble, metric = fitted["inputs"][0], fitted["ensemble"], objective.metric
    return {"trials": [trial.number for trial in best], "train_dirs": models, "weights": fitted["weights"],
            "weights_fitted_on": spec.eval_data_pattern, "videos": fitted["videos"], **ensemble,
            "objective": {"metric": metric, "direction": spec.direction, "ensemble": ensemble[metric],
                          "equal_weights": fitted["equal_weights_objective"], "best_single": single[metric],
                          "gain": round(objective.signed(ensemble[metric] - single[metric]), 6)},
            "equal_weights_gap": fitted["equal_weights_gap"],
            "best_single": {"trial": best[0].number, **{k: v for k, v in single.items() if k != "input"}},
            "gap_gain": round(ensemble["gap"] - single["gap"], 6), "num_classes": num_classes}


def print_ensemble(ensemble: dict[str, Any]) -> None:
    """The ensemble's line beside the best single trial's on the study's objective, and the command that predicts
    with it, to stderr."""
    objective, single = ensemble["objective"], ensemble["best_single"]
    weights = ",".join(f"{weight:g}" for weight in ensemble["weights"])
    others = "" if objective["metric"] == "gap" else f"; gap {ensemble['gap']:.5f} against {single['gap']:.5f}"
    print(f"ensemble of trials {','.join(map(str, ensemble['trials']))} (weights {weights}, fitted for the study's "
          f"objective, {objective['metric']} ({objective['direction']}), on the validation shards): validation "
          f"{objective['metric']} {objective['ensemble']:.5f} (equal weights {objective['equal_weights']:.5f}); "
          f"best single trial {single['trial']}: {objective['best_single']:.5f} ({objective['gain']:+.5f} better)"
          f"{others}", file=sys.stderr)
    print(f"predict with it: yt8m ensemble {' '.join(ensemble['train_dirs'])} --weights {weights} --num_classes "
          f"{ensemble['num_classes']} --input_data_pattern TEST_PATTERN --output_file predictions.csv", file=sys.stderr)

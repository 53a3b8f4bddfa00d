"""A study's figures, drawn in the evaluation report's style (yt8m.eval.figures): the best value so far against the
trials and against time, each trial's validations as the pruner saw them, and the hyper-parameters' importances. A
figure with too few points to show anything is not drawn: its place holds why (`Skipped`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Union

import optuna
from optuna.trial import FrozenTrial, TrialState

from yt8m.eval.figures import whole_numbers

# fANOVA's importances from fewer complete trials than this are noise, not a ranking of the hyper-parameters.
IMPORTANCE_TRIALS = 10
# Trials a legend names one by one; beyond, one colour per trial would repeat (matplotlib's cycle has ten).
LEGEND_TRIALS = 10


@dataclass(frozen=True)
class Skipped:
    """A figure left out, and why (a sentence the page and the JSON show)."""

    why: str


Drawn = Union[Any, Skipped]  # a matplotlib figure, or why there is none


def study_figures(plt: Any, study: optuna.Study, metric: str) -> dict[str, Drawn]:
    """Each figure of the study by name: "best_so_far", "intermediate_values", "param_importances"."""
    drawers: dict[str, Callable[[Any, optuna.Study, str], Drawn]] = {
        "best_so_far": best_so_far, "intermediate_values": intermediate_values,
        "param_importances": param_importances}
    return {name: draw(plt, study, metric) for name, draw in drawers.items()}


def _complete(study: optuna.Study) -> list[FrozenTrial]:
    return sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda trial: trial.number)


def best_so_far(plt: Any, study: optuna.Study, metric: str) -> Drawn:
    """Each complete trial's value and the best so far, against the trial number and against the study's time."""
    complete = _complete(study)
    if len(complete) < 2:
        return Skipped(f"{len(complete)} complete trial: a best-so-far line needs two at least")
    better = max if study.direction == optuna.study.StudyDirection.MAXIMIZE else min
    values = [float(trial.value or 0.0) for trial in complete]  # a complete trial has its value
    best = [better(values[:index + 1]) for index in range(len(values))]
    start = min(trial.datetime_start for trial in study.get_trials(deepcopy=False) if trial.datetime_start)
    seconds = [((trial.datetime_complete or start) - start).total_seconds() for trial in complete]
    unit, per = ("minutes", 60.0) if max(seconds) >= 120 else ("seconds", 1.0)
    figure, (by_trial, by_time) = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for axes, xs, label in ((by_trial, [trial.number for trial in complete], "trial"),
                            (by_time, [value / per for value in seconds], f"{unit} since the study started")):
        axes.plot(xs, values, "o", color="tab:blue", alpha=0.6, label=f"a trial's {metric}")
        axes.step(xs, best, where="post", color="tab:red", label="best so far")
        axes.set(xlabel=label)
    whole_numbers(by_trial.xaxis)
    by_trial.set(ylabel=f"validation {metric}", title="Best so far, by trial")
    by_time.set(title="Best so far, by time")
    by_trial.legend(loc="best")
    return figure


def intermediate_values(plt: Any, study: optuna.Study, metric: str) -> Drawn:
    """Every trial's reports (the validation metric at each epoch, --report_every_steps or rung): what the pruner
    judged; pruned trials grey, where they stopped marked."""
    reported = [trial for trial in study.get_trials(deepcopy=False) if trial.intermediate_values]
    if not any(len(trial.intermediate_values) >= 2 for trial in reported):
        return Skipped("no trial reported twice: there are no curves to compare (a trial reports at each validation)")
    figure, axes = plt.subplots(figsize=(8, 4))
    # Up to LEGEND_TRIALS curves, each its colour and a legend; more, coloured along the trial number, a colour bar.
    kept = [trial for trial in reported if trial.state != TrialState.PRUNED]
    last = max((trial.number for trial in kept), default=0) or 1
    shades = plt.get_cmap("viridis") if len(kept) > LEGEND_TRIALS else None
    for trial in sorted(reported, key=lambda trial: trial.number):
        steps = sorted(trial.intermediate_values)
        points = [trial.intermediate_values[step] for step in steps]
        if trial.state == TrialState.PRUNED:
            axes.plot(steps, points, color="#b0b0b0", linestyle="--", marker="x")
        else:
            colour = {"color": shades(trial.number / last)} if shades else {}
            axes.plot(steps, points, marker="o", alpha=0.85, label=f"trial {trial.number}", **colour)
    whole_numbers(axes.xaxis)
    axes.set(xlabel="report step (epoch; step with --report_every_steps; examples with --resource examples)",
             ylabel=f"validation {metric}",
             title="What the pruner saw (grey dashed: pruned)")
    if shades:
        bar = figure.colorbar(plt.cm.ScalarMappable(cmap=shades, norm=plt.Normalize(0, last)), ax=axes)
        bar.set_label("trial")
    elif kept:
        axes.legend(loc="best", ncol=2)
    return figure


def param_importances(plt: Any, study: optuna.Study, metric: str) -> Drawn:
    """Each searched hyper-parameter's share of the value's variance (Optuna's fANOVA), where enough trials are
    complete for it to mean something."""
    complete = _complete(study)
    if len(complete) < IMPORTANCE_TRIALS:
        return Skipped(f"importances need {IMPORTANCE_TRIALS} complete trials at least, the study has "
                       f"{len(complete)}: from fewer, they rank noise")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importances = optuna.importance.get_param_importances(study)  # its complete trials
    except (ValueError, RuntimeError) as err:
        return Skipped(f"importances cannot be computed: {err}")
    if len(importances) < 2:
        return Skipped("one hyper-parameter varies across the trials: nothing to rank")
    names = list(importances)[::-1]
    figure, axes = plt.subplots(figsize=(7, 0.35 * len(names) + 1.5))
    axes.barh(names, [importances[name] for name in names], color="tab:blue")
    axes.set(xlabel=f"share of the variance of {metric} (fANOVA)", title="Hyper-parameter importances")
    return figure

"""A study's page (`yt8m tune-report STUDY --report FILE.html`): one self-contained HTML file in the evaluation
report's style. The answer first (the best trial against the baseline, the trial counts, the command that trains it
again), then the best trial's evaluation (its summary; the whole report in a file beside the page), the leaderboard,
the best value so far against the trials and against time, what the pruner saw, and the hyper-parameters' importances
where enough trials are complete; a figure with too few points is left out with a line saying why."""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

import optuna
import yaml

from yt8m.eval.figures import pyplot
from yt8m.eval.report import escaped, figure_html, headline_html, html_page, note_html
from yt8m.io.files import write_file_atomically
from yt8m.tasks.metrics import metric_meaning
from yt8m.tuning.report import (
    BEST_CONFIG,
    baseline_trial,
    best_trial,
    explain_best,
    leaderboard,
    leaderboard_cells,
    leaderboard_header,
    report_best,
)
from yt8m.tuning.space import TuneSpec
from yt8m.tuning.study import STUDY_FILE, describe_counts, state_counts
from yt8m.tuning.study_figures import Skipped, study_figures

log = logging.getLogger("yt8m.tune")

SECTIONS = {"best_so_far": "Best so far", "intermediate_values": "What the pruner saw",
            "param_importances": "Hyper-parameter importances"}


def write_study_page(spec: TuneSpec, study: optuna.Study, path: str, vocabulary_file: str = "") -> dict[str, Any]:
    """Evaluate the best trial (its report written beside `path`, as FILE_best_trial.html), then write the study's
    page to `path`; returns what the JSON line says of both."""
    evaluation_path = f"{os.path.splitext(path)[0]}_best_trial.html"
    evaluation = report_best(spec, study, evaluation_path, vocabulary_file)
    page = study_html(spec, study, evaluation, os.path.basename(evaluation_path))
    write_file_atomically(path, lambda out: out.write(page))
    log.info("wrote the study's page to %s (%d KB), the best trial's evaluation report to %s", path,
             len(page.encode()) // 1024, evaluation_path)
    return {"file": path, "best_trial_report": evaluation_path, **evaluation}


def study_html(spec: TuneSpec, study: optuna.Study, evaluation: dict[str, Any], evaluation_file: str) -> str:
    """The whole page; `evaluation` is the best trial's (report_best's), its report in `evaluation_file` beside it."""
    plt = pyplot()
    name = spec.settings.study.study_name
    figures = study_figures(plt, study, spec.metric)
    body = [f"<h1>Tuning study: {escaped(name)}</h1>", _answer(spec, study),
            f"<h2>The best trial's evaluation: trial {evaluation['trial']}</h2>",
            headline_html(evaluation, None, evaluation.get("report", {}).get("warnings", {}).items()),
            note_html(f'Its checkpoint that validated best, evaluated again on the study\'s validation shards. The '
                      f'whole report: <a href="{escaped(evaluation_file)}">{escaped(evaluation_file)}</a>.'),
            _leaderboard(spec, study)]
    for key, title in SECTIONS.items():
        figure = figures[key]
        body.append(f'<h2 id="{key}">{title}</h2>')
        body.append(note_html(f"Left out: {escaped(figure.why)}.", key=f"skipped-{key}")
                    if isinstance(figure, Skipped) else figure_html(plt, figure, title))
    body.append(_tuning_file(spec))
    return html_page(f"yt8m study: {name}", body)


def _answer(spec: TuneSpec, study: optuna.Study) -> str:
    """The best trial and what it is worth beside the baseline, the counts, and the commands that go on from it."""
    counts = describe_counts(state_counts(study))
    best = best_trial(study)
    plain = spec.metric.rpartition("/")[2]
    lines = [f"<p>{escaped(spec.direction.capitalize())} validation {escaped(spec.metric)} ("
             f"{escaped(metric_meaning(plain))}); trials: {escaped(counts)}.</p>"]
    if best is None:
        return "\n".join(lines)
    baseline = baseline_trial(study, spec)
    if baseline is not None and baseline.number == best.number:
        verdict = (f"No trial beat the untuned settings: the best, trial {best.number} ({spec.metric} "
                   f"{best.value:.4f}), is the baseline itself (tune.enqueue's first settings). "
                   f"{len(study.trials)} trials are too few a search: run more (a larger --n_trials resumes the "
                   "study).")
    elif baseline is None:
        verdict = (f"Best: trial {best.number}, {spec.metric} {best.value:.4f}. The study has no baseline to compare "
                   "it with (tune.enqueue's first settings: the untuned run's).")
    else:
        verdict = f"Best: trial {best.number}. " + explain_best(
            float(best.value or 0.0), float(baseline.value or 0.0),
            f"the baseline, trial {baseline.number} (tune.enqueue's first settings)", study, spec.metric)
    study_dir = os.path.abspath(spec.settings.study.study_dir)
    commands = "\n".join([f"yt8m train --config {os.path.join(study_dir, BEST_CONFIG)}    # the best settings again",
                          f"yt8m tune-report {study_dir} --retrain_best    # the same, checked on validation",
                          f"yt8m tune --config {os.path.join(study_dir, STUDY_FILE)} --n_trials "
                          f"{len(study.trials) + 10}    # more trials"])
    return "\n".join(lines + [f'<p class="verdict" id="answer" data-trial="{best.number}" data-value='
                              f'"{best.value!r}">{escaped(verdict)}</p>',
                              f"<p>From here (with the venv's yt8m):</p>\n<pre>{escaped(commands)}</pre>"])


def _leaderboard(spec: TuneSpec, study: optuna.Study) -> str:
    rows = leaderboard(study)
    best, baseline = best_trial(study), baseline_trial(study, spec)
    marks = {**({baseline.number: " (baseline)"} if baseline else {}), **({best.number: " (best)"} if best else {})}
    header = "".join(f"<th>{escaped(cell)}</th>" for cell in leaderboard_header(spec.metric))
    lines = [f'<tr data-trial="{row["trial"]}" data-state="{row["state"]}">'
             + "".join(f"<td>{escaped(cell)}{marks.get(row['trial'], '') if index == 0 else ''}</td>"
                       for index, cell in enumerate(cells)) + "</tr>"
             for row, cells in zip(rows, leaderboard_cells(rows))]
    return ("<h2>Leaderboard</h2>\n<p class=\"note\">Best first: complete trials by their value (their best "
            "validation), then pruned ones by their last report, then the rest.</p>\n<table id=\"leaderboard\">\n"
            f"<tr>{header}</tr>\n" + "\n".join(lines) + "\n</table>")


def _tuning_file(spec: TuneSpec) -> str:
    """The study's tuning file as it ran (its study dir's copy)."""
    path = os.path.join(spec.settings.study.study_dir, STUDY_FILE)
    shown: Optional[str] = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            shown = fh.read()
    text = shown if shown is not None else yaml.safe_dump(spec.document, sort_keys=False)
    return (f"<h2>The tuning file</h2>\n<details><summary>{escaped(path)}</summary>\n<pre>{escaped(text)}</pre>\n"
            "</details>")

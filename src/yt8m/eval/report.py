"""The evaluation report (`yt8m eval --report FILE.html`, `yt8m tune-report STUDY --report FILE.html`): one HTML
file that holds everything it shows (no network: no scripts, style sheets or fonts from elsewhere; its figures are
PNGs inside it as data: URIs), drawn with matplotlib (the plots extra).

It shows what was evaluated (train dir, checkpoint and step, model and hyper-parameters, features, data, date); the
metrics of eval's JSON line with what each means; AP against training frequency and by vertical (per_class.py's
table and figures); the classes of lowest AP and what the model takes them for (diagnostics.Confusions); how well its
probabilities are calibrated (diagnostics.Calibration); and the run's training and validation curves (curves.py).
Every number a test or a script may check is in a data-value attribute beside its text (data-metric, data-class,
data-confused), written as JSON writes it: the same float as the JSON line's.
"""

from __future__ import annotations

import base64
import datetime
import html
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import numpy as np
import yaml

from yt8m import __version__
from yt8m.config import config_document, config_values
from yt8m.eval.config import EvalConfig
from yt8m.eval.curves import Curve, run_curves
from yt8m.eval.diagnostics import Diagnostics
from yt8m.eval.per_class import MISSING_VERTICAL, ClassTable, ap_figures, png_bytes, pyplot
from yt8m.io import storage
from yt8m.io.checkpoints import CONFIG_FILE
from yt8m.io.files import write_file_atomically
from yt8m.tasks.metrics import metric_meaning

log = logging.getLogger("yt8m.eval")

WORST_CLASSES = 25  # classes of lowest AP listed
CONFUSED_SHOWN = 3  # classes each of them is most taken for
# What the JSON line holds beside the metrics: not rows of the metrics table.
NOT_METRICS = ("global_step", "per_class", "report", "skipped_files", "skipped_records")
OTHER_MEANINGS = {"num_videos": "videos: how many videos of the evaluation data were scored",
                  "skipped_files": "files skipped as corrupt (--skip_corrupt)",
                  "skipped_records": "records skipped as corrupt (--skip_corrupt)"}
# Validation metrics drawn against the steps (eval/), and training's batch metrics beside them where logged.
CURVE_METRICS = ("gap", "map", "hit_at_one", "perr")
# The sections of a run's stored config that say how it trained (yt8m.training's optimizer and schedule).
TRAINING_SECTIONS = ("optimizer", "schedule")

STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 70em; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { white-space: nowrap; } td { overflow-wrap: anywhere; }
td.number { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
img { max-width: 100%; height: auto; display: block; margin: 0.5em 0; }
.note { color: #555; font-size: 0.92em; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
ul.confused { margin: 0; padding-left: 1.1em; }
"""


@dataclass(frozen=True)
class EvaluationReport:
    """What the report of one checkpoint's evaluation is made of."""

    config: EvalConfig
    checkpoint: str  # the checkpoint file evaluated
    result: dict[str, Any]  # eval's JSON line: the step and the task's metrics
    table: ClassTable  # per_class.class_table of the evaluation
    per_class: dict[str, np.ndarray]  # each class's "ap" (float64) and "positives"
    diagnostics: Diagnostics


def write_report(path: str, report: EvaluationReport) -> dict[str, Any]:
    """Write the report's HTML to `path` (atomically); returns what the JSON line says of it."""
    page = report_html(report)
    write_file_atomically(path, lambda out: out.write(page))
    log.info("wrote the evaluation report of step %d to %s (%d KB)", report.result["global_step"], path,
             len(page.encode()) // 1024)
    return {"file": path, "expected_calibration_error": report.diagnostics.calibration.expected_calibration_error()}


def report_html(report: EvaluationReport) -> str:
    """The whole page: every figure drawn and embedded."""
    plt = pyplot()
    train_dir = report.config.checkpoints.train_dir
    step = report.result["global_step"]
    body = [f"<h1>Evaluation report: {_text(train_dir)}, step {_number_span('global_step', step)}</h1>",
            _identity(report), _metrics(report.result), _classes(plt, report), _worst(report),
            _calibration(plt, report.diagnostics), _curves(plt, train_dir, report.result)]
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>yt8m evaluation: {_text(os.path.basename(train_dir.rstrip('/')) or train_dir)} step {step}"
            f"</title>\n<style>{STYLE}</style>\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n")


def _text(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _value(value: Any) -> str:
    """A number as the JSON line writes it (the same float when read back)."""
    return _text(json.dumps(value))


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _number_span(name: str, value: Any) -> str:
    return f'<span data-metric="{_text(name)}" data-value="{_value(value)}">{_text(value)}</span>'


def _image(plt: Any, figure: Any, alt: str) -> str:
    data = base64.b64encode(png_bytes(plt, figure)).decode("ascii")
    return f'<img alt="{_text(alt)}" src="data:image/png;base64,{data}">'


def _rows(rows: Iterable[tuple[str, str]]) -> str:
    return "<table>\n" + "\n".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows) + "\n</table>"


def _identity(report: EvaluationReport) -> str:
    config = report.config
    model = config.model
    hparams = config_document(model.hparams) if model.hparams is not None else {}
    features = config_values(config.features)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    stored = _stored_config(config.checkpoints.train_dir)
    document = yaml.safe_load(stored) if stored else None
    trained = _training(document) if isinstance(document, dict) else []
    rows = [("train dir", _text(os.path.abspath(config.checkpoints.train_dir)
                                if storage.is_local(config.checkpoints.train_dir) else config.checkpoints.train_dir)),
            ("checkpoint", f"{_text(report.checkpoint)} (step {_text(report.result['global_step'])})"),
            ("model", _text(model.name) + (f", trunk {_text(model.trunk_hidden_sizes)}"
                                           if model.trunk_hidden_sizes else "")),
            ("hyper-parameters", _text(", ".join(f"{name}={value}" for name, value in hparams.items()) or "none")),
            ("loss", _text(config.loss.name)),
            *trained,
            ("features", _text(", ".join(f"{name}={_flat(value)}" for name, value in features.items()))),
            ("evaluation data", _text(config.data.eval_data_pattern)),
            ("GAP depth", f"top {config.report.top_k} predictions per video"),
            ("date", f"{_text(date)} (yt8m {__version__})")]
    shown = (f"<details><summary>The run's {CONFIG_FILE}</summary>\n<pre>{_text(stored)}</pre>\n</details>"
             if stored else "")
    return "<h2>What was evaluated</h2>\n" + _rows(rows) + shown


def _training(document: dict[str, Any]) -> list[tuple[str, str]]:
    """How the run trained, from its stored config's sections (nested, as runs store it): the optimizer and schedule
    settings given a value, and the training data."""
    settings = [f"{name}={_flat(value)}" for section in TRAINING_SECTIONS
                if isinstance(document.get(section), dict)
                for name, value in document[section].items() if value not in (None, "", [])]
    data = document.get("data")
    pattern = data.get("train_data_pattern") if isinstance(data, dict) else None
    return ([("training", _text(", ".join(settings)))] if settings else []) + (
        [("training data", _text(pattern))] if pattern else [])


def _flat(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _stored_config(train_dir: str) -> str:
    """The train dir's config.yaml as text ("" where it cannot be read)."""
    try:
        return storage.read_bytes(os.path.join(train_dir, CONFIG_FILE)).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _meaning(name: str) -> str:
    if name in OTHER_MEANINGS:
        return OTHER_MEANINGS[name]
    try:
        return metric_meaning(name)
    except (KeyError, ValueError):  # a metric of one's own that no longer loads here: its value still shows
        return f"{name}: a metric of one's own"


def _metrics(result: dict[str, Any]) -> str:
    rows = [f'<tr><th>{_text(name)}</th><td class="number" data-metric="{_text(name)}" data-value="{_value(value)}">'
            f"{_text(_shown(value))}</td><td>{_text(_meaning(name))}</td></tr>"
            for name, value in result.items() if name not in NOT_METRICS and isinstance(value, (int, float))]
    return ("<h2>Metrics</h2>\n<table>\n<tr><th>metric</th><th>value</th><th>what it says</th></tr>\n"
            + "\n".join(rows) + "\n</table>")


def _class_name(table: ClassTable, index: int) -> str:
    name = table.rows[index]["name"] if 0 <= index < len(table.rows) else ""
    return f"{index} {name}" if name else f"class {index}"


def _classes(plt: Any, report: EvaluationReport) -> str:
    scored = report.table.scored()
    head = (f"<h2>AP by class</h2>\n<p>{len(scored)} of {len(report.table.rows)} classes have positives on the "
            f"evaluation data (their mean AP is the mAP); training videos from {_text(report.table.train_videos_from)}."
            "</p>")
    if not scored:
        return head + "\n<p class=\"note\">No class has a positive: nothing to draw.</p>"
    figures = ap_figures(plt, scored)
    return "\n".join([head, _image(plt, figures["ap_vs_train_videos"], "AP against training frequency"),
                      _image(plt, figures["ap_by_vertical"], "AP by vertical")])


def _worst(report: EvaluationReport) -> str:
    ap, positives = report.per_class["ap"], report.per_class["positives"]
    scored = np.flatnonzero(positives > 0)
    # Lowest AP first; among equal APs (many 0s on small data), the classes with more positives (surer) first.
    worst = scored[np.lexsort((scored, -positives[scored], ap[scored]))][:WORST_CLASSES]
    confusions = report.diagnostics.confusions
    lines = []
    for index in map(int, worst):
        row = report.table.rows[index]
        confused = "".join(
            f'<li data-confused="{other}" data-count="{count}">{_text(_class_name(report.table, other))}: '
            f"{count} of {int(positives[index])} videos</li>"
            for other, count in confusions.most_confused(index, CONFUSED_SHOWN))
        lines.append(f'<tr data-class="{index}" data-ap="{_value(float(ap[index]))}" '
                     f'data-positives="{int(positives[index])}"><td>{_text(_class_name(report.table, index))}</td>'
                     f"<td>{_text(row['vertical'] or MISSING_VERTICAL)}</td><td class=\"number\">{ap[index]:.4f}</td>"
                     f"<td class=\"number\">{int(positives[index])}</td><td class=\"number\">{row['train_videos']}</td>"
                     f"<td><ul class=\"confused\">{confused}</ul></td></tr>")
    return ("<h2>The hardest classes</h2>\n<p>The classes of lowest AP among those with positives (equal APs: more "
            "positives first), and what the model "
            "takes them for: of the videos labelled with the class, how many had each class as their highest-ranked "
            "class they are not labelled with (their strongest false positive).</p>\n<table id=\"worst\">\n"
            "<tr><th>class</th><th>vertical</th><th>AP</th><th>positives</th><th>training videos</th>"
            "<th>most taken for</th></tr>\n" + "\n".join(lines) + "\n</table>")


def _calibration(plt: Any, diagnostics: Diagnostics) -> str:
    calibration = diagnostics.calibration
    ece = calibration.expected_calibration_error()
    table = calibration.table()
    figure, (reliability, counts) = plt.subplots(2, 1, figsize=(7, 7), sharex=True,
                                                 gridspec_kw={"height_ratios": [3, 1.3]})
    filled = [row for row in table if row["pairs"]]
    reliability.plot([0, 1], [0, 1], color="gray", linestyle="--", linewidth=1, label="perfectly calibrated")
    reliability.plot([row["mean_probability"] for row in filled], [row["positive_rate"] for row in filled],
                     marker="o", label="this model")
    reliability.set(ylabel="observed rate of positives", xlim=(0, 1), ylim=(0, 1),
                    title=f"Reliability over all (video, class) pairs (ECE {ece:.4f})")
    reliability.legend(loc="upper left")
    width = 1.0 / calibration.bins
    counts.bar([row["low"] for row in table], [row["pairs"] for row in table], width=width, align="edge",
               color="tab:blue", alpha=0.6)
    if any(row["pairs"] for row in table):
        counts.set_yscale("log")
    counts.set(xlabel="predicted probability (bin)", ylabel="pairs (log)")
    rows = "\n".join(
        f'<tr data-bin="{index}" data-pairs="{row["pairs"]}" data-positives="{row["positives"]}">'
        f"<td>[{row['low']:.2f}, {row['high']:.2f}{']' if index == calibration.bins - 1 else ')'}</td>"
        f"<td class=\"number\">{row['pairs']}</td><td class=\"number\">{row['positives']}</td>"
        f"<td class=\"number\">{_optional(row['positive_rate'])}</td>"
        f"<td class=\"number\">{_optional(row['mean_probability'])}</td></tr>"
        for index, row in enumerate(table))
    return ("<h2>Calibration</h2>\n<p>Every (video, class) pair binned by its predicted probability: in each bin, the "
            "rate of positives against the mean probability (on the diagonal, a probability means what it says). "
            f'Expected calibration error: <span id="ece" data-value="{_value(ece)}">{ece:.4f}</span> (the mean over '
            "pairs of |rate of positives - mean probability| of their bin; most pairs are negatives scored near 0, "
            "which weigh most in it).</p>\n"
            + _image(plt, figure, "reliability diagram")
            + "\n<details><summary>The bins</summary>\n<table id=\"calibration\">\n<tr><th>probability</th>"
            "<th>pairs</th><th>positives</th><th>rate of positives</th><th>mean probability</th></tr>\n"
            + rows + "\n</table>\n</details>")


def _optional(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4f}"


def _curves(plt: Any, train_dir: str, result: dict[str, Any]) -> str:
    curves = run_curves(train_dir)
    train, evaluated = curves["train"], dict(curves["eval"])
    step = result["global_step"]
    for name in ("loss", *CURVE_METRICS):  # this evaluation's point, whether or not TensorBoard recorded it
        if isinstance(result.get(name), (int, float)):
            points = [point for point in evaluated.get(name, []) if point[0] != step]
            evaluated[name] = sorted([*points, (step, float(result[name]))])
    head = ("<h2>Training and validation curves</h2>\n<p class=\"note\">Read from the run's TensorBoard event files "
            f"({_text(train_dir)} and its eval/) by yt8m's own reader; this evaluation's point is added to the "
            "validation curves.")
    if not train and not curves["eval"]:
        head += (" The run has no event files: it trained without the tensorboard extra (pip install "
                 "'yt8m[tensorboard]'), so only this evaluation's point is drawn.")
    figure, (losses, metrics) = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    _draw(losses, train.get("loss"), "training loss (batches)", color="tab:blue", alpha=0.6)
    _draw(losses, evaluated.get("loss"), "validation loss", color="tab:orange", marker="o")
    losses.set(xlabel="step", ylabel="loss", title="Loss")
    drawn = [value for line in losses.lines for value in line.get_ydata()]
    if drawn and min(drawn) > 0 and max(drawn) > 10 * min(drawn):
        losses.set_yscale("log")
        losses.set_ylabel("loss (log)")
    for name, color in zip(CURVE_METRICS, ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        _draw(metrics, evaluated.get(name), f"validation {name}", color=color, marker="o")
        _draw(metrics, train.get(name), f"training batch {name}", color=color, linestyle=":", marker=".",
              alpha=0.5)
    metrics.set(xlabel="step", ylabel="metric", title="Metrics")
    if losses.lines:
        losses.legend(fontsize="small")
    if metrics.lines:
        metrics.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    tags = ", ".join(sorted(train)) or "none"
    return head + f" Training tags: {_text(tags)}.</p>\n" + _image(plt, figure, "training and validation curves")


def _draw(axes: Any, curve: Optional[Curve], label: str, **style: Any) -> None:
    if curve:
        axes.plot([point[0] for point in curve], [point[1] for point in curve], label=label, **style)

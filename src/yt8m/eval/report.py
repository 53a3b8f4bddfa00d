"""The evaluation report (`yt8m eval --report FILE.html`, `yt8m tune-report STUDY --report FILE.html`): one HTML
file that holds everything it shows (no network: no scripts, style sheets or fonts from elsewhere; its figures are
PNGs inside it as data: URIs), drawn with matplotlib (the plots extra).

It opens with the answer: GAP, mAP, Hit@1 and PERR, a one-line verdict (against --compare_to's reference where one is
given) and warnings where the figures say little (very few steps, predictions that hardly vary, probabilities far
from the rates they meet). Then what was evaluated (train dir, checkpoint and step, model and hyper-parameters,
features, data, date); the metrics of eval's JSON line with what each means; AP against training frequency and by
vertical (per_class.py's table and figures); the classes of lowest AP and what the model takes them for
(diagnostics.Confusions); how well its probabilities are calibrated (diagnostics.Calibration); and the run's training
and validation curves (curves.py). A table or figure that would show nothing (every row AP 0, one vertical, one
point) is left out with a line saying why. Every number a test or a script may check is in a data-value attribute
beside its text (data-metric, data-headline, data-class, data-confused), written as JSON writes it: the same float as
the JSON line's. The page's frame and figures are also the study page's (yt8m.tuning.report).
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
from yt8m.eval.diagnostics import Calibration, Diagnostics
from yt8m.eval.figures import png_bytes, pyplot, whole_numbers
from yt8m.eval.per_class import MISSING_VERTICAL, ClassTable, ap_figures
from yt8m.eval.reference import Reference, read_reference
from yt8m.io import storage
from yt8m.io.checkpoints import CONFIG_FILE
from yt8m.io.files import write_file_atomically
from yt8m.tasks.metrics import metric_meaning

log = logging.getLogger("yt8m.eval")

# The headline: the four metrics the YouTube-8M challenges and papers report, as they are written there.
HEADLINE = (("gap", "GAP"), ("map", "mAP"), ("hit_at_one", "Hit@1"), ("perr", "PERR"))
WORST_CLASSES = 25  # classes of lowest AP listed
ZERO_AP_NAMED = 12  # classes of AP 0 named in the line that stands for their rows
CONFUSED_SHOWN = 3  # classes each of them is most taken for
# When the figures say little: a run this short is undertrained whatever its data (the demo's is 150 steps, the
# recipes' thousands); predictions this concentrated in one bin above the lowest hardly vary (an untrained MoE
# scores about 0.5 everywhere); an ECE this high means probabilities far from the rates they meet.
FEW_STEPS = 100
FLAT_SHARE = 0.9
MISCALIBRATED_ECE = 0.1
# A headline difference from the reference smaller than this is level with it: runs of the same settings differ by a
# few thousandths (bench/README.md's repeats).
LEVEL = 0.005
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
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 70em; padding: 0 1em; color: #222;
       line-height: 1.4; }
h1 { font-size: 1.45em; margin-bottom: 0.4em; overflow-wrap: anywhere; }
h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; display: block; overflow-x: auto; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { white-space: nowrap; } td { overflow-wrap: break-word; }
td.number { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
img { max-width: 100%; height: auto; display: block; margin: 0.5em 0; }
.note { color: #555; font-size: 0.92em; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.9em; }
ul.confused { margin: 0; padding-left: 1.1em; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8em; margin: 0.8em 0; }
.card { border: 1px solid #d0d7de; border-radius: 6px; padding: 0.5em 1em; min-width: 9em; flex: 1 1 9em; }
.card .label { font-size: 0.9em; color: #555; } .card .figure { font-size: 2em; font-weight: 600; }
.card .against { font-size: 0.85em; color: #555; }
.verdict { font-size: 1.1em; margin: 0.6em 0; }
.warning { background: #fff4e5; border-left: 4px solid #e8a33d; padding: 0.4em 0.8em; margin: 0.4em 0; }
.hint { background: #eef5ff; border-left: 4px solid #4a8fe0; padding: 0.4em 0.8em; margin: 0.4em 0; }
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
    return {"file": path, "expected_calibration_error": report.diagnostics.calibration.expected_calibration_error(),
            "warnings": dict(warnings(report.result, report.diagnostics.calibration))}


def report_html(report: EvaluationReport) -> str:
    """The whole page: every figure drawn and embedded."""
    plt = pyplot()
    train_dir = report.config.checkpoints.train_dir
    step = report.result["global_step"]
    compare_to = report.config.report.compare_to
    reference = read_reference(compare_to) if compare_to else None
    hints = [] if reference else [("compare_to", COMPARE_HINT)]
    hints += [] if any(row["name"] for row in report.table.rows) else [("vocabulary", VOCABULARY_HINT)]
    body = [f"<h1>Evaluation report: {escaped(train_dir)}, step {_number_span('global_step', step)}</h1>",
            headline_html(report.result, reference, warnings(report.result, report.diagnostics.calibration), hints),
            _identity(report), _metrics(report.result), _classes(plt, report), _worst(report),
            _calibration(plt, report.diagnostics), _curves(plt, train_dir, report.result)]
    name = os.path.basename(train_dir.rstrip("/")) or train_dir
    return html_page(f"yt8m evaluation: {name} step {step}", body)


def html_page(title: str, body: Iterable[str]) -> str:
    """A self-contained page in the reports' style: nothing in it is fetched from elsewhere."""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{escaped(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n" + "\n".join(body)
            + "\n</body>\n</html>\n")


def escaped(value: Any) -> str:
    """Any value as HTML text (and attribute) shows it."""
    return html.escape(str(value), quote=True)


def _value(value: Any) -> str:
    """A number as the JSON line writes it (the same float when read back)."""
    return escaped(json.dumps(value))


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _number_span(name: str, value: Any) -> str:
    return f'<span data-metric="{escaped(name)}" data-value="{_value(value)}">{escaped(value)}</span>'


def figure_html(plt: Any, figure: Any, alt: str) -> str:
    """A figure as an <img> whose PNG is inside the page (a data: URI)."""
    data = base64.b64encode(png_bytes(plt, figure)).decode("ascii")
    return f'<img alt="{escaped(alt)}" src="data:image/png;base64,{data}">'


def note_html(text: str, kind: str = "note", key: str = "") -> str:
    """A line of the page: a plain note, a "hint" (what to do for a better page) or a "warning" (what the figures
    cannot be trusted for); `key` names it for scripts (data-note)."""
    named = f' data-note="{escaped(key)}"' if key else ""
    return f'<p class="{kind}"{named}>{text}</p>'


def _rows(rows: Iterable[tuple[str, str]]) -> str:
    return "<table>\n" + "\n".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows) + "\n</table>"


def headline_html(result: dict[str, Any], reference: Optional[Reference] = None,
                  found: Iterable[tuple[str, str]] = (), hints: Iterable[tuple[str, str]] = ()) -> str:
    """The answer first: GAP, mAP, Hit@1 and PERR (each against the reference where it has the metric), the verdict
    in one line, the warnings (`warnings`' (key, text)) where the figures say little, and `hints` (key, text) of what
    would make the page say more."""
    cards = []
    for name, label in HEADLINE:
        if not isinstance(result.get(name), (int, float)):
            continue
        against = ""
        if reference is not None and name in reference.metrics:
            against = f'<div class="against">{result[name] - reference.metrics[name]:+.4f} against ' \
                      f'{reference.metrics[name]:.4f}</div>'
        cards.append(f'<div class="card" data-headline="{name}" data-value="{_value(result[name])}"><div '
                     f'class="label">{label}</div><div class="figure">{result[name]:.4f}</div>{against}</div>')
    found = list(found)
    return ("<section id=\"headline\">\n<div class=\"cards\">" + "".join(cards) + "</div>\n"
            + f'<p class="verdict" id="verdict">{escaped(verdict(result, reference, len(found)))}</p>\n'
            + "".join(note_html(escaped(text), "warning", key) for key, text in found)
            + "".join(note_html(escaped(text), "hint", key) for key, text in hints) + "\n</section>")


def verdict(result: dict[str, Any], reference: Optional[Reference], warned: int = 0) -> str:
    """One line: what the evaluation measured, against the reference where one is given, and whether to trust it."""
    gap = result.get("gap")
    videos = result.get("num_videos")
    measured = (f"GAP {gap:.4f}" if isinstance(gap, (int, float)) else "Evaluated") + (
        f" on {videos:,} videos" if isinstance(videos, int) else "") + f" at step {result.get('global_step')}"
    if reference is None:
        compared = ""
    elif isinstance(gap, (int, float)) and "gap" in reference.metrics:
        difference = gap - reference.metrics["gap"]
        standing = ("level with" if abs(difference) < LEVEL else "above" if difference > 0 else "below")
        compared = f": {standing} {reference.label}, GAP {reference.metrics['gap']:.4f} ({difference:+.4f})"
    else:
        compared = f"; {reference.label} gives no GAP to compare with"
    trust = f". Read with care: {warned} warning{'s' if warned > 1 else ''} below." if warned else "."
    return measured + compared + trust


def warnings(result: dict[str, Any], calibration: Calibration) -> list[tuple[str, str]]:
    """(key, text) of what makes the figures say little of the model: very few steps, predictions that hardly vary,
    probabilities far from the rates of positives they meet."""
    found = []
    step = result.get("global_step")
    if isinstance(step, int) and step < FEW_STEPS:
        found.append(("few_steps", f"Trained {step} step{'s' if step != 1 else ''} only (under {FEW_STEPS}): an "
                                   "undertrained model. Train longer (--num_epochs) before reading much into these "
                                   "figures."))
    table = calibration.table()
    total = sum(row["pairs"] for row in table)
    fullest = max(table, key=lambda row: row["pairs"]) if total else None
    if fullest is not None and fullest["low"] > 0 and fullest["pairs"] >= FLAT_SHARE * total:
        found.append(("flat", f"The predictions hardly vary: {fullest['pairs'] / total:.0%} of all (video, class) "
                              f"pairs score in [{fullest['low']:.2f}, {fullest['high']:.2f}). A model that gives "
                              "every class about the same probability has not learnt to tell them apart."))
    ece = calibration.expected_calibration_error()
    if ece >= MISCALIBRATED_ECE:
        found.append(("miscalibrated", f"Its probabilities are far from the rates of positives they meet (expected "
                                       f"calibration error {ece:.2f}, {MISCALIBRATED_ECE} or more): the Calibration "
                                       "section shows where."))
    return found


def _identity(report: EvaluationReport) -> str:
    config = report.config
    model = config.model
    hparams = config_document(model.hparams) if model.hparams is not None else {}
    features = config_values(config.features)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    stored = _stored_config(config.checkpoints.train_dir)
    document = yaml.safe_load(stored) if stored else None
    trained = _training(document) if isinstance(document, dict) else []
    rows = [("train dir", escaped(os.path.abspath(config.checkpoints.train_dir)
                                if storage.is_local(config.checkpoints.train_dir) else config.checkpoints.train_dir)),
            ("checkpoint", f"{escaped(report.checkpoint)} (step {escaped(report.result['global_step'])})"),
            ("model", escaped(model.name) + (f", trunk {escaped(model.trunk_hidden_sizes)}"
                                           if model.trunk_hidden_sizes else "")),
            ("hyper-parameters", escaped(", ".join(f"{name}={value}" for name, value in hparams.items()) or "none")),
            ("loss", escaped(config.loss.name)),
            *trained,
            ("features", escaped(", ".join(f"{name}={_flat(value)}" for name, value in features.items()))),
            ("evaluation data", escaped(config.data.eval_data_pattern)),
            ("GAP depth", f"top {config.report.top_k} predictions per video"),
            ("date", f"{escaped(date)} (yt8m {__version__})")]
    shown = (f"<details><summary>The run's {CONFIG_FILE}</summary>\n<pre>{escaped(stored)}</pre>\n</details>"
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
    return ([("training", escaped(", ".join(settings)))] if settings else []) + (
        [("training data", escaped(pattern))] if pattern else [])


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
    rows = [f'<tr><th>{escaped(name)}</th><td class="number" data-metric="{escaped(name)}" '
            f'data-value="{_value(value)}">{escaped(_shown(value))}</td><td>{escaped(_meaning(name))}</td></tr>'
            for name, value in result.items() if name not in NOT_METRICS and isinstance(value, (int, float))]
    return ("<h2>Metrics</h2>\n<table>\n<tr><th>metric</th><th>value</th><th>what it says</th></tr>\n"
            + "\n".join(rows) + "\n</table>")


def _class_name(table: ClassTable, index: int) -> str:
    name = table.rows[index]["name"] if 0 <= index < len(table.rows) else ""
    return f"{index} {name}" if name else f"class {index}"


COMPARE_HINT = ("No reference to compare with: --compare_to takes a recipe's stated figures (gap=0.7035) or another "
                "run's train dir.")
VOCABULARY_HINT = ("The classes have no names: pass --vocabulary_file (the release's vocabulary.csv, or the "
                   "vocabulary.csv `yt8m synth` writes beside its shards) to name them and group them by vertical.")


def _classes(plt: Any, report: EvaluationReport) -> str:
    scored = report.table.scored()
    head = (f"<h2>AP by class</h2>\n<p>{len(scored)} of {len(report.table.rows)} classes have positives on the "
            f"evaluation data (their mean AP is the mAP); training videos from "
            f"{escaped(report.table.train_videos_from)}.</p>")
    parts = [head]
    if len(scored) < 2:
        return "\n".join(parts + [note_html(f"{len(scored)} class with positives: no distribution to draw.")])
    figures = ap_figures(plt, scored)
    parts.append(figure_html(plt, figures["ap_vs_train_videos"], "AP against training frequency"))
    verticals = {row["vertical"] or MISSING_VERTICAL for row in scored}
    if len(verticals) > 1:
        parts.append(figure_html(plt, figures["ap_by_vertical"], "AP by vertical"))
    else:
        plt.close(figures["ap_by_vertical"])
        parts.append(note_html(f"Every class is in one vertical, {escaped(verticals.pop())}: the figure of AP by "
                               "vertical is left out (it would be one row)."))
    return "\n".join(parts)


def _worst(report: EvaluationReport) -> str:
    ap, positives = report.per_class["ap"], report.per_class["positives"]
    scored = np.flatnonzero(positives > 0)
    # Lowest AP first; among equal APs, the classes with more positives (surer) first. Classes of AP 0 all look alike
    # (no positive among their videos' top predictions): one line names them instead of a row each.
    ordered = scored[np.lexsort((scored, -positives[scored], ap[scored]))]
    zero = [int(index) for index in ordered if ap[index] == 0]
    worst = [int(index) for index in ordered if ap[index] > 0][:WORST_CLASSES]
    parts = ["<h2>The hardest classes</h2>"]
    if zero:
        named = ", ".join(_class_name(report.table, index) for index in zero[:ZERO_AP_NAMED])
        more = f" and {len(zero) - ZERO_AP_NAMED} more" if len(zero) > ZERO_AP_NAMED else ""
        parts.append(f'<p id="zero-ap" data-classes="{",".join(map(str, zero))}">{len(zero)} of {len(scored)} '
                     f"classes with positives have AP 0 (none of their {int(positives[zero].sum())} positives is "
                     f"ranked where AP counts it): {escaped(named)}{more}.</p>")
    if not worst:
        return "\n".join(parts + [note_html("No class has an AP above 0: no table of the hardest.")])
    lines = [_worst_row(report, index) for index in worst]
    return "\n".join(parts + [
        "<p>The classes of lowest AP above 0 (equal APs: more positives first), and what the model takes them for: "
        "of the videos labelled with the class, how many had each class as their highest-ranked class they are not "
        "labelled with (their strongest false positive).</p>\n<table id=\"worst\">\n<tr><th>class</th>"
        "<th>vertical</th><th>AP</th><th>positives</th><th>training videos</th><th>most taken for</th></tr>\n"
        + "\n".join(lines) + "\n</table>"])


def _worst_row(report: EvaluationReport, index: int) -> str:
    ap, positives = report.per_class["ap"], report.per_class["positives"]
    row = report.table.rows[index]
    confused = "".join(
        f'<li data-confused="{other}" data-count="{count}">{escaped(_class_name(report.table, other))}: '
        f"{count} of {int(positives[index])} videos</li>"
        for other, count in report.diagnostics.confusions.most_confused(index, CONFUSED_SHOWN))
    return (f'<tr data-class="{index}" data-ap="{_value(float(ap[index]))}" data-positives="{int(positives[index])}">'
            f"<td>{escaped(_class_name(report.table, index))}</td><td>{escaped(row['vertical'] or MISSING_VERTICAL)}"
            f"</td><td class=\"number\">{ap[index]:.4f}</td><td class=\"number\">{int(positives[index])}</td>"
            f"<td class=\"number\">{row['train_videos']}</td><td><ul class=\"confused\">{confused}</ul></td></tr>")


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
            + figure_html(plt, figure, "reliability diagram")
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
            f"({escaped(train_dir)} and its eval/) by yt8m's own reader; this evaluation's point is added to the "
            "validation curves.")
    if not train and not curves["eval"]:
        head += (" The run has no event files: it trained without the tensorboard extra (pip install "
                 "'yt8m[tensorboard]'), so only this evaluation's point is drawn.")
    tags = ", ".join(sorted(train)) or "none"
    head += f" Training tags: {escaped(tags)}.</p>"
    if max((len(curve) for curve in [*train.values(), *evaluated.values()]), default=0) < 2:
        return head + "\n" + note_html(f"Every curve has one point (step {step}) at most: no curve to draw.",
                                        key="one_point")
    return head + "\n" + figure_html(plt, _curves_figure(plt, train, evaluated), "training and validation curves")


def _curves_figure(plt: Any, train: dict[str, Curve], evaluated: dict[str, Curve]) -> Any:
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
    whole_numbers(losses.xaxis)  # the axes share x: steps in whole numbers on both
    if losses.lines:
        losses.legend()
    if metrics.lines:
        metrics.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return figure


def _draw(axes: Any, curve: Optional[Curve], label: str, **style: Any) -> None:
    if curve:
        axes.plot([point[0] for point in curve], [point[1] for point in curve], label=label, **style)

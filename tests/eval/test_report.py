"""`yt8m eval --report FILE.html` and `yt8m tune-report STUDY --report FILE.html`: one self-contained HTML page whose
numbers are eval's JSON line's; the streamed confusions and calibration against brute force; the TensorBoard event
reader against tensorboard's own; the one-line error without matplotlib. tests/test_browser.py loads the pages in a
browser."""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import json
import math
import pickle
import shutil
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

from tune_fixtures import shards, tune_file  # noqa: F401  (fixtures)
from workflow_fixtures import NUM_CLASSES, tiny_data, trained_dir  # noqa: F401  (fixtures)
from yt8m import cli
from yt8m.data.format.tfrecord import TFRecordWriter
from yt8m.eval.curves import read_scalars, run_curves
from yt8m.eval.diagnostics import Calibration, Confusions, Diagnostics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """What the tests read of a report: every start tag with its attributes, and the text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {name: value or "" for name, value in attrs}))

    def handle_data(self, data):
        self.text.append(data)

    def with_attribute(self, name: str) -> list[dict[str, str]]:
        return [attrs for _, attrs in self.tags if name in attrs]


def run_eval(train_dir, data: dict, *flags: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["eval", "--eval_data_pattern", data["validate_pattern"], "--train_dir", str(train_dir),
                         "--run_once", "--num_readers", "0", *flags]) == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reported(tiny_data, trained_dir, tmp_path_factory) -> dict:
    """A copy of the tiny trained run evaluated with --report and --per_class: the JSON line, the page, the CSV."""
    folder = tmp_path_factory.mktemp("report")
    run = folder / "run"
    shutil.copytree(trained_dir, run)
    result = run_eval(run, tiny_data, "--report", str(folder / "report.html"), "--per_class",
                      str(folder / "classes.csv"), "--vocabulary_file", tiny_data["vocabulary"])
    with open(folder / "classes.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {"result": result, "path": folder / "report.html", "html": (folder / "report.html").read_text(),
            "rows": rows, "run": run}


def test_the_report_is_self_contained_html_whose_numbers_are_the_json_lines(reported):
    result, text = reported["result"], reported["html"]
    assert result["report"]["file"] == str(reported["path"])
    page = Page(text)
    tags = [tag for tag, _ in page.tags]
    assert tags[0] == "html" and "script" not in tags and "link" not in tags and "iframe" not in tags
    # Nothing is fetched: no address anywhere in the page, no CSS import or url(); every image is a PNG inside it.
    assert "http://" not in text and "https://" not in text and "@import" not in text and "url(" not in text
    images = [attrs["src"] for tag, attrs in page.tags if tag == "img"]
    assert len(images) == 4  # AP against training frequency, AP by vertical, reliability, curves
    for source in images:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.partition(",")[2]).startswith(PNG_MAGIC)
    assert not [attrs for _, attrs in page.tags for name in ("href", "src", "srcset", "poster")
                if name in attrs and not attrs[name].startswith(("data:", "#"))]

    # Every number of the JSON line is in the page, as the same float.
    shown = {attrs["data-metric"]: json.loads(attrs["data-value"]) for attrs in page.with_attribute("data-metric")}
    numbers = {name: value for name, value in result.items() if isinstance(value, (int, float))}
    assert set(numbers) == set(shown) and numbers == shown
    for name in ("gap", "map", "hit_at_one", "perr", "loss", "num_videos"):
        assert name in numbers
    words = " ".join(page.text)
    assert "GAP@20: every video's 20 best guesses pooled" in words and "PERR: the share" in words
    ece = next(attrs for attrs in page.with_attribute("id") if attrs["id"] == "ece")
    assert json.loads(ece["data-value"]) == result["report"]["expected_calibration_error"]
    assert reported["run"].name in page.text[page.text.index("train dir") + 1]
    assert "MoeModel" in words and "moe_num_mixtures" in words and f"step {result['global_step']}" in words
    assert "base_learning_rate=0.05" in words and "batch_size=64" in words  # how it trained (its config.yaml)


def test_the_worst_classes_are_the_csvs_lowest_ap_with_what_they_are_taken_for(reported):
    page = Page(reported["html"])
    rows = {int(row["class"]): row for row in reported["rows"]}
    worst = [attrs for attrs in page.with_attribute("data-ap")]
    # Lowest AP first; equal APs, more positives first.
    scored = sorted((float(row["ap"]), -int(row["positives"]), index) for index, row in rows.items()
                    if int(row["positives"]))
    assert [int(attrs["data-class"]) for attrs in worst] == [index for *_, index in scored][:len(worst)]
    assert len(worst) == min(len(scored), 25)
    for attrs in worst:
        row = rows[int(attrs["data-class"])]
        assert f"{json.loads(attrs['data-ap']):.6f}" == row["ap"] and attrs["data-positives"] == row["positives"]
    counts = [int(attrs["data-count"]) for attrs in page.with_attribute("data-confused")]
    assert counts and all(count >= 1 for count in counts)
    # The calibration bins count every (video, class) pair once, and every label once.
    bins = page.with_attribute("data-bin")
    assert sum(int(attrs["data-pairs"]) for attrs in bins) == reported["result"]["num_videos"] * NUM_CLASSES
    assert sum(int(attrs["data-positives"]) for attrs in bins) == sum(int(row["positives"]) for row in rows.values())


def test_the_curves_are_the_runs_event_files(reported):
    curves = run_curves(str(reported["run"]))
    assert curves["train"]["loss"] and curves["eval"]["gap"]
    assert curves["eval"]["gap"][-1] == (reported["result"]["global_step"], pytest.approx(reported["result"]["gap"]))
    assert "Training tags: " in reported["html"] and "learning_rate" in reported["html"]


def test_a_run_without_event_files_is_reported_with_this_evaluations_point(tiny_data, trained_dir, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # eval writes no TensorBoard point either
    run = tmp_path / "run"
    shutil.copytree(trained_dir, run, ignore=shutil.ignore_patterns("events.out.tfevents.*"))
    result = run_eval(run, tiny_data, "--report", str(tmp_path / "report.html"))
    assert run_curves(str(run)) == {"train": {}, "eval": {}}
    text = (tmp_path / "report.html").read_text()
    assert "The run has no event files" in text and "pip install 'yt8m[tensorboard]'" in text
    # One point (this evaluation's) is no curve, and without --vocabulary_file every class is in one vertical: both
    # figures are left out with a line saying why (AP against training frequency and reliability are drawn).
    assert "one_point" in notes(Page(text)) and len([tag for tag, _ in Page(text).tags if tag == "img"]) == 2
    assert "Every class is in one vertical, (no vertical)" in text
    assert "vocabulary" in notes(Page(text))  # the page says to pass one
    shown = {attrs["data-metric"]: json.loads(attrs["data-value"]) for attrs in Page(text).with_attribute("data-metric")}
    assert shown["gap"] == result["gap"]


def test_without_matplotlib_the_report_fails_in_one_line_before_evaluating(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    missing = tmp_path / "no_such_run"  # not even read: the error comes first
    assert cli.main(["eval", "--train_dir", str(missing), "--eval_data_pattern", str(tmp_path / "none-*"),
                     "--run_once", "--report", str(tmp_path / "r.html")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["yt8m eval: error: --report needs the plots extra: pip install 'yt8m[plots]' (missing: matplotlib)"]
    assert cli.main(["tune-report", str(missing), "--report", str(tmp_path / "r.html")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "yt8m tune-report: error: --report needs the plots extra: pip install 'yt8m[plots]' (missing: matplotlib)"]
    assert not (tmp_path / "r.html").exists()


def test_report_refuses_segment_labels(tiny_data, trained_dir, tmp_path, capsys):
    assert cli.main(["eval", "--eval_data_pattern", tiny_data["validate_pattern"], "--train_dir", str(trained_dir),
                     "--run_once", "--report", str(tmp_path / "r.html"), "--segment_labels"]) == 1
    assert "--report reports the classes of video labels" in capsys.readouterr().err


# --- the headline, the verdict, the warnings, and what is left out -------------------------------------------------

HEADLINE = ("gap", "map", "hit_at_one", "perr")


def headline(page: Page) -> dict:
    return {attrs["data-headline"]: json.loads(attrs["data-value"]) for attrs in page.with_attribute("data-headline")}


def notes(page: Page) -> set:
    return {attrs["data-note"] for attrs in page.with_attribute("data-note")}


def test_the_report_opens_with_the_headline_and_a_verdict_and_warns_of_a_short_run(reported):
    result, page = reported["result"], Page(reported["html"])
    assert headline(page) == {name: result[name] for name in HEADLINE}
    tags = [tag for tag, _ in page.tags]
    assert tags.index("section") < tags.index("h2")  # before "What was evaluated"
    words = " ".join(page.text)
    assert f"GAP {result['gap']:.4f} on {result['num_videos']} videos at step 12. Read with care: 1 warning below." \
        in words
    # 12 steps: undertrained, said on the page and in the JSON line; the vocabulary named the classes: no hint.
    assert result["report"]["warnings"].keys() == {"few_steps"} and "few_steps" in notes(page)
    assert "Trained 12 steps only (under 100)" in words
    assert "vocabulary" not in notes(page) and "compare_to" in notes(page)


@pytest.fixture(scope="module")
def longer_run(tiny_data, tmp_path_factory) -> Path:
    """The tiny run trained 120 steps (batches of 8, 4 epochs): past the few-steps warning."""
    from workflow_fixtures import tiny_train_config
    from yt8m.training import train

    train_dir = tmp_path_factory.mktemp("longer") / "run"
    train(tiny_train_config(tiny_data, train_dir, batch_size=8, num_epochs=4, export_model_steps=0,
                            log_every_steps=30, metrics_every_steps=30))
    return train_dir


def test_a_verdict_against_stated_figures_and_against_another_run(tiny_data, longer_run, reported, tmp_path):
    result = run_eval(longer_run, tiny_data, "--report", str(tmp_path / "a.html"), "--compare_to",
                      "gap=0.5,hit_at_one=0.99")
    page = Page((tmp_path / "a.html").read_text())
    words = " ".join(page.text)
    standing = "level with" if abs(result["gap"] - 0.5) < 0.005 else "above" if result["gap"] > 0.5 else "below"
    assert f"{standing} the stated figures (gap=0.5,hit_at_one=0.99), GAP 0.5000 ({result['gap'] - 0.5:+.4f})." \
        in words
    assert f"{result['hit_at_one'] - 0.99:+.4f} against 0.9900" in words  # the cards that have a reference figure
    assert "Read with care" not in words and result["report"]["warnings"] == {}
    assert "compare_to" not in notes(page) and "vocabulary" in notes(page)  # no --vocabulary_file: unnamed classes
    assert "one_point" not in notes(page)  # 4 validations and the training curve: the curves are drawn

    # Another run: its train dir's latest eval/metrics-<step>.json (the 12-step run's, step 12).
    other = reported["run"]
    latest = json.loads((other / "eval" / "metrics-00000012.json").read_text())
    run_eval(longer_run, tiny_data, "--report", str(tmp_path / "b.html"), "--compare_to", str(other))
    words = " ".join(Page((tmp_path / "b.html").read_text()).text)
    assert f"run {other} at step 12, GAP {latest['gap']:.4f} ({result['gap'] - latest['gap']:+.4f})" in words


def test_a_reference_that_names_nothing_is_refused_before_evaluating(tiny_data, trained_dir, tmp_path, capsys):
    for given, problem in (("gap=high", "'gap=high' is not METRIC=NUMBER"),
                           (str(tmp_path / "nowhere"), "is neither figures"),
                           (str(tmp_path), "the train dir has no eval/metrics-<step>.json")):
        assert cli.main(["eval", "--eval_data_pattern", tiny_data["validate_pattern"], "--train_dir",
                         str(trained_dir), "--run_once", "--report", str(tmp_path / "r.html"), "--compare_to",
                         given]) == 1
        err = capsys.readouterr().err
        # The config's problems, one a line under their heading (as every config error), no traceback.
        assert err.startswith("yt8m eval: error: ") and "--compare_to " in err and problem in err, err
        assert "Traceback" not in err and "eval batch" not in err
    assert not (tmp_path / "r.html").exists()


class Constant(torch.nn.Module):
    """A model that has learnt nothing: every class's logit one learnt bias, 0 at the start (probability 0.5)."""

    def __init__(self, feature_size: int, num_classes: int):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(num_classes))

    def forward(self, features):
        return self.bias.expand(len(features), -1)


def test_an_untrained_model_is_warned_of_and_classes_of_ap_0_are_one_line(tiny_data, tmp_path):
    """A model that scores every class 0.5 (trained 0 steps): flat, miscalibrated, short; at --top_k 1 most classes'
    positives are never ranked where AP counts them."""
    from workflow_fixtures import tiny_train_config
    from yt8m.models.registry import registered_model
    from yt8m.training import train

    with registered_model(Constant):
        train(tiny_train_config(tiny_data, tmp_path / "run", model="Constant", max_steps=0))
        result = run_eval(tmp_path / "run", tiny_data, "--report", str(tmp_path / "r.html"), "--per_class",
                          str(tmp_path / "classes.csv"), "--top_k", "1")
    page = Page((tmp_path / "r.html").read_text())
    warned = {"few_steps", "flat", "miscalibrated"}
    assert set(result["report"]["warnings"]) == warned and warned <= notes(page)
    assert "The predictions hardly vary" in " ".join(page.text)
    with open(tmp_path / "classes.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    zero = {int(row["class"]) for row in rows if row["ap"] and float(row["ap"]) == 0}
    line = next(attrs for attrs in page.with_attribute("id") if attrs["id"] == "zero-ap")
    assert zero and set(map(int, line["data-classes"].split(","))) == zero
    assert all(json.loads(attrs["data-ap"]) > 0 for attrs in page.with_attribute("data-ap"))  # no row of AP 0


def test_step_axes_tick_at_whole_numbers():
    from yt8m.eval.figures import pyplot, whole_numbers

    plt = pyplot()
    figure, axes = plt.subplots()
    axes.plot([1, 2, 3], [0.1, 0.2, 0.3])
    assert any(tick % 1 for tick in axes.get_xticks())  # matplotlib's own: 1.25, 1.5, ...
    whole_numbers(axes.xaxis)
    assert all(tick % 1 == 0 for tick in axes.get_xticks())
    plt.close(figure)


# --- the streamed computations against brute force ---------------------------------------------------------------

def example(seed: int, videos: int = 60, classes: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Scores with many ties (one decimal), some not predicted (-inf), bin edges and values outside [0, 1]; labels
    with videos of none and of every class."""
    rng = np.random.default_rng(seed)
    scores = np.round(rng.random((videos, classes)), 1).astype(np.float32)
    scores[rng.random(scores.shape) < 0.1] = -np.inf
    scores[0] = [0.0, 0.05, 0.5, 1.0, 1.3, -0.2, 0.95][:classes]
    labels = (rng.random((videos, classes)) < 0.3).astype(np.float32)
    labels[1] = 0
    labels[2] = 1
    scores[3] = -np.inf
    labels[3, 0] = 1
    return scores, labels


def brute_confusions(scores: np.ndarray, labels: np.ndarray) -> Counter:
    counts: Counter = Counter()
    for row, labelled in zip(scores.tolist(), labels.tolist()):
        others = [c for c in range(len(row)) if not labelled[c] and row[c] > -math.inf]
        if not any(labelled) or not others:
            continue
        confused = max(others, key=lambda c: (row[c], -c))  # the highest score, the lowest class among equals
        counts.update((true, confused) for true in range(len(row)) if labelled[true])
    return counts


def brute_calibration(scores: np.ndarray, labels: np.ndarray, bins: int) -> tuple[list, list, list, float]:
    pairs, positives, sums = [0] * bins, [0] * bins, [0.0] * bins
    for p, y in zip(scores.ravel().tolist(), labels.ravel().tolist()):
        p = min(max(p, 0.0), 1.0)
        index = min(int(p * bins), bins - 1)
        pairs[index] += 1
        positives[index] += int(y > 0)
        sums[index] += p
    ece = sum(abs(positives[b] / pairs[b] - sums[b] / pairs[b]) * pairs[b] for b in range(bins) if pairs[b])
    return pairs, positives, sums, ece / sum(pairs)


def test_confusions_count_each_labels_strongest_false_positive_as_brute_force_does():
    scores, labels = example(1)
    whole = Confusions(7)
    whole.update(scores, labels)
    expected = brute_confusions(scores, labels)
    true, confused, counts = whole.pairs()
    assert dict(zip(zip(true.tolist(), confused.tolist()), counts.tolist())) == dict(expected)
    # In batches, buffered and compacted often, merged from two accumulators (one pickled, as torchrun sends it):
    # the same counts.
    first, second = Confusions(7, compact_after=5), Confusions(7, compact_after=5)
    for start in range(0, 30, 7):
        first.update(scores[start:min(start + 7, 30)], labels[start:min(start + 7, 30)])
    second.update(scores[30:], labels[30:])
    first.merge(pickle.loads(pickle.dumps(second)))
    assert [array.tolist() for array in first.pairs()] == [array.tolist() for array in whole.pairs()]
    for cls in range(7):
        ranked = sorted(((count, -other) for (true_cls, other), count in expected.items() if true_cls == cls),
                        reverse=True)
        assert whole.most_confused(cls, 3) == [(-other, count) for count, other in ranked[:3]]


def test_calibration_bins_count_as_brute_force_does():
    scores, labels = example(2)
    for bins in (1, 10, 20):
        calibration = Calibration(bins)
        calibration.update(scores[:25], labels[:25])
        other = Calibration(bins)
        other.update(scores[25:], labels[25:])
        calibration.merge(pickle.loads(pickle.dumps(other)))
        pairs, positives, sums, ece = brute_calibration(scores, labels, bins)
        assert calibration.counts.tolist() == pairs and calibration.positives.tolist() == positives
        assert calibration.probability_sums == pytest.approx(sums, abs=1e-12)
        assert calibration.expected_calibration_error() == pytest.approx(ece, abs=1e-12)
    # The edges: 0.05 opens bin 1 of 20, 1.0 (and above) closes the top bin, below 0 counts as 0.
    calibration = Calibration(20)
    calibration.update(np.array([[0.0, 0.05, 0.5, 1.0, 1.3, -0.2]], np.float32), np.zeros((1, 6)))
    assert np.flatnonzero(calibration.counts).tolist() == [0, 1, 10, 19]
    assert calibration.counts[[0, 1, 10, 19]].tolist() == [2, 1, 1, 2]
    assert Calibration(4).expected_calibration_error() == 0.0


def test_diagnostics_refuse_mismatched_shapes():
    with pytest.raises(ValueError, match="equal"):
        Diagnostics(3).update(np.zeros((2, 3), np.float32), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="expected 3"):
        Confusions(3).update(np.zeros((2, 4), np.float32), np.zeros((2, 4)))


# --- the TensorBoard event files, read without tensorboard --------------------------------------------------------

def accumulated(directory: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_event_files_read_as_tensorboard_reads_them(reported, tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    for folder in (reported["run"], reported["run"] / "eval"):  # training's scalars, and eval's
        assert read_scalars(str(folder)) == accumulated(folder) != {}
    # A run that resumed at step 3 (purge_step): what was written at 3 and later before it is dropped.
    writer = SummaryWriter(str(tmp_path / "resumed"))
    for step in range(1, 6):
        writer.add_scalar("loss", 1.0 / step, step)
        writer.add_scalar("other", float(step), step)
    writer.close()
    writer = SummaryWriter(str(tmp_path / "resumed"), purge_step=3)
    writer.add_scalar("loss", 0.75, 3)
    writer.close()
    expected = {"loss": [(1, 1.0), (2, 0.5), (3, 0.75)], "other": [(1, 1.0), (2, 2.0)]}
    assert read_scalars(str(tmp_path / "resumed")) == accumulated(tmp_path / "resumed") == expected


def test_tensor_scalars_and_a_cut_record(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

    def event(step: int, tag: str, tensor) -> bytes:
        value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
        return event_pb2.Event(wall_time=float(step), step=step, summary=summary_pb2.Summary(value=[value])
                               ).SerializeToString()

    path = tmp_path / "events.out.tfevents.1.host.1.0"
    with TFRecordWriter(str(path)) as writer:
        writer.write(event_pb2.Event(wall_time=0.0, file_version="brain.Event:2").SerializeToString())
        writer.write(event(1, "f", tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[0.25])))
        writer.write(event(2, "d", tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE,
                                                          tensor_content=np.float64(0.125).tobytes())))
        writer.write(event(3, "text", tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"x"])))
        writer.write(event(4, "many", tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.0, 2.0])))
    with open(path, "ab") as fh:  # a writer still at work: half a record
        fh.write(b"\x40\x00\x00\x00\x00\x00\x00\x00abc")
    assert read_scalars(str(tmp_path)) == {"d": [(2, 0.125)], "f": [(1, 0.25)]}
    assert read_scalars(str(tmp_path / "nothing_here")) == {}


# --- tune-report --report ------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_tune_report_writes_the_studys_page_and_the_best_trials_report(tmp_path, shards, capsys):  # noqa: F811
    path = tune_file(tmp_path / "tune.yaml", shards, tune={"pruner": "none"})
    assert cli.main(["tune", "--config", path, "--n_trials", "2"]) == 0
    tuned = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    page_path = tmp_path / "study.html"
    trial_files = {path: path.stat().st_mtime_ns for path in Path(tuned["study_dir"]).rglob("*") if path.is_file()}
    vocabulary = shards / "vocabulary.csv"
    assert cli.main(["tune-report", tuned["study_dir"], "--report", str(page_path), "--vocabulary_file",
                     str(vocabulary)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["report"]
    best_report = tmp_path / "study_best_trial.html"
    assert summary["file"] == str(page_path) and summary["best_trial_report"] == str(best_report)
    assert summary["trial"] == tuned["best_trial"] and summary["report"]["file"] == str(best_report)
    # The best trial's model at its best epoch (its best export) on the study's validation shards: what the trial's
    # value measured.
    trial_dir = Path(tuned["study_dir"], "trials", f"trial-{summary['trial']}")
    assert summary["train_dir"] == str(trial_dir / "export" / "best" / f"{summary['global_step']:08d}")
    validated = json.loads((trial_dir / "eval" / f"metrics-{summary['global_step']:08d}.json").read_text())
    assert summary["gap"] == pytest.approx(validated["gap"], abs=1e-9)
    assert summary["gap"] == pytest.approx(tuned["best_value"], abs=1e-9)
    evaluation = Page(best_report.read_text())
    shown = {attrs["data-metric"]: json.loads(attrs["data-value"])
             for attrs in evaluation.with_attribute("data-metric")}
    assert shown["gap"] == summary["gap"] and shown["global_step"] == summary["global_step"]
    assert "Class 0" in " ".join(evaluation.text)  # the vocabulary named the classes

    # The study's page: self-contained, the answer first, every section, the plots too few points make say why.
    text = page_path.read_text()
    page = Page(text)
    assert "http://" not in text and "https://" not in text and "<script" not in text
    assert headline(page) == {name: summary[name] for name in HEADLINE}
    ids = [attrs["id"] for attrs in page.with_attribute("id")]
    assert ids[:2] == ["answer", "headline"] and len(ids) == len(set(ids))
    assert {"leaderboard", "best_so_far", "intermediate_values", "param_importances"} <= set(ids)
    answer = next(attrs for attrs in page.with_attribute("id") if attrs["id"] == "answer")
    assert int(answer["data-trial"]) == tuned["best_trial"]
    with open(Path(tuned["study_dir"]) / "leaderboard.csv", newline="") as fh:
        ranked = [int(row["trial"]) for row in csv.DictReader(fh)]
    assert [int(attrs["data-trial"]) for attrs in page.with_attribute("data-state")] == ranked
    words = " ".join(page.text)
    assert f"yt8m train --config {Path(tuned['study_dir']).resolve() / 'best.yaml'}" in words
    assert "skipped-param_importances" in notes(page) and "importances need 10 complete trials" in words
    assert "study_best_trial.html" in [attrs["href"] for _, attrs in page.tags if "href" in attrs]
    images = [attrs["src"] for tag, attrs in page.tags if tag == "img"]
    assert len(images) == 2 and all(source.startswith("data:image/png;base64,") for source in images)
    # Nothing was written into the trial's dir (no metrics file, no TensorBoard point): the study's files are as
    # they were, bar the report's leaderboard and plots.
    study_files = {path: path.stat().st_mtime_ns for path in Path(tuned["study_dir"]).rglob("*") if path.is_file()}
    assert {path: time for path, time in study_files.items() if trial_dir in path.parents} == {
        path: time for path, time in trial_files.items() if trial_dir in path.parents}

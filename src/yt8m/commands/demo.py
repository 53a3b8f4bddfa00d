"""`yt8m demo` (what `make demo` runs): synthesize a small set, train a MoE, evaluate (with the report page), tune
(with the study's page), predict, score; then the 2019 segment task: a frame model fine-tuned on rated segments, its
segment predictions scored.

Each stage calls the same public function as its own command, so the demo runs the real workflow in minutes. Its
summary claims a gain only against another configuration (the study's best trial against its untuned trial, the same
measurement), and every command it prints runs as printed (the venv's own, by its path where it is not on PATH).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import yaml

from yt8m.commands.command_line import read_command
from yt8m.config import config_from_dict
from yt8m.data.making.synthetic import write_synthetic
from yt8m.eval.evaluate import evaluate_run
from yt8m.eval.metrics import METRIC_MEANINGS
from yt8m.eval.score import score_files
from yt8m.eval.segment_score import score_segment_files
from yt8m.fields import setting
from yt8m.inference.config import PredictConfig
from yt8m.inference.predict import run_predict
from yt8m.io.files import write_file_atomically
from yt8m.runtime import setup_logging
from yt8m.training import TrainConfig, train
from yt8m.tuning.runner import run_tune
from yt8m.tuning.space import load_tune_spec
from yt8m.tuning.study import describe_counts
from yt8m.tuning.study_page import write_study_page

log = logging.getLogger("yt8m.demo")
REPORTED_METRICS = ("gap", "map", "hit_at_one", "perr")

# The untuned MoeModel's settings; a larger step than the starter kit's 0.01: a few hundred steps on a small set must go
# far.
UNTUNED_LEARNING_RATE = 0.05
UNTUNED_MIXTURES = 2


def run_demo(output_dir: str, *, num_classes: int = 500, train_videos: int = 8000, num_epochs: int = 5,
             tune_trials: int = 6, segment_videos: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Every stage of the workflow on fresh synthetic data in `output_dir`; returns what the report shows."""
    started = time.perf_counter()
    data_dir = os.path.join(output_dir, "data")
    train_dir = os.path.join(output_dir, "train_dir")
    log.info("1/7 synthesizing %d training videos with %d classes in %s", train_videos, num_classes, data_dir)
    data = write_synthetic(data_dir, kind="video", num_classes=num_classes, train_videos=train_videos,
                           validate_videos=train_videos // 4, test_videos=train_videos // 4, seed=seed)
    pattern = os.path.join(data_dir, "video", "{}-*.tfrecord")

    log.info("2/7 training a MoeModel for %d epochs in %s", num_epochs, train_dir)
    summary = train(config_from_dict(TrainConfig, dict(
        train_data_pattern=pattern.format("train"), train_dir=train_dir, model="MoeModel",
        feature_names="mean_rgb,mean_audio", feature_sizes="1024,128", num_classes=num_classes,
        batch_size=256, base_learning_rate=UNTUNED_LEARNING_RATE, moe_num_mixtures=UNTUNED_MIXTURES,
        num_epochs=num_epochs, export_model_steps=train_videos // 256,
        num_readers=1, cache_in_memory=True, start_new_model=True, seed=seed, log_every_steps=10), "demo"))

    report = os.path.join(output_dir, "report.html")
    log.info("3/7 evaluating the final checkpoint on the validate split, its report in %s", report)
    metrics = next(evaluate_run({"eval_data_pattern": pattern.format("validate"), "train_dir": train_dir,
                                 "run_once": True, "num_readers": 1, "report": report,
                                 "vocabulary_file": data["vocabulary"]}, "demo"))

    study = (_tune(output_dir, pattern, num_classes, num_epochs, tune_trials, seed, data["vocabulary"])
             if tune_trials else None)

    log.info("5/7 predicting the test split")
    predictions = os.path.join(output_dir, "predictions.csv")
    run_predict(config_from_dict(PredictConfig, {"input_data_pattern": pattern.format("test"),
                                                 "train_dir": train_dir, "output_file": predictions}, "demo"))

    log.info("6/7 scoring the predictions against the test labels")
    score = score_files(predictions, data["test_labels"], num_classes=num_classes)
    segments = _segment_task(output_dir, num_classes, segment_videos, seed) if segment_videos else None
    return {"train": summary, "validate": metrics, "tune": study, "test": score, "segments": segments,
            "train_dir": train_dir, "predictions": predictions, "test_labels": data["test_labels"],
            "report": report, "output_dir": output_dir, "seconds": time.perf_counter() - started}


def _segment_task(output_dir: str, num_classes: int, videos: int, seed: int) -> dict[str, Any]:
    """The 2019 segment task on segment-rated synthetic data: a FrameLevelLogisticModel trained on video labels,
    then fine-tuned on the rated segments (--init_from); both predict every segment of the validate videos (whose
    ratings score them)."""
    data_dir = os.path.join(output_dir, "data")
    log.info("7/7 the 2019 segment task: %d segment-rated videos, a frame model fine-tuned on segments", videos)
    written = write_synthetic(data_dir, kind="segment", num_classes=num_classes, train_videos=videos,
                              validate_videos=videos // 4, test_videos=0, seed=seed)
    pattern = os.path.join(data_dir, "segment", "{}-*.tfrecord")
    frame_dir = os.path.join(output_dir, "frame_dir")
    # Fine-tuning takes the starter kit's smaller step: at 0.05 it undid more than it learnt (segment mAP 0.98 -> 0.94).
    runs: list[tuple[str, str, dict[str, Any]]] = [
            ("video_labels", frame_dir, {"base_learning_rate": 0.05}),
            ("fine_tuned", os.path.join(output_dir, "segment_dir"),
             {"base_learning_rate": 0.01, "segment_labels": True, "init_from": frame_dir})]
    scores = {}
    for name, train_dir, settings in runs:
        train(config_from_dict(TrainConfig, dict(
            train_data_pattern=pattern.format("train"), train_dir=train_dir, model="FrameLevelLogisticModel",
            frame_features=True, feature_names="rgb,audio", feature_sizes="1024,128", num_classes=num_classes,
            batch_size=64, num_epochs=2, num_readers=0, start_new_model=True, seed=seed, log_every_steps=20,
            **settings), "demo"))
        submission = os.path.join(output_dir, f"segments_{name}.csv")
        run_predict(config_from_dict(PredictConfig, dict(
            input_data_pattern=pattern.format("validate"), train_dir=train_dir, output_file=submission,
            segment_labels=True, segment_label_ids_file=written["segment_vocabulary"]), "demo"))
        scores[name] = score_segment_files(submission, pattern.format("validate"), num_classes=num_classes)
    return {"scores": scores, "submission": submission}


def _tune(output_dir: str, pattern: str, num_classes: int, num_epochs: int, n_trials: int, seed: int,
          vocabulary: str) -> dict[str, Any]:
    """A short study through the same path as `yt8m tune --config`: a YAML file, SQLite, pruning; then its page, as
    `yt8m tune-report STUDY --report` writes it."""
    study_dir = os.path.join(output_dir, "study")
    tune_file = os.path.join(output_dir, "tune_demo.yaml")
    document = {
        "train": {"train_data_pattern": pattern.format("train"), "eval_data_pattern": pattern.format("validate"),
                  "feature_names": "mean_rgb,mean_audio", "feature_sizes": "1024,128", "num_classes": num_classes,
                  "model": "MoeModel", "batch_size": 256, "num_epochs": num_epochs, "num_readers": 1,
                  "cache_in_memory": True, "keep_checkpoints": 1, "seed": seed, "log_every_steps": 50},
        "search": {"base_learning_rate": {"type": "float", "low": 0.005, "high": 0.2, "log": True},
                   "moe_num_mixtures": {"type": "int", "low": 1, "high": 4}},
        "objective": {"metric": "gap", "direction": "maximize"},
        # The untuned run's settings first: the baseline the search is to beat, as configs/tune_video.yaml does.
        "tune": {"study_dir": study_dir, "n_trials": n_trials, "n_startup_trials": 2, "seed": seed,
                 "enqueue": [{"base_learning_rate": UNTUNED_LEARNING_RATE, "moe_num_mixtures": UNTUNED_MIXTURES}]},
    }
    write_file_atomically(tune_file, lambda out: yaml.safe_dump(document, out, sort_keys=False))
    log.info("4/7 tuning: %d trials of %d epochs (TPE, median pruning, SQLite) in %s", n_trials, num_epochs,
             study_dir)
    spec = load_tune_spec(tune_file)
    study, summary = run_tune(spec)
    page = os.path.join(output_dir, "study_report.html")
    written = write_study_page(spec, study, page, vocabulary) if summary["best_value"] is not None else None
    return {**summary, "tune_file": tune_file, "page": written["file"] if written else None}


def format_report(result: dict[str, Any]) -> str:
    train, validate, test = result["train"], result["validate"], result["test"]
    yt8m = runnable("yt8m")
    tensorboard = runnable("tensorboard")
    return "\n".join([
        "",
        "yt8m demo: synthetic data -> train MoeModel -> eval -> tune -> predict -> score"
        + (" -> 2019 segments" if result["segments"] else ""),
        f"  trained        {train['global_step']} steps, {train['examples']} examples, "
        f"{train['examples_per_sec']:.0f} examples/s",
        f"  validate       GAP {validate['gap']:.4f}  mAP {validate['map']:.4f}  "
        f"Hit@1 {validate['hit_at_one']:.4f}  PERR {validate['perr']:.4f}  ({validate['num_videos']} videos, the "
        "last epoch's checkpoint)",
        *_tune_lines(result["tune"], validate["gap"], yt8m),
        f"  test (scored)  GAP {test['gap']:.4f}",
        *_segment_lines(result["segments"]),
        "  what they mean (higher is better, 1 is perfect):",
        *(f"    {METRIC_MEANINGS[name]}" for name in _reported_metrics(result)),
        f"  train dir      {result['train_dir']}  (checkpoints/, config.yaml, eval/metrics-*.json)",
        f"  predictions    {result['predictions']}",
        f"  report         {result['report']}  (open it in a browser: the headline, the hardest classes, "
        "calibration, curves)",
        *([f"  TensorBoard    {tensorboard} --logdir {result['train_dir']}"] if tensorboard else []),
        f"  took           {result['seconds']:.0f} s",
        "next steps",
        f"  your own run   {yt8m} train --help; the quickstart (docs/quickstart.md) runs each command "
        "on synthetic data, with what it prints",
        "  real data      README.md, \"Real data in 10 minutes\": the 2018 shards (docs/how-to/download.md) to a "
        "scored submission",
        *_site_line(),
        "",
    ])


def _site_line() -> list[str]:
    """The documentation site's command, where it can run from here (the repository, with the docs extra)."""
    mkdocs = runnable("mkdocs")
    if not mkdocs or not os.path.exists("mkdocs.yml"):
        return []
    return [f"  the site       {mkdocs} serve, then http://127.0.0.1:8000 (every command's flags, the Python API, "
            "troubleshooting)"]


def runnable(name: str) -> str:
    """How to type the venv's command `name` so that it runs as printed: its bare name where PATH finds this one, else
    its path (relative from here where it is below); "" where it is not installed."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):
        return ""
    on_path = shutil.which(name)
    if on_path and os.path.realpath(on_path) == os.path.realpath(path):
        return name
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path


def _reported_metrics(result: dict[str, Any]) -> tuple[str, ...]:
    return REPORTED_METRICS + (("segment_map",) if result["segments"] else ())


def _tune_lines(study: Any, untuned_gap: float, yt8m: str) -> list[str]:
    """The study against its untuned trial (the same measurement: each trial's best validated epoch), never against
    the run above (its last epoch's checkpoint)."""
    if not study:
        return []
    counts = describe_counts(study["n_trials"])
    if study["best_value"] is None:
        return [f"  tune           no trial completed ({counts})"]
    params = ", ".join(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"
                       for name, value in study["best_params"].items())
    best, baseline = study["best_value"], study["baseline_value"]
    lines = [f"  tune           {counts}: best validate GAP {best:.4f}, trial {study['best_trial']} ({params})"]
    if baseline is None:
        lines.append("                 the untuned settings did not complete a trial: nothing to compare with")
    elif study["best_trial"] == study["baseline_trial"]:
        searched = sum(study["n_trials"].values())
        lines.append(f"                 no trial beat the untuned settings (trial {study['best_trial']} is theirs): "
                     f"{searched} trials over {len(study['best_params'])} parameters are too few a search "
                     "(--tune_trials searches further)")
    else:
        lines.append(f"                 {best - baseline:+.4f} against the untuned settings' trial "
                     f"{study['baseline_trial']} ({baseline:.4f}); a gain of a few thousandths can be run-to-run "
                     "noise: tune-report --retrain_best trains the best again to see it hold")
    lines.append(f"                 (a trial's GAP is its best epoch's; the validate line above is the last epoch's, "
                 f"{untuned_gap:.4f})")
    return lines + [f"  study          {study['study_dir']}  (leaderboard.txt, best.yaml; "
                    f"{yt8m} tune --config {study['tune_file']} resumes it)",
                    *([f"  study page     {study['page']}  (the leaderboard, best so far, what the pruner saw, the "
                       "best trial's evaluation)"] if study.get("page") else [])]


def _segment_lines(segments: Any) -> list[str]:
    if not segments:
        return []
    before, after = (segments["scores"][name] for name in ("video_labels", "fine_tuned"))
    return [f"  segments       validate segment mAP {before['segment_map']:.4f} (frame model, video labels) -> "
            f"{after['segment_map']:.4f} fine-tuned on segments ({after['num_rated_pairs']} rated pairs)",
            f"  submission     {segments['submission']}  (Class,Segments)"]


@dataclass(frozen=True)
class DemoConfig:
    """The size of what `yt8m demo` runs."""

    output_dir: str = setting("demo_output", "Where data, train dir and predictions go.", required=True)
    num_classes: int = setting(500, "Classes of the synthetic set.", at_least=2)
    train_videos: int = setting(8000, "Training videos (validate/test: a quarter each).", at_least=16)
    num_epochs: int = setting(5, "Training epochs.", at_least=1)
    tune_trials: int = setting(6, "Trials of the short tuning study (0: skip).", at_least=0)
    segment_videos: int = setting(1000, "Segment-rated training videos of the 2019 segment stage (validate: a "
                                        "quarter; 0: skip).", at_least=0)
    seed: int = setting(0, "Seed for the data and the training.", at_least=0)


def main(argv: Sequence[str]) -> int:
    config = read_command(DemoConfig, argv, "yt8m demo", __doc__)
    setup_logging()
    result = run_demo(config.output_dir, num_classes=config.num_classes, train_videos=config.train_videos,
                      num_epochs=config.num_epochs, tune_trials=config.tune_trials,
                      segment_videos=config.segment_videos, seed=config.seed)
    # The report is for a person (stderr, with the logs); stdout carries one JSON line, as every command's.
    print(format_report(result), file=sys.stderr, flush=True)
    print(json.dumps(json_summary(result)), flush=True)
    return 0


def json_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The demo's figures and files, for scripts."""
    tune = result["tune"] or {}
    segments = result["segments"]
    return {"validate": result["validate"], "test": result["test"], "report": result["report"],
            "tune": {key: tune.get(key) for key in ("best_value", "best_params", "best_trial", "baseline_trial",
                                                    "baseline_value", "n_trials", "study_dir", "page")}
            if tune else None,
            "segment_map": {name: score["segment_map"] for name, score in segments["scores"].items()}
            if segments else None,
            "train_dir": result["train_dir"], "predictions": result["predictions"],
            "seconds": round(result["seconds"], 1)}

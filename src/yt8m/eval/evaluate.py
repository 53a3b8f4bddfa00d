"""Evaluation: `evaluate_model` (a model's metrics over batches, in memory that does not grow with them) and
`evaluate_checkpoints` (a train dir's checkpoints, once or watching for each new one until the run's final one)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
from torch import nn
from tqdm import tqdm

from yt8m.config import (
    STARTER_TRAIN_DIR,
    ConfigError,
    component_problems,
    config_from_dict,
    config_problems,
    config_values,
    differing,
    given_flags,
    hparams_mapping,
    load_yaml,
    read_section,
    resolve_components,
    shown,
)
from yt8m.data.format.tfrecord import list_shards
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.dataset import YT8MDataset, make_loader
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.data.reading.spec import DataConfig, FeatureSpec
from yt8m.distributed.across_ranks import merge_at_rank0, merge_metrics_at_rank0, this_rank_shards, together
from yt8m.distributed.ranks import (
    all_reduce_sum,
    decided_by_rank0,
    launched_by_torchrun,
    process_group,
    rank_and_world_size,
    training_device,
)
from yt8m.eval.config import EvalConfig, ReportConfig, WatchConfig
from yt8m.eval.diagnostics import Diagnostics
from yt8m.eval.per_class import class_table, write_per_class
from yt8m.eval.report import EvaluationReport, write_report
from yt8m.fields import setting
from yt8m.io import storage
from yt8m.io.checkpoints import (
    CONFIG_FILE,
    Checkpoint,
    final_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    load_latest_checkpoint,
)
from yt8m.io.files import write_file_atomically
from yt8m.io.lock import describe_holder, train_dir_holder
from yt8m.io.summaries import summary_writer, write_scalars
from yt8m.models.base import forward
from yt8m.models.checkpoints import build_model_from_payload
from yt8m.models.config import MODEL_IDENTITY_FIELDS, ModelConfig
from yt8m.optional import require
from yt8m.runtime import reader_workers, resolve_device
from yt8m.tasks.base import Task
from yt8m.tasks.losses import LossConfig
from yt8m.tasks.metrics import is_own_metric
from yt8m.tasks.video import features_task, task_problems

log = logging.getLogger("yt8m.eval")
# Under torchrun eval joins a gloo group: its merges move NumPy arrays, whatever the model's device.
CPU = torch.device("cpu")


def evaluate_model(model: nn.Module, dataset_or_loader: Iterable[Batch], task: Task,
                   device: str | torch.device = "cpu", across_ranks: bool = False,
                   source: Optional[str] = None, per_class: bool = False,
                   diagnostics: Optional[Diagnostics] = None) -> dict[str, Any]:
    """The task's metrics of `model` over one pass of the batches (video labels: GAP, mAP, Hit@1, PERR and loss;
    segment ratings: segment mAP, GAP and loss over the rated pairs); restores the model's mode.

    Batches without a single example or without a single label (test shards) are a ValueError, not metrics of 0.
    `across_ranks`: every process of the process group calls this on its own part of the data, and each gets the
    metrics of all parts, merged exactly at rank 0 (yt8m.distributed.across_ranks). `source` names the data in errors.
    `per_class` (video labels): the result's "per_class" holds each class's AP and positives (EvaluationMetrics').
    `diagnostics` (video labels): fed every batch's predictions and labels too (the report's confusions and
    calibration); across ranks, rank 0's holds every process's.
    """
    device = torch.device(device)
    if source is None:
        source = getattr(getattr(dataset_or_loader, "dataset", dataset_or_loader), "pattern", "the evaluation data")
    was_training = model.training
    model.eval()
    videos, started = 0, time.perf_counter()
    try:
        with torch.no_grad(), task.metrics() as metrics, \
                tqdm(unit="video", desc="eval", dynamic_ncols=True, disable=not sys.stderr.isatty()) as bar:
            with together() if across_ranks else contextlib.nullcontext():
                for index, batch in enumerate(dataset_or_loader, start=1):
                    batch = batch.to(device)
                    output = forward(model, batch)
                    loss = task.loss(output, batch).item()
                    predictions = output["predictions"].float().cpu().numpy()
                    task.accumulate(metrics, predictions, batch, loss)
                    if diagnostics is not None:
                        diagnostics.update(predictions, batch.labels.cpu().numpy())
                    videos += len(batch)
                    bar.update(len(batch))
                    log.info("eval batch %d: %d videos so far, batch loss %.5f, %.0f videos/s", index, videos, loss,
                             videos / max(time.perf_counter() - started, 1e-9))
            if not across_ranks:
                return _results(task, metrics, source, videos, per_class)
            videos = all_reduce_sum(videos, CPU)
            merge_metrics_at_rank0(metrics)
            if diagnostics is not None:
                merge_at_rank0(diagnostics)
            return decided_by_rank0(lambda: _results(task, metrics, source, videos, per_class))
    finally:
        model.train(was_training)


def _results(task: Task, metrics: Any, source: str, videos: int, per_class: bool) -> dict[str, Any]:
    if not videos:
        raise ValueError(f"no videos in {source}: nothing to evaluate")
    results = task.results(metrics, source)
    return {**results, "per_class": metrics.per_class()} if per_class else results


def resolve_eval_config(values: dict[str, Any], source: str = "arguments") -> EvalConfig:
    """The eval config of flag values (flat, or nested by section), the train dir's features, model (its
    hyper-parameters included) and loss, and its readers' settings, filled in where not given. Given ones must agree
    with the train dir's, and the whole config must be valid, its components found: every problem in one error."""
    train_dir = read_section(values, "checkpoints", WatchConfig, source).train_dir
    path = os.path.join(train_dir, CONFIG_FILE)
    if not storage.exists(path):
        raise FileNotFoundError(f"{train_dir} is not a yt8m train dir (no config.yaml): train a model there first")
    trained = _trained_values(load_yaml(path), path)
    given = given_flags(EvalConfig, values)
    # A model or loss given that is not the run's brings its own hyper-parameters, not the run's (the model's
    # difference is refused below, the loss's taken).
    others = {key for key, flag in (("model", "model"), ("loss", "label_loss"))
              if flag in given and config_values(config_from_dict(EvalConfig, values, source, check_values=False))[
                  flag] != trained[flag]}
    inherited = {name: value for name, value in trained.items()
                 if name.rpartition(".")[2] not in given and name.partition(".")[0] not in others}
    config = config_from_dict(EvalConfig, {**inherited, **values}, source, check_values=False)
    model_values = {name.rpartition(".")[2]: value for name, value in trained.items() if name.startswith("model.")}
    identity = [name for name in (*MODEL_IDENTITY_FIELDS, *model_values) if name in given]
    problems = [f"--{name}: given {shown(new)}, {path} has {shown(old)}"
                for name, old, new in differing({**trained, **model_values}, config_values(config), identity)]
    if problems:
        problems.append("Drop these flags (they are read from the train dir) or point --train_dir elsewhere.")
    problems += config_problems(config) + component_problems(config)
    problems += eval_config_problems(config) if not problems else []
    if problems:
        raise ConfigError(f"the eval config for {train_dir} is invalid", problems)  # one problem: one line
    return resolve_components(config)


@dataclass(frozen=True)
class ValidatedMetrics:
    """What eval reads of a run's validation section: the metrics it reported beside its task's own."""

    best_metric: str = setting("gap", "The run's --best_metric.")
    metrics: list[str] = setting([], "The run's --metrics.")


def _trained_values(document: dict[str, Any], path: str) -> dict[str, Any]:
    """The values eval takes from a train dir's config: its features, model and loss (their hyper-parameters by
    dotted name, `model.NAME`, as the run trained them), and its readers' settings."""
    features = read_section(document, "features", FeatureSpec, path)
    data = read_section(document, "data", DataConfig, path)
    validation = read_section(document, "validation", ValidatedMetrics, path)
    best = validation.best_metric.rpartition("/")[2]
    values = {**config_values(features), "metrics": [*validation.metrics, *([] if is_own_metric(best) else [best])],
              "num_readers": data.num_readers, "skip_corrupt": data.skip_corrupt}
    for key, section in (("model", ModelConfig), ("loss", LossConfig)):
        stored = read_section(document, key, section, path)
        hparams = hparams_mapping(getattr(stored, section.HPARAMS))
        settings = {name: value for name, value in config_values(stored).items() if name not in hparams}
        values.update(settings, **{f"{key}.{name}": value for name, value in hparams.items()})
    return values


def eval_config_problems(config: EvalConfig) -> list[str]:
    """The checks of an eval config beyond its sections' own: what its task asks of it."""
    return task_problems(config.features.segment_labels, config.loss.name)


def write_metrics(train_dir: str, result: dict[str, Any], writer, names: Sequence[str]) -> str:
    """DIR/eval/metrics-<step>.json (written atomically) and the metrics `names` (the task's) for TensorBoard."""
    path = os.path.join(train_dir, "eval", f"metrics-{result['global_step']:08d}.json")
    write_file_atomically(path, lambda out: json.dump(result, out, indent=1))
    write_scalars(writer, {name: result[name] for name in names}, result["global_step"])
    if writer is not None:
        writer.flush()
    return path


def evaluate_run(values: dict[str, Any], source: str = "arguments") -> Iterator[dict[str, Any]]:
    """`yt8m eval` of flag values (flat, or nested by section): watching (unless --run_once), wait for the train dir's
    run to start, then `evaluate_checkpoints` with its config filled in from the train dir (resolve_eval_config)."""
    config_from_dict(EvalConfig, values, source, check_values=False)  # an unknown or ill-typed name first, named
    watch = read_section(values, "checkpoints", WatchConfig, source)
    require_report_extras(read_section(values, "report", AskedReport, source))
    if watch.train_dir.rstrip("/") == STARTER_TRAIN_DIR.rstrip("/"):
        log.warning("--train_dir is %s, the starter kit's default: evaluating whatever was last trained there; give "
                    "the run's own --train_dir", watch.train_dir)
    if not watch.run_once:
        wait_for(lambda: storage.exists(os.path.join(watch.train_dir, CONFIG_FILE)), watch)
    yield from evaluate_checkpoints(resolve_eval_config(values, source))


@dataclass(frozen=True)
class AskedReport:
    """What eval reads of its report section first, before the train dir: whether an HTML report is asked for."""

    report: str = setting("", "ReportConfig.report.")


def require_report_extras(report: ReportConfig | AskedReport) -> None:
    """--report's one-line error where the plots extra is missing, before anything is read or evaluated."""
    if report.report:
        require("plots", "--report")


def evaluate_checkpoints(config: EvalConfig) -> Iterator[dict[str, Any]]:
    """Yield the metrics of the latest checkpoint, then (unless run_once) of each new one until the final.

    Under torchrun each process evaluates its block of the shards (yt8m.distributed.across_ranks) and all yield the
    merged metrics; rank 0 picks each checkpoint and alone writes the metrics files.
    """
    require_report_extras(config.report)
    if not launched_by_torchrun():
        yield from _evaluate_checkpoints(config, resolve_device(config.data.device))
        return
    with process_group(CPU):
        yield from _evaluate_checkpoints(config, training_device(config.data.device))


def evaluation_batches(config: EvalConfig, device: torch.device) -> tuple[YT8MDataset, Iterable[Batch]]:
    """The dataset of this process's shards of the eval data (all of them in one process) and its loader."""
    data = config.data
    # Whole shards per process, in contiguous blocks: not YT8MDataset's split for training.
    shards = this_rank_shards(list_shards(data.eval_data_pattern), f"eval shards ({data.eval_data_pattern})")
    dataset = YT8MDataset(shards, config.features, data.batch_size,
                          ReadOptions(skip_corrupt=data.skip_corrupt, rank=0, world_size=1))
    loader: Iterable[Batch] = make_loader(dataset, reader_workers(data.num_readers, dataset.spec.frame_features),
                                          pin_memory=device.type == "cuda") if dataset.paths else []
    return dataset, loader


def evaluation_task(config: EvalConfig) -> Task:
    """The task eval scores: the run's features and loss, with the report section's depths and metrics."""
    return features_task(config.features, config.loss, config.report.top_k, config.report.top_n,
                         config.report.metrics)


def evaluate_latest(config: EvalConfig) -> dict[str, Any]:
    """The metrics of the train dir's latest readable checkpoint, in this process, with the report section's files
    written (--per_class, --report) and nothing written into the train dir (no metrics file, no TensorBoard point):
    for a report of a run evaluated already (`yt8m tune-report --report`)."""
    require_report_extras(config.report)
    device = resolve_device(config.data.device)
    found = load_latest_checkpoint(config.checkpoints.train_dir, map_location=device)
    if found is None:
        raise FileNotFoundError(f"no checkpoint in {config.checkpoints.train_dir}/checkpoints: train a model there "
                                "first")
    _, loader = evaluation_batches(config, device)
    return evaluate_payload(*found, loader, evaluation_task(config), config, device)


def _evaluate_checkpoints(config: EvalConfig, device: torch.device) -> Iterator[dict[str, Any]]:
    data, watch = config.data, config.checkpoints
    rank, world_size = rank_and_world_size()
    dataset, loader = evaluation_batches(config, device)
    task = evaluation_task(config)
    writer = summary_writer(os.path.join(watch.train_dir, "eval")) if rank == 0 else None
    evaluated: Optional[str] = None  # the checkpoint evaluated last
    looked_at: Optional[str] = None  # the newest checkpoint seen; an unreadable one is not loaded again
    said = ""
    try:
        while True:
            latest = decided_by_rank0(lambda: latest_checkpoint(watch.train_dir))
            if latest is None and watch.run_once:
                raise FileNotFoundError(f"no checkpoint in {watch.train_dir}/checkpoints: train a model there first")
            if latest is not None and latest != looked_at:
                looked_at = latest
                found = load_agreed_checkpoint(watch.train_dir, device)  # past unreadable ones
                if found is not None and found[0] != evaluated:
                    skipped_before = (dataset.skipped_files, dataset.skipped_records)
                    result = evaluate_payload(*found, loader, task, config, device, across_ranks=world_size > 1)
                    if data.skip_corrupt:
                        result.update(skipped_files=all_reduce_sum(dataset.skipped_files - skipped_before[0], CPU),
                                      skipped_records=all_reduce_sum(dataset.skipped_records - skipped_before[1], CPU))
                    if rank == 0:
                        write_metrics(watch.train_dir, result, writer, task.metric_names)
                    yield result
                    evaluated = found[0]
                    if watch.run_once:
                        return
                continue
            final = decided_by_rank0(lambda: final_checkpoint(watch.train_dir))
            if final is not None and final == looked_at:
                if final != evaluated:
                    log.warning("the final checkpoint %s is unreadable; the newest readable one, %s, was evaluated",
                                final, evaluated)
                log.info("evaluated the final checkpoint's run; done")
                return
            waiting = waiting_message(watch.train_dir, evaluated)
            if waiting != said:
                log.info("%s", waiting)
                said = waiting
            time.sleep(watch.poll_interval_secs)
    finally:
        if writer is not None:
            writer.close()


def load_agreed_checkpoint(train_dir: str, device: torch.device) -> Optional[tuple[str, Checkpoint]]:
    """The latest readable checkpoint (path, payload); under torchrun the one rank 0 found, loaded by every process."""
    if rank_and_world_size()[1] == 1:
        return load_latest_checkpoint(train_dir, map_location=device)
    path = decided_by_rank0(lambda: (load_latest_checkpoint(train_dir, map_location="cpu") or [None])[0])
    return None if path is None else (path, load_checkpoint(path, map_location=device))


def evaluate_payload(path: str, checkpoint: Checkpoint, loader: Iterable[Batch], task: Task,
                     config: EvalConfig, device: torch.device, across_ranks: bool = False) -> dict[str, Any]:
    """The task's metrics of a loaded checkpoint (from `path`); `across_ranks`: see evaluate_model."""
    trained = build_model_from_payload(checkpoint, path, device)
    step, pattern, report = trained.step, config.data.eval_data_pattern, config.report
    log.info("evaluating %s (step %d) on %s", path, step, pattern)
    diagnostics = Diagnostics(task.num_classes) if report.report else None
    metrics = evaluate_model(trained.network, loader, task, device, across_ranks, source=pattern,
                             per_class=bool(report.per_class or report.report), diagnostics=diagnostics)
    result = {"global_step": step, **{name: metrics[name] for name in task.metric_names}}
    log.info("step %d: %s", step, ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in result.items() if k != "global_step"))
    if (report.per_class or report.report) and rank_and_world_size()[0] == 0:
        table = class_table(report, config.checkpoints.train_dir, metrics["per_class"])
        if report.per_class:
            result["per_class"] = write_per_class(report.per_class, table)
        if diagnostics is not None:
            result["report"] = write_report(report.report, EvaluationReport(
                config, path, dict(result), table, metrics["per_class"], diagnostics))
    return result


def waiting_message(train_dir: str, evaluated: Optional[str]) -> str:
    """What a watching eval waits for, said once each time it changes (Ctrl+C stops the watch)."""
    done = f"evaluated {evaluated}" if evaluated else "no checkpoint yet"
    holder = train_dir_holder(train_dir) if storage.is_local(train_dir) else None
    trainer = (f"a trainer runs there ({describe_holder(holder)})" if holder else
               "no trainer runs there now: the run stopped before its last checkpoint, waiting until one resumes it"
               if storage.is_local(train_dir) else "whether a trainer runs there cannot be told on object storage")
    return (f"watching {train_dir}: {done}; {trainer}. Waiting for a newer checkpoint, until the run marks its last "
            f"one final (checkpoints/final). Ctrl+C stops; --run_once evaluates the latest and exits")


def wait_for(condition: Callable[[], bool], watch: WatchConfig) -> None:
    logged = False
    while not condition():
        if not logged:
            log.info("waiting for training to start in %s (its config.yaml); Ctrl+C stops", watch.train_dir)
            logged = True
        time.sleep(watch.poll_interval_secs)

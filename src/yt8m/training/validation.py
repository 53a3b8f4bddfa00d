"""Train and evaluate (`yt8m train --eval_data_pattern`): evaluation after checkpoints, best/latest/final
exports, early stopping and validation-driven learning-rate halving, with its state kept in checkpoints.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

from yt8m.data.reading.dataset import YT8MDataset, make_loader
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.data.reading.spec import DataConfig, FeatureSpec
from yt8m.eval.evaluate import evaluate_model, write_metrics
from yt8m.eval.metrics import HIGHER_IS_BETTER
from yt8m.eval.segment_metrics import top_n_setting
from yt8m.fields import setting
from yt8m.io.checkpoints import exported_checkpoint
from yt8m.io.summaries import summary_writer
from yt8m.runtime import reader_workers
from yt8m.tasks.metrics import higher_is_better, is_own_metric, metric_problem, metrics_problem
from yt8m.tasks.taskset import TaskSet, TaskSource, naming_tasks
from yt8m.training.best_models import Exporters
from yt8m.training.data import source_spec
from yt8m.training.memory_checks import cache_fits

log = logging.getLogger("yt8m.train_eval")

# evaluate(model, step) -> metrics (`evaluate_model`'s keys), run on rank 0 after a checkpoint of `step`.
EvaluateFn = Callable[[nn.Module, int], dict[str, Any]]


def best_metric_problem(name: str) -> Optional[str]:
    """The check of --best_metric: a metric (its task's own are checked with the tasks)."""
    metric = name.rpartition("/")[2]
    problem = metric_problem(metric)
    if is_own_metric(metric) or problem is None:
        return None
    if "/" not in name:
        return problem  # as the task's check says it, with the known names: the error's one line, not two
    return (f"must be TASK/METRIC with METRIC one of {', '.join(HIGHER_IS_BETTER)} or a metric of one's own, got "
            f"{name!r}: {problem}")



@dataclass(frozen=True)
class ValidationConfig:
    """The `validation` section: train and evaluate: which shards validate, when, which metric picks the best
    model, the exports kept, and what a run without improvement does."""

    eval_data_pattern: str = setting("", "Train and evaluate: evaluate on these shards after each checkpoint, export "
                                         "the best, latest and final models to <train_dir>/export.")
    eval_steps: Optional[int] = setting(None, "Evaluate on the first N batches of --eval_data_pattern (None: all).",
                                        at_least=1)
    eval_throttle_secs: float = setting(0.0, "Skip a checkpoint's evaluation when the previous one started less "
                                             "than this many seconds ago (the final checkpoint is always evaluated).",
                                        at_least=0)
    eval_start_delay_secs: float = setting(0.0, "Evaluate no checkpoint in the first N seconds of training (the "
                                                "final one is always evaluated).", at_least=0)
    best_metric: str = setting("gap", "Validation metric that picks the best model: gap, map, map_all_classes, "
                                      "hit_at_one, perr, segment_map (--segment_labels; higher is better), loss "
                                      "(lower is better), or a metric of one's own (see --metrics); with tasks "
                                      "TASK/METRIC (METRIC: the first task's).",
                               check=best_metric_problem, resolves=True)
    metrics: list[str] = setting([], "Metrics of one's own every task reports beside its own, each a registered name, "
                                     "entry point or import path (package.module:Name), with arguments as "
                                     "NAME(arg=value); --best_metric's is added.", check=metrics_problem, resolves=True)
    top_n: int = top_n_setting()
    keep_best_exports: int = setting(1, "Keep the newest N exports that improved --best_metric (export/best).",
                                     at_least=0)
    keep_latest_exports: int = setting(1, "Keep the newest N evaluated checkpoints (export/latest).", at_least=0)
    early_stopping_patience: int = setting(0, "Stop after this many evaluations in a row without improving "
                                              "--best_metric (0: never).", at_least=0)
    lr_halving_patience: int = setting(0, "Halve the learning rate after this many evaluations in a row without "
                                          "improvement (0: never); the factor is kept in checkpoints.", at_least=0)
    revert_to_best: bool = setting(False, "With --lr_halving_patience: each halving also reloads the best export's "
                                          "weights and optimizer state.")

    def problems(self) -> list[str]:
        problems = []
        if self.revert_to_best and not self.lr_halving_patience:
            problems.append("--revert_to_best acts when the learning rate is halved: set --lr_halving_patience")
        if self.revert_to_best and self.keep_best_exports < 1:
            problems.append("--revert_to_best reloads the best export: --keep_best_exports must be at least 1")
        return problems

    def without_evaluation_problems(self) -> list[str]:
        """What asks for evaluations that a run without them cannot give."""
        needs_eval = [name for name in ("early_stopping_patience", "lr_halving_patience", "revert_to_best")
                      if getattr(self, name)]
        return [f"--{name} needs --eval_data_pattern" for name in needs_eval]


@dataclass
class Verdict:
    """What the training loop does after an evaluation; rank 0 decides, every process applies it."""

    stop: bool = False
    halve_learning_rate: bool = False
    revert_to_step: Optional[int] = None  # reload the best export of this step


@dataclass
class ValidationState:
    """The evaluations so far, saved in every checkpoint so that a resumed run decides as the first would."""

    best_value: Optional[float] = None
    best_step: Optional[int] = None
    evaluations: int = 0
    since_improvement: int = 0  # evaluations in a row without improvement (early stopping)
    since_halving: int = 0  # the same, counted from the last improvement or halving (LR halving)
    last_step: int = -1  # the step of the last evaluation
    last_result: dict[str, Any] = field(default_factory=dict)
    stopped_early: bool = False
    # Multi-task runs: each validated task's best {"metric": TASK/METRIC, "value", "step"}, by task name.
    task_best: dict[str, dict[str, Any]] = field(default_factory=dict)


def validation_evaluator(validation: ValidationConfig, data: DataConfig, features: FeatureSpec, batch_size: int,
                         tasks: TaskSet, device: torch.device, reserve: int) -> EvaluateFn:
    """evaluate(model, step) -> metrics: every validated task's metrics on its own validation data, read by the
    task's head (all of it, or --eval_steps batches per data set), keyed as the task set names them; read as the
    training data is (`data`'s readers, damage and RAM cache, which must leave `reserve` bytes for the run)."""
    sources = tasks.validation_sources()
    # rank/world_size given: a distributed run's rank 0 evaluates the whole set, not its share of it.
    options = ReadOptions(skip_corrupt=data.skip_corrupt, rank=0, world_size=1, cache_in_memory=data.cache_in_memory)
    datasets = [YT8MDataset(source.pattern, source_spec(features, source), batch_size, options) for source in sources]
    if data.cache_in_memory and not cache_fits(datasets, data.cache_in_memory_required, reserve, "validation data"):
        for dataset in datasets:
            dataset.stream_instead_of_caching()
    loaders = [make_loader(dataset, reader_workers(data.num_readers, features.frame_features),
                           pin_memory=device.type == "cuda") for dataset in datasets]
    steps = validation.eval_steps

    def evaluate(model: nn.Module, step: int) -> dict[str, Any]:
        try:
            return evaluate_sources(model)
        except torch.OutOfMemoryError as err:
            raise out_of_memory_error("a validation batch", batch_size) from err

    def evaluate_sources(model: nn.Module) -> dict[str, Any]:
        results = {}
        for source, loader in zip(sources, loaders):
            for name in source.tasks:
                batches = loader if steps is None else itertools.islice(loader, steps)
                task = tasks.tasks[name].judged()
                with naming_tasks(TaskSource(source.pattern, source.segments, source.record_classes, [name])):
                    metrics = evaluate_model(tasks.view(model, name), batches, task, device=device)
                results.update({tasks.key(name, metric): metrics[metric] for metric in task.metric_names})
        return results

    return evaluate


def out_of_memory_error(where: str, batch_size: int) -> ValueError:
    """The GPU ran out of memory in `where` (a training step, a validation batch): one line naming the batch size
    and the flag that lowers it (validation reads batches of --batch_size too)."""
    return ValueError(f"out of GPU memory in {where} at --batch_size {batch_size}: lower --batch_size (with "
                      f"--numbatches_to_aggregate to keep the examples per optimizer step), or free GPU memory")


class TrainEvaluator:
    """Evaluates checkpoints of the live model, exports them, and judges progress on --best_metric."""

    def __init__(self, config: ValidationConfig, train_dir: str, evaluate: EvaluateFn, tasks: TaskSet):
        """`evaluate` returns the metrics keyed as `tasks` names them (TASK/METRIC for named tasks)."""
        self.config, self.train_dir = config, train_dir
        self.evaluate = evaluate
        self.tasks = tasks
        self.best_metric = tasks.best_metric_key(config.best_metric)
        self.exporters = Exporters(train_dir, config.keep_best_exports, config.keep_latest_exports)
        self.state = ValidationState()
        self.started = time.monotonic()
        self.last_started: Optional[float] = None
        self._writer = None

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = ValidationState(**state)

    def after_checkpoint(self, model: nn.Module, checkpoint: str, step: int) -> tuple[Verdict, Optional[dict]]:
        """Evaluate a periodic checkpoint unless throttled; (what to do, its metrics or None)."""
        now = time.monotonic()
        if now - self.started < self.config.eval_start_delay_secs:
            return Verdict(), None
        if self.last_started is not None and now - self.last_started < self.config.eval_throttle_secs:
            return Verdict(), None
        return self.judge(model, checkpoint, step)

    def replay(self, model: nn.Module, checkpoint: str, step: int) -> Verdict:
        """On resume: the checkpoint's own evaluation ran after it was saved, so it is not in its state;
        running it again (the same weights and data) reaches the same verdict the interrupted run did."""
        if step <= self.state.last_step:
            return Verdict()
        log.info("evaluating %s again: the interrupted run's verdict on it is not in the checkpoint", checkpoint)
        return self.judge(model, checkpoint, step)[0]

    def after_final(self, model: nn.Module, checkpoint: str, step: int) -> dict[str, Any]:
        """Evaluate the final checkpoint (unless its step already was) and export it; its metrics."""
        if step != self.state.last_step:
            self.judge(model, checkpoint, step)
        result = self.state.last_result
        self.exporters.export_final(checkpoint, result)
        if self._writer is not None:
            self._writer.close()
        return result

    def judge(self, model: nn.Module, checkpoint: str, step: int) -> tuple[Verdict, dict[str, Any]]:
        result = self._evaluate(model, step)
        state, metric = self.state, self.best_metric
        value = float(result[metric])
        if not math.isfinite(value):
            # Never a best value: every later comparison with a nan is False, so it would stay the best.
            raise ValueError(f"step {step}: validation {metric} is {value}, which cannot rank checkpoints (the "
                             "model's predictions or its data give no finite value)")
        state.evaluations += 1
        state.last_step, state.last_result = step, result
        verdict = Verdict()
        if self._improves(value):
            log.info("step %d: validation %s %.5f, the best so far", step, metric, value)
            state.best_value, state.best_step = value, step
            state.since_improvement = state.since_halving = 0
            self.exporters.export_best(checkpoint, result)
        else:
            state.since_improvement += 1
            state.since_halving += 1
            log.info("step %d: validation %s %.5f, no better than %.5f at step %d (%d evaluation(s) in a row)",
                     step, metric, value, state.best_value, state.best_step, state.since_improvement)
            verdict = self._react_to_no_improvement()
        self._track_task_best(result, step)
        self.exporters.export_latest(checkpoint, result)
        return verdict, result

    def _track_task_best(self, result: dict[str, Any], step: int) -> None:
        for spec in self.tasks.specs if self.tasks.named else []:
            if spec.metric_key not in result:
                continue
            value, best = float(result[spec.metric_key]), self.state.task_best.get(spec.name)
            if best is None or better(spec.objective.metric, value, best["value"]):
                self.state.task_best[spec.name] = {"metric": spec.metric_key, "value": value, "step": step}

    def summary(self) -> dict[str, Any]:
        state = self.state
        summary: dict[str, Any] = {"best_metric": self.best_metric, "best_value": state.best_value,
                   "best_step": state.best_step, "evaluations": state.evaluations,
                   "stopped_early": state.stopped_early}
        if self.tasks.named:
            summary["task_best"] = state.task_best
        return summary

    def _evaluate(self, model: nn.Module, step: int) -> dict[str, Any]:
        self.last_started = time.monotonic()
        # Evaluation may draw random numbers (frame sampling, the loader's seed): keep them out of training's.
        devices = [next(model.parameters()).device] if next(model.parameters()).is_cuda else []
        with torch.random.fork_rng(devices=devices):
            metrics = self.evaluate(model, step)
        result = {"global_step": step, **metrics}
        write_metrics(self.train_dir, result, self._summary_writer(), list(metrics))
        return result

    def _improves(self, value: float) -> bool:
        best = self.state.best_value
        return best is None or better(self.best_metric.rpartition("/")[2], value, best)

    def _react_to_no_improvement(self) -> Verdict:
        state, config = self.state, self.config
        verdict = Verdict()
        if config.lr_halving_patience and state.since_halving >= config.lr_halving_patience:
            state.since_halving = 0
            verdict.halve_learning_rate = True
            if config.revert_to_best:
                verdict.revert_to_step = state.best_step
        if config.early_stopping_patience and state.since_improvement >= config.early_stopping_patience:
            log.info("early stopping: %d evaluations without improving %s", state.since_improvement,
                     self.best_metric)
            state.stopped_early = verdict.stop = True
        return verdict

    def _summary_writer(self):
        if self._writer is None:
            self._writer = summary_writer(os.path.join(self.train_dir, "eval"))
        return self._writer


def better(metric: str, value: float, best: float) -> bool:
    """Whether `value` of `metric` improves on `best`."""
    return value > best if higher_is_better(metric) else value < best


def best_export_checkpoint(train_dir: str, step: int) -> str:
    """The checkpoint file of the best export of `step`, which --revert_to_best reloads."""
    return exported_checkpoint(train_dir, "best", step)

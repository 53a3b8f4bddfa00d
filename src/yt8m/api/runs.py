"""train, evaluate, predict and tune from Python: keyword arguments named as the flags (or a config object), checked
as the commands check them (every problem in one ValueError), writing the run directories the commands read."""

from __future__ import annotations

import collections
from typing import Any, Callable, Optional

from yt8m.config import C, DataclassInstance, config_from_dict, config_values, flattened
from yt8m.eval.config import EvalConfig
from yt8m.eval.evaluate import evaluate_run
from yt8m.inference.config import PredictConfig
from yt8m.inference.predict import run_predict
from yt8m.training.checks import train_config_problems
from yt8m.training.config import TrainConfig
from yt8m.training.stopping import raise_if_interrupted
from yt8m.training.trainer import train as run_training
from yt8m.tuning.runner import raise_failures, tune_from_file


def train(config: Optional[TrainConfig] = None, **values: Any) -> dict[str, Any]:
    """Train a model as `yt8m train` does (checkpoints, config.yaml and exports in its train_dir, which `yt8m eval`,
    `predict` and `export` read); returns the summary the command prints.

    Args:
        config: a TrainConfig to start from (default: every setting at its default).
        **values: settings by flag name (`model="MoeModel", moe_num_mixtures=4, base_learning_rate=0.01`, a model's or
            a loss's hyper-parameters included), or sections by name (`optimizer={"base_learning_rate": 0.01}`); they
            replace the config's.

    Returns:
        The summary: global_step, examples, the final loss, the train dir, and (with eval_data_pattern) the best
        validation metrics.

    Raises:
        ValueError: the settings have problems (all of them named, in one message), or the data cannot be read.
        TrainingInterrupted: Ctrl+C (a notebook's interrupt) or SIGTERM stopped it between two steps; its progress
            is saved, and the same call resumes it.

    Examples:
        >>> import os, tempfile, numpy as np, yt8m
        >>> folder = tempfile.mkdtemp()
        >>> rng = np.random.default_rng(0)
        >>> videos = [{"id": f"v{i}", "labels": [i % 2], "features": {"clip": rng.normal(i % 2, 1, 8)}}
        ...           for i in range(64)]
        >>> _ = yt8m.write_videos(os.path.join(folder, "train.tfrecord"), videos)
        >>> summary = yt8m.train(train_data_pattern=os.path.join(folder, "train.tfrecord"), num_classes=2,
        ...                      feature_names="clip", feature_sizes="8", train_dir=os.path.join(folder, "run"),
        ...                      num_epochs=2, batch_size=16)
        >>> summary["global_step"]
        8
    """
    summary = run_training(_checked(TrainConfig, config, values, "yt8m.train()", train_config_problems), checked=True)
    raise_if_interrupted(summary)
    return summary


def evaluate(config: Optional[EvalConfig] = None, **values: Any) -> dict[str, Any]:
    """Evaluate a train dir's latest checkpoint as `yt8m eval --run_once` does (the run's features, model, loss and
    metrics read from its config.yaml, in a process that imports nothing else by hand); returns its metrics.

    Args:
        config: an EvalConfig to start from.
        **values: settings by flag name: train_dir and eval_data_pattern at least; run_once=False watches the run
            and returns the metrics of its final checkpoint.

    Returns:
        The metrics of the checkpoint (gap, map, hit_at_one, perr, loss, num_videos, any of one's own), with its
        global_step.

    Raises:
        ValueError: the settings have problems, or disagree with the train dir's (all named in one message).
        FileNotFoundError: train_dir holds no run.

    Examples:
        >>> import os, tempfile, numpy as np, yt8m
        >>> folder = tempfile.mkdtemp()
        >>> rng = np.random.default_rng(0)
        >>> videos = [{"id": f"v{i}", "labels": [i % 2], "features": {"clip": rng.normal(3 * (i % 2), 1, 8)}}
        ...           for i in range(64)]
        >>> _ = yt8m.write_videos(os.path.join(folder, "videos.tfrecord"), videos)
        >>> run = os.path.join(folder, "run")
        >>> _ = yt8m.train(train_data_pattern=os.path.join(folder, "videos.tfrecord"), train_dir=run, num_classes=2,
        ...                feature_names="clip", feature_sizes="8", num_epochs=10, batch_size=16,
        ...                base_learning_rate=0.1)
        >>> metrics = yt8m.evaluate(train_dir=run, eval_data_pattern=os.path.join(folder, "videos.tfrecord"))
        >>> metrics["hit_at_one"] > 0.9
        True
    """
    given = _values(EvalConfig, config, {"run_once": True, **values})
    last = collections.deque(evaluate_run(given, "yt8m.evaluate()"), maxlen=1)
    return last[0] if last else {}


def predict(config: Optional[PredictConfig] = None, **values: Any) -> dict[str, Any]:
    """Write predictions as `yt8m predict` does (Kaggle CSV or JSON lines, from a train dir's latest checkpoint or
    an ONNX export); returns the summary of what was written.

    Args:
        config: a PredictConfig to start from.
        **values: settings by flag name: train_dir (or input_model), input_data_pattern and output_file at least.

    Raises:
        ValueError: the settings have problems (all named in one message), or the input cannot be read.
    """
    return run_predict(_checked(PredictConfig, config, values, "yt8m.predict()"))


def tune(config: str, **values: Any) -> dict[str, Any]:
    """Run (or resume) a study as `yt8m tune --config FILE` does: trials in `n_jobs` processes until the study has
    `n_trials`, then its report, best.yaml and leaderboard in its study_dir; returns the summary.

    Args:
        config: the tuning file (train:, search:, objective:, tune: sections).
        **values: its `tune:` settings by flag name (n_trials, n_jobs, study_dir, ...), trial_timeout,
            train_data_pattern and eval_data_pattern; they replace the file's.

    Raises:
        ValueError: the file or the settings have problems (all named in one message), or no trial completed.
        ChildProcessError: a trial process died (the study is resumable: call again).
    """
    _, _, summary = tune_from_file(config, values)
    raise_failures(summary)
    return summary


def _values(cls: type, config: Optional[DataclassInstance], values: dict[str, Any]) -> dict[str, Any]:
    """The config's settings by flag with `values` over them; a config of another class is a ValueError."""
    if config is not None and not isinstance(config, cls):
        raise ValueError(f"config must be a {cls.__name__}, got {type(config).__name__}")
    return {**(config_values(config) if config is not None else {}), **flattened(cls, values)}


def _checked(cls: type[C], config: Optional[C], values: dict[str, Any], source: str,
             checks: Optional[Callable[[Any, Any], list[str]]] = None) -> C:
    """The config of `values` over `config`, typed and checked as the command's flags are (a config built by hand is
    read back by its values, so a value of the wrong type is one of the problems, not a TypeError): a ConfigError (a
    ValueError) lists every problem."""
    return config_from_dict(cls, _values(cls, config, values), source=source, checks=checks)

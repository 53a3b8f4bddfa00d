"""train, evaluate, predict and tune from Python: keyword arguments named as the flags (or a config object), checked
as the commands check them (every problem in one ValueError), writing the run directories the commands read."""

from __future__ import annotations

import collections
import os
from typing import Any, Union

from torch import nn

from yt8m.api.components import named_components, warn_or_refuse_process_local
from yt8m.api.configs import ConfigGiven, checked_config, given_values
from yt8m.api.main_guard import refuse_unguarded_jobs
from yt8m.config import config_values, flattened, load_yaml
from yt8m.eval.config import EvalConfig
from yt8m.eval.evaluate import evaluate_run
from yt8m.inference.config import PredictConfig
from yt8m.inference.predict import run_predict
from yt8m.io.checkpoints import load_latest_checkpoint
from yt8m.models.checkpoints import build_model_from_payload
from yt8m.training.checks import train_config_problems
from yt8m.training.config import TrainConfig
from yt8m.training.stopping import raise_if_interrupted
from yt8m.training.trainer import train as run_training
from yt8m.tuning.devices import job_count
from yt8m.tuning.runner import raise_failures, tune_from_file


class TrainResult(dict[str, Any]):
    """What `train` returns: the summary the command prints (a dict), and `model()`, the model it trained."""

    def model(self, device: str = "cpu") -> nn.Module:
        """The trained model (weights of the run's newest readable checkpoint, in eval mode), loaded as `yt8m eval`
        and `predict` load it."""
        found = load_latest_checkpoint(self["train_dir"], map_location=device)
        if found is None:
            raise FileNotFoundError(f"no checkpoint in {self['train_dir']}/checkpoints")
        path, checkpoint = found
        return build_model_from_payload(checkpoint, path, device).network


def train(config: ConfigGiven = None, **values: Any) -> TrainResult:
    """Train a model as `yt8m train` does (checkpoints, config.yaml and exports in its train_dir, which `yt8m eval`,
    `predict` and `export` read); returns the summary the command prints, and the model.

    Components (`model`, `label_loss`, `video_level_classifier_model`, `best_metric`, `metrics`) are given by name
    or import path, or as objects: a class or function importable from its module is recorded in config.yaml as
    `module:QualName`, which `yt8m eval`, tune jobs and torchrun ranks import again (its folder on their
    PYTHONPATH); one defined in `__main__` (a script, a notebook) or in a function is registered in this process
    under its name, with a warning that no other process can find it, and refused where the run needs others
    (`num_gpu` > 1). `functools.partial(loss, scale=2.0)` is the loss with those hyper-parameters. An instance of a
    loss or metric class is that class with its arguments, read back from its attributes of the same names (or its
    `hparams`), and refused (one line) where they cannot be; a model instance is refused: a run builds its model
    afresh from the class.

    Args:
        config: a TrainConfig, a YAML file's path (as `--config FILE`) or a dict of the same names to start from
            (default: every setting at its default).
        **values: settings by flag name (`model="MoeModel", moe_num_mixtures=4, base_learning_rate=0.01`, a model's or
            a loss's hyper-parameters included), or sections by name (`optimizer={"base_learning_rate": 0.01}`); they
            replace the config's.

    Returns:
        The summary, a dict: global_step, examples, the final loss, the train dir, and (with eval_data_pattern) the
        best validation metrics; its `model()` is the trained nn.Module.

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
        >>> import torch
        >>> summary.model()(torch.rand(3, 8))["predictions"].shape
        torch.Size([3, 2])
    """
    checked = checked_config(TrainConfig, config, values, "yt8m.train()", train_config_problems)
    warn_or_refuse_process_local(config_values(checked), checked.runtime.num_gpu, "num_gpu")
    summary = run_training(checked, checked=True)
    raise_if_interrupted(summary)
    return TrainResult(summary, train_dir=checked.checkpoints.train_dir)


def evaluate(config: ConfigGiven = None, **values: Any) -> dict[str, Any]:
    """Evaluate a train dir's latest checkpoint as `yt8m eval --run_once` does (the run's features, model, loss and
    metrics read from its config.yaml, in a process that imports nothing else by hand); returns its metrics.

    Args:
        config: an EvalConfig, a YAML file's path or a dict to start from.
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
    given = given_values(EvalConfig, config, {"run_once": True, **values})
    last = collections.deque(evaluate_run(given, "yt8m.evaluate()"), maxlen=1)
    return last[0] if last else {}


def predict(config: ConfigGiven = None, **values: Any) -> dict[str, Any]:
    """Write predictions as `yt8m predict` does (Kaggle CSV or JSON lines, from a train dir's latest checkpoint or
    an ONNX export); returns the summary of what was written.

    Args:
        config: a PredictConfig, a YAML file's path or a dict to start from.
        **values: settings by flag name: train_dir (or model, an ONNX export; or input_model_tgz),
            input_data_pattern and output_file at least.

    Raises:
        ValueError: the settings have problems (all named in one message), or the input cannot be read.
    """
    return run_predict(checked_config(PredictConfig, config, values, "yt8m.predict()"))


def tune(config: Union[str, "os.PathLike[str]", dict[str, Any]], **values: Any) -> dict[str, Any]:
    """Run (or resume) a study as `yt8m tune --config FILE` does: trials in `n_jobs` processes until the study has
    `n_trials`, then its report, best.yaml and leaderboard in its study_dir; returns the summary.

    Args:
        config: the tuning file (train:, search:, objective:, tune: sections), or a dict of those sections (its
            `train:` components by name or as objects, as `train` takes them).
        **values: its `tune:` settings by flag name (n_trials, n_jobs, study_dir, ...), trial_timeout,
            train_data_pattern and eval_data_pattern; they replace the file's.

    Raises:
        ValueError: the file or the settings have problems (all named in one message), or no trial completed.
        ChildProcessError: a trial process died (the study is resumable: call again).
        SystemExit: n_jobs > 1 from a script whose call is not under `if __name__ == "__main__":` (each job
            process imports the script again, which would start the study again): one line saying so.
    """
    if isinstance(config, dict):
        config = _named_tune_components(config, values)
    refuse_unguarded_jobs(job_count(values.get("n_jobs", _tune_setting(config, "n_jobs")) or 1))
    _, _, summary = tune_from_file(os.fspath(config) if not isinstance(config, dict) else config, values)
    raise_failures(summary)
    return summary


def _tune_setting(config: Union[str, "os.PathLike[str]", dict[str, Any]], name: str) -> Any:
    """A `tune:` setting of a tuning file or dict, as given (None where not), for the checks made before its
    reading."""
    document = config if isinstance(config, dict) else load_yaml(os.fspath(config))
    section = document.get("tune")
    return section.get(name) if isinstance(section, dict) else None


def _named_tune_components(config: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A tuning dict with the components of its `train:` section given as objects named; one only this process
    finds is refused where trials run in job processes."""
    train_section = config.get("train")
    if not isinstance(train_section, dict):
        return config
    named = named_components(flattened(TrainConfig, train_section))
    jobs = job_count(values.get("n_jobs", _tune_setting(config, "n_jobs")) or 1)
    warn_or_refuse_process_local(named, jobs, "n_jobs")
    return {**config, "train": named}

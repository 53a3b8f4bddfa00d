"""export, ensemble, score and tune_report from Python: the rest of the workflow as the `yt8m` commands run it (the
same library functions, keyword arguments named as their flags, checked as the commands check them)."""

from __future__ import annotations

from typing import Any

from yt8m.api.configs import ConfigGiven, checked_config, given_values
from yt8m.eval.scoring import ScoreConfig, run_score
from yt8m.inference.config import EnsembleConfig
from yt8m.inference.ensemble import run_ensemble
from yt8m.inference.exporting import ExportConfig, run_export
from yt8m.tuning.reporting import TuneReportConfig, run_tune_report


def export(config: ConfigGiven = None, **values: Any) -> dict[str, Any]:
    """Export a train dir's latest checkpoint (or a given one) as an ONNX model with its metadata JSON, as
    `yt8m export` does; `predict(model=...)` and `ensemble` read it.

    Args:
        config: a dict or a YAML file's path of the same names to start from.
        **values: settings by flag name: output (FILE.onnx or a folder), and train_dir or checkpoint; task (of a
            multi-task run).

    Returns:
        What the command prints: the files written (model_file, metadata_file), the opset and the largest
        difference between onnxruntime's predictions and torch's.

    Raises:
        ValueError: the settings have problems (all named in one message).
        FileNotFoundError: the train dir holds no checkpoint.

    Examples:
        >>> import os, tempfile, numpy as np, yt8m
        >>> folder = tempfile.mkdtemp()
        >>> rng = np.random.default_rng(0)
        >>> videos = [{"id": f"v{i}", "labels": [i % 2], "features": {"clip": rng.normal(i % 2, 1, 8)}}
        ...           for i in range(32)]
        >>> shards = os.path.join(folder, "videos.tfrecord")
        >>> _ = yt8m.write_videos(shards, videos)
        >>> run = os.path.join(folder, "run")
        >>> _ = yt8m.train(train_data_pattern=shards, train_dir=run, num_classes=2, feature_names="clip",
        ...                feature_sizes="8", num_epochs=1, batch_size=16)
        >>> exported = yt8m.export(train_dir=run, output=os.path.join(folder, "model.onnx"))
        >>> os.path.basename(exported["model_file"]), exported["verified_max_abs_diff"] < 1e-4
        ('model.onnx', True)
    """
    return run_export(checked_config(ExportConfig, config, values, "yt8m.export()"))


def ensemble(config: ConfigGiven = None, **values: Any) -> dict[str, Any]:
    """Write the weighted average of train dirs', ONNX exports' and prediction files' probabilities, as
    `yt8m ensemble` does (the output settings `predict`'s), the weights given or fitted for GAP on labelled shards.

    Args:
        config: an EnsembleConfig, a dict or a YAML file's path to start from.
        **values: settings by flag name: inputs (a list), output_file, and input_data_pattern where an input is a
            train dir or an export; weights, or fit_weights_on (labelled shards).

    Returns:
        The summary of what was written: output_file, videos, and each input with its weight.

    Raises:
        ValueError: the settings have problems (all named in one message), or an input cannot be read.

    Examples:
        >>> import os, tempfile, numpy as np, yt8m
        >>> folder = tempfile.mkdtemp()
        >>> rng = np.random.default_rng(0)
        >>> videos = [{"id": f"v{i}", "labels": [i % 2], "features": {"clip": rng.normal(i % 2, 1, 8)}}
        ...           for i in range(32)]
        >>> shards = os.path.join(folder, "videos.tfrecord")
        >>> _ = yt8m.write_videos(shards, videos)
        >>> runs = [os.path.join(folder, name) for name in ("a", "b")]
        >>> for run, rate in zip(runs, (0.01, 0.1)):
        ...     _ = yt8m.train(train_data_pattern=shards, train_dir=run, num_classes=2, feature_names="clip",
        ...                    feature_sizes="8", num_epochs=1, batch_size=16, base_learning_rate=rate)
        >>> summary = yt8m.ensemble(inputs=runs, weights=[3, 1], input_data_pattern=shards,
        ...                         output_file=os.path.join(folder, "ensemble.csv"))
        >>> summary["videos"], [member["weight"] for member in summary["inputs"]]
        (32, [0.75, 0.25])
    """
    given = given_values(EnsembleConfig, config, values)
    return run_ensemble(checked_config(EnsembleConfig, config, values, "yt8m.ensemble()"),
                        num_classes_given="num_classes" in given)


def score(config: ConfigGiven = None, **values: Any) -> dict[str, Any]:
    """Score a Kaggle-format submission (`VideoId,LabelConfidencePairs`) against its ground truth (a
    `VideoId,Labels` CSV or the labelled shards) with the starter kit's metrics, or with segment_labels a 2019
    segment submission with mAP@K, as `yt8m score` does.

    Args:
        config: a dict or a YAML file's path of the same names to start from.
        **values: settings by flag name: predictions and labels at least; top_k, num_classes, allow_missing.

    Returns:
        The scores (gap, map, hit_at_one, perr, num_videos; segment_map with segment_labels).

    Raises:
        ValueError: the settings have problems, or a file cannot be read (its line named).

    Examples:
        >>> import os, tempfile, yt8m
        >>> folder = tempfile.mkdtemp()
        >>> with open(os.path.join(folder, "submission.csv"), "w") as out:
        ...     _ = out.write("VideoId,LabelConfidencePairs\\nv0,1 0.9 0 0.2\\nv1,0 0.8 1 0.1\\n")
        >>> with open(os.path.join(folder, "labels.csv"), "w") as out:
        ...     _ = out.write("VideoId,Labels\\nv0,1\\nv1,0\\n")
        >>> scores = yt8m.score(predictions=os.path.join(folder, "submission.csv"),
        ...                     labels=os.path.join(folder, "labels.csv"), num_classes=2)
        >>> scores["hit_at_one"]
        1.0
    """
    return run_score(checked_config(ScoreConfig, config, values, "yt8m.score()"))


def tune_report(config: ConfigGiven = None, **values: Any) -> dict[str, Any]:
    """Rewrite a study's leaderboard, best.yaml and plots from its database, as `yt8m tune-report` does, and do
    what the settings ask of its best trials: retrain_best, ensemble_top K, refit_top K, report (an HTML page).

    Args:
        config: a dict or a YAML file's path of the same names to start from.
        **values: settings by flag name: study_dir (a `tune` study's) at least.

    Returns:
        The summary the command prints (best_value, best_params, the files written, and what the settings asked
        for under its name: ensemble, retrain, refit, report).

    Raises:
        ValueError: the settings have problems, or study_dir holds no study.

    Examples:
        >>> import os, tempfile, numpy as np, yt8m
        >>> folder = tempfile.mkdtemp()
        >>> rng = np.random.default_rng(0)
        >>> for split in ("train", "validate"):
        ...     videos = [{"id": f"{split}{i}", "labels": [i % 2], "features": {"clip": rng.normal(i % 2, 1, 8)}}
        ...               for i in range(32)]
        ...     _ = yt8m.write_videos(os.path.join(folder, f"{split}.tfrecord"), videos)
        >>> study = os.path.join(folder, "study")
        >>> _ = yt8m.tune({"train": {"train_data_pattern": os.path.join(folder, "train.tfrecord"),
        ...                          "eval_data_pattern": os.path.join(folder, "validate.tfrecord"),
        ...                          "feature_names": "clip", "feature_sizes": "8", "num_classes": 2,
        ...                          "num_epochs": 1, "batch_size": 16, "num_readers": 0},
        ...                "search": {"base_learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
        ...                "objective": {"metric": "gap", "direction": "maximize"},
        ...                "tune": {"study_dir": study, "n_trials": 2, "n_startup_trials": 1}})
        >>> report = yt8m.tune_report(study_dir=study)
        >>> sorted(report["best_params"])
        ['base_learning_rate']
    """
    return run_tune_report(checked_config(TuneReportConfig, config, values, "yt8m.tune_report()"),
                           show_leaderboard=False)

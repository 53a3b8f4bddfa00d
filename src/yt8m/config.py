"""Typed configuration: one flat dataclass per command, filled from YAML files and CLI flags.

Flag names and defaults follow the YouTube-8M starter code, so an old command line pastes as is.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

import yaml

from yt8m.files import write_file_atomically

T = TypeVar("T")


def setting(default: Any, help: str) -> Any:
    """A config field with its default and the help text its flag shows."""
    return field(default=default, metadata={"help": help})


@dataclass
class DataConfig:
    """How records are read and decoded; shared by train, eval and predict."""

    feature_names: str = setting("mean_rgb", "Comma-separated feature names, concatenated in this order.")
    feature_sizes: str = setting("1024", "Comma-separated sizes of the features in --feature_names.")
    frame_features: bool = setting(False, "Read frame-level SequenceExamples instead of video-level Examples.")
    max_frames: int = setting(300, "Frame-level: keep at most this many frames per video.")
    num_classes: int = setting(3862, "Number of classes (3862 for 2018+ data, 4716 for 2017 data).")
    num_readers: int = setting(8, "DataLoader worker processes reading the shards.")
    skip_corrupt: bool = setting(False, "Skip the rest of a shard after a corrupt record (with a warning) instead of failing.")


@dataclass
class ModelConfig:
    """The model and its hyper-parameters (starter-kit flag names and defaults)."""

    model: str = setting("LogisticModel", "Model class name, e.g. LogisticModel, MoeModel, DbofModel.")
    l2_penalty: float = setting(1e-8, "L2 weight of the model's classifier weights.")
    moe_num_mixtures: int = setting(2, "MoeModel: number of experts per class (plus one dummy expert).")
    iterations: int = setting(30, "DbofModel: number of frames sampled per video.")
    sample_random_frames: bool = setting(True, "DbofModel: sample random frames (else a random contiguous run).")
    dbof_cluster_size: int = setting(8192, "DbofModel: number of units in the cluster layer.")
    dbof_hidden_size: int = setting(1024, "DbofModel: number of units in the hidden layer.")
    dbof_add_batch_norm: bool = setting(True, "DbofModel: add batch normalization layers.")
    dbof_pooling_method: str = setting("max", "DbofModel: frame pooling, 'max' or 'average'.")
    video_level_classifier_model: str = setting("MoeModel", "Frame models: the video-level classifier on top.")
    lstm_cells: int = setting(1024, "LstmModel: units per LSTM layer.")
    lstm_layers: int = setting(2, "LstmModel: number of stacked LSTM layers.")


@dataclass
class TrainConfig(ModelConfig, DataConfig):
    """Everything `yt8m train` needs."""

    train_data_pattern: str = setting("", "File glob(s) of training shards; comma-separated for several.")
    train_dir: str = setting("/tmp/yt8m_model/", "Directory for checkpoints, logs and the resolved config.")
    label_loss: str = setting("CrossEntropyLoss", "Loss: CrossEntropyLoss, HingeLoss or SoftmaxLoss.")
    regularization_penalty: float = setting(1.0, "Weight of the models' L2 penalties in the loss.")
    batch_size: int = setting(1024, "Examples per batch in each process; one optimizer step takes the global batch "
                               "batch_size x processes x --numbatches_to_aggregate (4 torchrun processes with "
                               "--batch_size 256 step on 1024 examples, as one process with 1024).")
    base_learning_rate: float = setting(0.01, "Initial learning rate.")
    learning_rate_decay: float = setting(0.95, "Learning rate multiplier per --learning_rate_decay_examples.")
    learning_rate_decay_examples: int = setting(4000000, "Examples between learning-rate decays (staircase).")
    num_epochs: int = setting(5, "Passes over the training data.")
    max_steps: Optional[int] = setting(None, "Stop after this many steps (None: after --num_epochs).")
    optimizer: str = setting("Adam", "Any torch.optim class name (TF names such as AdamOptimizer accepted).")
    clip_gradient_norm: float = setting(1.0, "Clip each parameter's gradient to this norm, as the starter kit's "
                                        "per-variable clip_by_norm (0 disables).")
    clip_gradient_value: float = setting(0.0, "Clip each gradient element to [-v, v] before the norm clipping (0 "
                                         "disables); --clip_gradient_norm 0 leaves value clipping alone.")
    numbatches_to_aggregate: int = setting(1, "Accumulate gradients over this many batches per optimizer step: the "
                                         "same update as one batch this many times larger.")
    export_model_steps: int = setting(1000, "Write a checkpoint every this many steps.")
    keep_checkpoints: int = setting(5, "Keep only the newest N periodic checkpoints.")
    start_new_model: bool = setting(False, "Delete the train dir's checkpoints and start from scratch.")
    shuffle_buffer: int = setting(10000, "Records held in the shuffle buffer of each reader.")
    cache_in_memory: bool = setting(False, "Video-level: hold the decoded training set in RAM after the first epoch.")
    seed: int = setting(0, "Seed for initialization, shuffling and sampling.")
    device: str = setting("auto", "'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'.")
    mixed_precision: bool = setting(False, "Train with autocast: CUDA bfloat16 (float16 with loss scaling where the "
                                    "GPU lacks it); CPU bfloat16, fast where the CPU has AMX or AVX512-BF16.")
    compile: bool = setting(False, "torch.compile the forward pass and loss: fused elementwise work, after a compile at start.")
    log_every_steps: int = setting(1, "Log the step's loss and examples/s every this many steps.")
    metrics_every_steps: int = setting(10, "Log and summarize the batch's Hit@1, PERR and GAP every this many steps.")
    init_from: str = setting("", "A new run starts from the parameters of this checkpoint (or train dir) that match "
                            "by name and shape; the log lists what was not loaded.")
    num_gpu: int = setting(1, "GPUs to train on, one process each: above 1, `yt8m train` relaunches itself under "
                         "torchrun (--nproc_per_node N); under torchrun it is informational.")
    eval_data_pattern: str = setting("", "Train and evaluate: evaluate on these shards after each checkpoint, export "
                                    "the best, latest and final models to <train_dir>/export.")
    eval_steps: Optional[int] = setting(None, "Evaluate on the first N batches of --eval_data_pattern (None: all).")
    eval_throttle_secs: float = setting(0.0, "Skip a checkpoint's evaluation when the previous one started less "
                                        "than this many seconds ago (the final checkpoint is always evaluated).")
    eval_start_delay_secs: float = setting(0.0, "Evaluate no checkpoint in the first N seconds of training (the "
                                           "final one is always evaluated).")
    best_metric: str = setting("gap", "Validation metric that picks the best model: gap, map, map_all_classes, "
                                 "hit_at_one, perr (higher is better) or loss (lower is better).")
    keep_best_exports: int = setting(1, "Keep the newest N exports that improved --best_metric (export/best).")
    keep_latest_exports: int = setting(1, "Keep the newest N evaluated checkpoints (export/latest).")
    early_stopping_patience: int = setting(0, "Stop after this many evaluations in a row without improving "
                                         "--best_metric (0: never).")
    lr_halving_patience: int = setting(0, "Halve the learning rate after this many evaluations in a row without "
                                     "improvement (0: never); the factor is kept in checkpoints.")
    revert_to_best: bool = setting(False, "With --lr_halving_patience: each halving also reloads the best export's "
                                     "weights and optimizer state.")


# The fields that define what a checkpoint's model is: resuming, evaluating or predicting with other
# values would load weights into a different network or score a different task.
MODEL_IDENTITY_FIELDS = ("model", "feature_names", "feature_sizes", "frame_features", "num_classes", "label_loss")


@dataclass
class EvalConfig(ModelConfig, DataConfig):
    """Everything `yt8m eval` needs; model and data fields not given are read from the train dir."""

    eval_data_pattern: str = setting("", "File glob(s) of the shards to evaluate on; comma-separated for several.")
    train_dir: str = setting("/tmp/yt8m_model/", "The train dir whose checkpoints are evaluated.")
    label_loss: str = setting("CrossEntropyLoss", "Loss reported in the metrics; the train dir's when not given.")
    run_once: bool = setting(False, "Evaluate the latest checkpoint and exit, instead of watching for new ones.")
    top_k: int = setting(20, "Predictions per video counted by GAP.")
    batch_size: int = setting(1024, "Examples per evaluation batch.")
    poll_interval_secs: float = setting(10.0, "Watch mode: seconds between looks for a new checkpoint.")
    device: str = setting("auto", "'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'.")


@dataclass
class PredictConfig:
    """Everything `yt8m predict` needs; features and model come from the train dir's checkpoint or the
    ONNX export's metadata."""

    input_data_pattern: str = setting("", "File glob(s) of the shards to predict; labels are not needed.")
    train_dir: str = setting("", "The train dir whose latest checkpoint predicts (or give --model).")
    model: str = setting("", "An ONNX export (`yt8m export --output`: FILE.onnx or DIR) to predict with onnxruntime.")
    output_file: str = setting("", "The file to write: a Kaggle CSV (VideoId,LabelConfidencePairs) or JSON lines.")
    output_format: str = setting("csv", "'csv' (Kaggle) or 'jsonl': one {video_id, class_indexes, predictions} per line.")
    top_k: int = setting(20, "Predictions written per video.")
    batch_size: int = setting(8192, "Examples per prediction batch.")
    num_readers: int = setting(1, "DataLoader worker processes reading the shards.")
    skip_corrupt: bool = setting(False, "Skip the rest of a shard after a corrupt record instead of failing.")
    device: str = setting("auto", "'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'.")


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def field_type(cls: type, name: str) -> type:
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return hint


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "t", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "f", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def _coerce(cls: type, name: str, value: Any, source: str) -> Any:
    if value is None:
        return None
    kind = field_type(cls, name)
    try:
        if kind is bool:
            return parse_bool(value)
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if kind is float:
            return float(value)
        if kind is str:
            return str(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as err:
        raise ValueError(f"{source}: field '{name}' expects {kind.__name__}, got {value!r}") from err
    return value


def config_from_dict(cls: type[T], values: dict[str, Any], source: str = "config") -> T:
    """Build `cls` from a mapping, naming every unknown or ill-typed field in one error."""
    known = set(field_names(cls))
    unknown = sorted(set(values) - known)
    problems = [f"{source}: unknown field '{k}'" for k in unknown]
    coerced = {}
    for key, value in values.items():
        if key in known:
            try:
                coerced[key] = _coerce(cls, key, value, source)
            except ValueError as err:
                problems.append(str(err))
    if problems:
        raise ValueError("\n".join(problems))
    return cls(**coerced)


def load_yaml(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        raise FileNotFoundError(f"config file not found: {path}")
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config file must hold a mapping of field: value")
    return data


def save_config(config: Any, path: str) -> None:
    write_file_atomically(path, lambda out: yaml.safe_dump(dataclasses.asdict(config), out, sort_keys=False))


def load_config(cls: type[T], path: str) -> T:
    return config_from_dict(cls, load_yaml(path), source=path)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one `--name` flag per field; booleans also take `--noname` and `--name=false`.

    Defaults are suppressed so that `parse_config` can tell which flags were given.
    """
    for f in dataclasses.fields(cls):
        kind = field_type(cls, f.name)
        help_text = f"{f.metadata.get('help', '')} (default: {f.default})"
        if kind is bool:
            parser.add_argument(f"--{f.name}", nargs="?", const=True, type=parse_bool,
                                default=argparse.SUPPRESS, metavar="BOOL", help=help_text)
            parser.add_argument(f"--no{f.name}", dest=f.name, action="store_false",
                                default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        else:
            parser.add_argument(f"--{f.name}", type=kind, default=argparse.SUPPRESS, help=help_text)


def add_config_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, metavar="FILE.yaml",
                        help="YAML file with the same field names as the flags; flags override it.")


def parse_config(cls: type[T], args: argparse.Namespace) -> tuple[T, set[str]]:
    """Resolve a config from `--config FILE.yaml` and the flags given; flags win.

    Returns the config and the names of the fields set explicitly (by file or flag).
    """
    values: dict[str, Any] = {}
    file_path = getattr(args, "config", None)
    if file_path:
        values.update(load_yaml(file_path))
    names = set(field_names(cls))
    flags = {k: v for k, v in vars(args).items() if k in names}
    values.update(flags)
    return config_from_dict(cls, values, source=file_path or "flags"), set(values)


def split_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def feature_layout(config: DataConfig) -> tuple[list[str], list[int]]:
    """The feature names and sizes, checked to pair up."""
    names = split_list(config.feature_names)
    try:
        sizes = [int(s) for s in split_list(config.feature_sizes)]
    except ValueError as err:
        raise ValueError(f"--feature_sizes must be comma-separated integers, got {config.feature_sizes!r}") from err
    if len(names) != len(sizes) or not names:
        raise ValueError(
            f"--feature_names ({config.feature_names!r}) and --feature_sizes ({config.feature_sizes!r}) "
            "must list the same number of entries")
    return names, sizes

"""Typed configuration: one flat dataclass per command, filled from YAML files and CLI flags, and checked whole.

Flag names and defaults follow the YouTube-8M starter code, so an old command line pastes as is. Every field
declares its valid values; one error lists every problem of a config (types, ranges, names, combinations).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TypeVar

import yaml

from yt8m.eval.metrics import HIGHER_IS_BETTER
from yt8m.eval.segment_metrics import DEFAULT_TOP_N
from yt8m.fields import closest, nearest, parse_bool, parse_list, setting
from yt8m.io import storage
from yt8m.io.files import write_file_atomically

T = TypeVar("T")


def _best_metric_name(name: str) -> Optional[str]:
    metric = name.rpartition("/")[2]
    if metric in HIGHER_IS_BETTER:
        return None
    form = "TASK/METRIC with METRIC" if "/" in name else ""
    return f"must be {form} one of {', '.join(HIGHER_IS_BETTER)}, got {name!r}".replace("  ", " ")


def _device_name(name: str) -> Optional[str]:
    if name == "auto":
        return None
    import torch  # start-up cost: `yt8m --help` and light commands read configs without torch

    try:
        torch.device(name)
    except (RuntimeError, ValueError):
        return f"{name!r} is not a device: use auto, cpu, cuda or cuda:N"
    return None


def _reader_count(value: Any) -> Optional[str]:
    if str(value) == "auto" or str(value).isdigit():
        return None
    return f"must be 'auto' or a number of processes >= 0, got {value!r}"


READERS_HELP = ("DataLoader worker processes reading the shards, or 'auto': in-process where that is fastest "
                "(video-level data; frame-level data below 4 CPUs), else workers; the choice is logged.")
SKIP_CORRUPT_HELP = ("Skip what is damaged instead of failing, with a warning and a count in the summary: a record "
                     "that does not decode (wrong size, NaN, bad label), or the rest of a shard after a CRC error or "
                     "truncation.")
SEGMENT_LABELS_HELP = ("The 2019 segment task: each rated segment of frame-level data is an example (--segment_size "
                       "frames from its start time, id VIDEOID:START), labelled by its ratings; only rated (segment, "
                       "class) pairs count in the loss and the metrics.")
SEGMENT_SIZE_HELP = "Frames (one per second) per 2019 segment."
TOP_N_HELP = "With --segment_labels: K of the segment mAP@K, the segments ranked per class that count."


@dataclass
class DataConfig:
    """How records are read and decoded; shared by train, eval and predict."""

    feature_names: list[str] = setting(["mean_rgb"], "Feature names, concatenated in this order (comma-separated).")
    feature_sizes: list[int] = setting([1024], "Sizes of the features in --feature_names (comma-separated).")
    frame_features: bool = setting(False, "Read frame-level SequenceExamples instead of video-level Examples.")
    max_frames: int = setting(300, "Frame-level: keep at most this many frames per video.", at_least=1)
    num_classes: int = setting(3862, "Number of classes (3862 for 2018+ data, 4716 for 2017 data).", at_least=1)
    num_readers: str = setting("auto", READERS_HELP, check=_reader_count)
    skip_corrupt: bool = setting(False, SKIP_CORRUPT_HELP)
    segment_labels: bool = setting(False, SEGMENT_LABELS_HELP)
    segment_size: int = setting(5, SEGMENT_SIZE_HELP, at_least=1)

    def __post_init__(self) -> None:
        # The starter kit's comma strings, from Python as from flags and files, become typed lists here, once.
        self.feature_names = parse_list(self.feature_names, str)
        self.feature_sizes = parse_list(self.feature_sizes, int)
        self.num_readers = str(self.num_readers)  # a number given as such reads as the same text as from a flag

    def _own_problems(self) -> list[str]:
        names, sizes = self.feature_names, self.feature_sizes
        if len(names) != len(sizes) or not names:
            return [f"--feature_names ({','.join(names)}) and --feature_sizes ({','.join(map(str, sizes))}) must "
                    "list the same number of entries"]
        if min(sizes) < 1:
            return [f"--feature_sizes must be positive, got {','.join(map(str, sizes))}"]
        if self.segment_labels and not self.frame_features:
            return ["--segment_labels reads the segments of frame-level data: set --frame_features"]
        return []


# The starter kit's --train_dir default: a run that keeps it is warned that /tmp may not keep it.
STARTER_TRAIN_DIR = "/tmp/yt8m_model/"
HPARAMS_FIELD = "model_hparams"
MODEL_HPARAMS_HELP = ("The model's hyper-parameters (YAML mapping); each is also a field and a flag of its own "
                      "name, as in the starter kit (--moe_num_mixtures 4). Filled with the model's defaults when "
                      "the run starts.")


def _taking_model_hparams(cls: type[T]) -> type[T]:
    """Let a config with a `model_hparams` field also take the model's hyper-parameters by their own names, as the
    starter kit's flags do: TrainConfig(model="MoeModel", moe_num_mixtures=4). Which names a model has is the
    model registry's to say (yt8m.models), so here every other name goes into `model_hparams`, to be resolved
    against the chosen model, and named if unknown, when the run is checked."""
    made = cls.__init__
    names = {f.name for f in dataclasses.fields(cls)}

    def __init__(self: Any, *args: Any, **values: Any) -> None:
        hparams = {key: values.pop(key) for key in list(values) if key not in names}
        made(self, *args, **values)
        self.model_hparams = {**(self.model_hparams or {}), **hparams}

    cls.__init__ = __init__
    return cls


@_taking_model_hparams
@dataclass
class TrainConfig(DataConfig):
    """Everything `yt8m train` needs. Its cross-field checks (the model and its hyper-parameters, tasks, teacher,
    optimizer, losses) are yt8m.training.checks'."""

    model: str = setting("LogisticModel", "Model class name, e.g. LogisticModel, MoeModel, DbofModel.")
    model_hparams: dict = setting({}, MODEL_HPARAMS_HELP)
    train_data_pattern: str = setting("", "File glob(s) of training shards; comma-separated for several.", required=True)
    train_dir: str = setting(STARTER_TRAIN_DIR, "Directory for checkpoints, logs and the resolved config.", required=True)
    label_loss: str = setting("CrossEntropyLoss", "Loss: CrossEntropyLoss, HingeLoss or SoftmaxLoss.")
    regularization_penalty: float = setting(1.0, "Weight of the models' L2 penalties in the loss.", at_least=0)
    batch_size: int = setting(1024, "Examples per batch in each process; one optimizer step takes the global batch "
                               "batch_size x processes x --numbatches_to_aggregate (4 torchrun processes with "
                               "--batch_size 256 step on 1024 examples, as one process with 1024).", at_least=1)
    base_learning_rate: float = setting(0.01, "Initial learning rate.", above=0)
    learning_rate_decay: float = setting(0.95, "Learning rate multiplier per --learning_rate_decay_examples.", above=0, at_most=1)
    learning_rate_decay_examples: int = setting(4000000, "Examples between learning-rate decays (staircase).", at_least=1)
    num_epochs: int = setting(5, "Passes over the training data.", at_least=1)
    max_steps: Optional[int] = setting(None, "Stop after this many steps (None: after --num_epochs; 0 writes the "
                                        "initialized model, e.g. from --init_from, as the step-0 checkpoint).",
                                        at_least=0)
    optimizer: str = setting("Adam", "Any torch.optim class name (TF names such as AdamOptimizer accepted).")
    clip_gradient_norm: float = setting(1.0, "Clip each parameter's gradient to this norm, as the starter kit's "
                                        "per-variable clip_by_norm (0 disables).", at_least=0)
    clip_gradient_value: float = setting(0.0, "Clip each gradient element to [-v, v] before the norm clipping (0 "
                                         "disables); --clip_gradient_norm 0 leaves value clipping alone.", at_least=0)
    ema_decay: float = setting(0.0, "Evaluate, checkpoint, export and predict with an exponential moving average of "
                               "the weights, updated after every step with this decay (e.g. 0.998; warmed up as "
                               "min(decay, (1 + step) / (10 + step))); 0 uses the trained weights as they are.",
                               at_least=0, at_most=0.99999)
    numbatches_to_aggregate: int = setting(1, "Accumulate gradients over this many batches per optimizer step: the "
                                         "same update as one batch this many times larger.", at_least=1)
    export_model_steps: int = setting(1000, "Write a checkpoint every this many steps.", at_least=1)
    checkpoint_every_epoch: bool = setting(False, "Also write a checkpoint at the end of every epoch (evaluated with "
                                                  "--eval_data_pattern, as every checkpoint is).")
    keep_checkpoints: int = setting(5, "Keep only the newest N periodic checkpoints.", at_least=1)
    start_new_model: bool = setting(False, "Delete the train dir's checkpoints and start from scratch.")
    shuffle_buffer: int = setting(10000, "Records held in the shuffle buffer of each reader.", at_least=1)
    cache_in_memory: bool = setting(False, "Hold the decoded training set in RAM after the first epoch (frame level: "
                                           "uint8 frames as stored, a quarter of float32's bytes).")
    seed: int = setting(0, "Seed for initialization, shuffling and sampling.", at_least=0)
    device: str = setting("auto", "'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'.", check=_device_name)
    log_device_placement: bool = setting(False, "The starter kit's TensorFlow flag: accepted and logged, no effect "
                                                "(the log names the device every run trains on).")
    mixed_precision: bool = setting(False, "Train with autocast: CUDA bfloat16 (float16 with loss scaling where the "
                                    "GPU lacks it); CPU bfloat16, fast where the CPU has AMX or AVX512-BF16.")
    compile: bool = setting(False, "torch.compile the forward pass and loss: fused elementwise work, after a compile at start.")
    log_every_steps: int = setting(1, "Log the step's loss and examples/s every this many steps.", at_least=1)
    metrics_every_steps: int = setting(10, "Log and summarize the batch's Hit@1, PERR and GAP every this many steps.", at_least=1)
    init_from: str = setting("", "A new run starts from the parameters of this checkpoint (or train dir) that match "
                            "by name and shape; the log lists what was not loaded.")
    max_model_size_mb: float = setting(0.0, "Refuse, before training starts, a model whose parameters and buffers "
                                       "take more than this many MB as float32 (0: no limit; the Kaggle 2018 "
                                       "limit was 1 GB, --max_model_size_mb 1024).", at_least=0)
    num_gpu: int = setting(1, "GPUs to train on, one process each: above 1, `yt8m train` relaunches itself under "
                         "torchrun (--nproc_per_node N); under torchrun it is informational.", at_least=1)
    eval_data_pattern: str = setting("", "Train and evaluate: evaluate on these shards after each checkpoint, export "
                                    "the best, latest and final models to <train_dir>/export.")
    eval_steps: Optional[int] = setting(None, "Evaluate on the first N batches of --eval_data_pattern (None: all).", at_least=1)
    eval_throttle_secs: float = setting(0.0, "Skip a checkpoint's evaluation when the previous one started less "
                                        "than this many seconds ago (the final checkpoint is always evaluated).", at_least=0)
    eval_start_delay_secs: float = setting(0.0, "Evaluate no checkpoint in the first N seconds of training (the "
                                           "final one is always evaluated).", at_least=0)
    best_metric: str = setting("gap", "Validation metric that picks the best model: gap, map, map_all_classes, "
                                 "hit_at_one, perr, segment_map (--segment_labels; higher is better) or loss (lower "
                                 "is better); with tasks TASK/METRIC (METRIC: the first task's).",
                               check=_best_metric_name)
    top_n: int = setting(DEFAULT_TOP_N, TOP_N_HELP, at_least=1)
    keep_best_exports: int = setting(1, "Keep the newest N exports that improved --best_metric (export/best).", at_least=0)
    keep_latest_exports: int = setting(1, "Keep the newest N evaluated checkpoints (export/latest).", at_least=0)
    early_stopping_patience: int = setting(0, "Stop after this many evaluations in a row without improving "
                                         "--best_metric (0: never).", at_least=0)
    lr_halving_patience: int = setting(0, "Halve the learning rate after this many evaluations in a row without "
                                     "improvement (0: never); the factor is kept in checkpoints.", at_least=0)
    revert_to_best: bool = setting(False, "With --lr_halving_patience: each halving also reloads the best export's "
                                     "weights and optimizer state.")
    tasks: list[dict] = setting([], "Multi-task training: a list of tasks (YAML; README 'Multi-task training'), each "
                                    "with its own labels, data, head, loss and weight.")
    aux_vertical_weight: float = setting(0.0, "Add the auxiliary task 'vertical' with this loss weight: the entity "
                                              "labels mapped to the Vertical1 column of --vocabulary_file (0: none).",
                                         at_least=0)
    vocabulary_file: str = setting("", "The label vocabulary CSV (Index plus columns such as Vertical1) that "
                                       "vocabulary tasks map labels through.")
    task_sampling: str = setting("proportional", "Multi-task: which task's data the next batch comes from: "
                                                 "'proportional' (to each data set's size), 'weights' (to its tasks' "
                                                 "weights) or 'round_robin'; seeded.",
                                 choices=lambda: ("proportional", "weights", "round_robin"))
    trunk_hidden_sizes: list[int] = setting([], "Multi-task: fully connected ReLU layers shared by every task's head, "
                                                "on the model's shared features (video-level models: the input).")
    teacher: str = setting("", "Distillation: the student also learns this teacher's soft targets: a train dir (its "
                           "best export, else newest checkpoint), an ONNX export, or a predictions file (.jsonl, .csv).")
    distill_weight: float = setting(0.5, "With --teacher: the loss is (1 - W) x label loss + W x distillation loss.",
                                    at_least=0, at_most=1)
    distill_temperature: float = setting(1.0, "With --teacher: T dividing teacher and student logits (the "
                                         "distillation loss is scaled by T^2).", above=0)
    distill_loss: str = setting("binary", "With --teacher: 'binary' (sigmoid cross-entropy per class) or 'softmax' "
                                "(KL divergence of softmaxes over the classes, NeXtVLAD's).")


# The fields that define what a checkpoint's model is: resuming, evaluating or predicting with other
# values would load weights into a different network or score a different task.
MODEL_IDENTITY_FIELDS = ("model", "feature_names", "feature_sizes", "frame_features", "num_classes", "label_loss")


@_taking_model_hparams
@dataclass
class EvalConfig(DataConfig):
    """Everything `yt8m eval` needs; model and data fields not given are read from the train dir (its checks are
    yt8m.eval.evaluate's)."""

    model: str = setting("LogisticModel", "Model class name; the train dir's when not given.")
    model_hparams: dict = setting({}, MODEL_HPARAMS_HELP)
    eval_data_pattern: str = setting("", "File glob(s) of the shards to evaluate on; comma-separated for several.", required=True)
    train_dir: str = setting(STARTER_TRAIN_DIR, "The train dir whose checkpoints are evaluated.", required=True)
    label_loss: str = setting("CrossEntropyLoss", "Loss reported in the metrics; the train dir's when not given.")
    run_once: bool = setting(False, "Evaluate the latest checkpoint and exit, instead of watching for new ones.")
    top_k: int = setting(20, "Predictions per video counted by GAP.", at_least=1)
    top_n: int = setting(DEFAULT_TOP_N, TOP_N_HELP, at_least=1)
    batch_size: int = setting(1024, "Examples per evaluation batch.", at_least=1)
    poll_interval_secs: float = setting(10.0, "Watch mode: seconds between looks for a new checkpoint.", above=0)
    device: str = setting("auto", "'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'.", check=_device_name)
    per_class: str = setting("", "Also write each class's AP, positives and training videos, with its name and "
                                 "vertical, to this CSV (which classes are hard); with the plots extra, plots beside "
                                 "it: AP against training frequency, AP by vertical.")
    vocabulary_file: str = setting("", "With --per_class: the label vocabulary CSV (the 2018 vocabulary.csv: Index, "
                                       "Name, Vertical1, TrainVideoCount) naming the classes; default: the train "
                                       "dir's. Its TrainVideoCount, where present, is the training frequency; else "
                                       "the train dir's training shards are counted.")


PREDICTION_FORMATS = ("csv", "jsonl")


@dataclass
class PredictConfig:
    """Everything `yt8m predict` needs; features and model come from the train dir's checkpoint or the
    ONNX export's metadata."""

    input_data_pattern: str = setting("", "File glob(s) of the shards to predict; labels are not needed.", required=True)
    train_dir: str = setting("", "The train dir whose latest checkpoint predicts (or give --model).")
    model: str = setting("", "An ONNX export (`yt8m export --output`: FILE.onnx or DIR) to predict with onnxruntime.")
    output_file: str = setting("", "The file to write: a Kaggle CSV (VideoId,LabelConfidencePairs) or JSON lines.", required=True)
    output_format: str = setting("csv", "'csv' (Kaggle) or 'jsonl': one {video_id, class_indexes, predictions} per line.", choices=lambda: PREDICTION_FORMATS)
    top_k: int = setting(20, "Predictions written per video.", at_least=1)
    batch_size: int = setting(8192, "Examples per prediction batch.", at_least=1)
    num_readers: str = setting("auto", READERS_HELP, check=_reader_count)
    skip_corrupt: bool = setting(False, SKIP_CORRUPT_HELP)
    device: str = setting("auto", "'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'.", check=_device_name)
    segment_labels: bool = setting(False, "The 2019 segment task: score every --segment_size-frame segment of every "
                                          "video and write a Class,Segments CSV of the best segments per class.")
    segment_size: int = setting(5, SEGMENT_SIZE_HELP, at_least=1)
    segment_label_ids_file: str = setting("", "With --segment_labels: the classes to write, one class index per line "
                                              "(a header line and further columns allowed, e.g. the 2019 "
                                              "segment_vocabulary.csv); default: the 1,000 classes rated in 2019.")
    segment_max_pred: int = setting(DEFAULT_TOP_N, "With --segment_labels: segments written per class, best first.",
                                    at_least=1)
    task: str = setting("", "A multi-task train dir: the task whose head predicts (default: its first task).")
    input_model_tgz: str = setting("", "Predict with the model of this .tgz (written by --output_model_tgz, as the "
                                       "starter kit's inference.py): unpacked into --untar_model_dir.")
    untar_model_dir: str = setting("/tmp/yt8m-model", "With --input_model_tgz: the folder it is unpacked into (new or "
                                                      "empty, or holding the same archive's files).")
    output_model_tgz: str = setting("", "Also pack the model that predicts (its checkpoint and config, or its ONNX "
                                        "export) into this .tgz, which --input_model_tgz reads.")

    def __post_init__(self) -> None:
        self.num_readers = str(self.num_readers)  # a number given as such reads as the same text as from a flag

    def _own_problems(self) -> list[str]:
        if sum(map(bool, (self.model, self.train_dir, self.input_model_tgz))) != 1:
            return ["give exactly one of --train_dir (a checkpoint), --model (an ONNX export) and --input_model_tgz "
                    "(either, packed by --output_model_tgz)"]
        if self.task and self.model:
            return ["--task picks a head of a multi-task train dir: an ONNX export has one (`yt8m export --task`)"]
        return []


@dataclass
class EnsembleConfig:
    """Everything `yt8m ensemble` needs; its output flags are `yt8m predict`'s."""

    inputs: list[str] = setting([], "Train dirs (latest checkpoint), ONNX exports or predictions files (.csv, .jsonl) "
                                    "to combine; also given as the command's arguments.", required=True)
    input_data_pattern: str = setting("", "File glob(s) of the shards to predict; needed with a train dir or export "
                                          "input; with prediction files only, the videos written (default: the first "
                                          "file's).")
    output_file: str = setting("", "The file to write: a Kaggle CSV (VideoId,LabelConfidencePairs) or JSON lines.", required=True)
    output_format: str = setting("csv", "'csv' (Kaggle) or 'jsonl': one {video_id, class_indexes, predictions} per line.", choices=lambda: PREDICTION_FORMATS)
    top_k: int = setting(20, "Predictions written per video.", at_least=1)
    weights: list[float] = setting([], "One weight per input (comma-separated; normalized to sum 1); default: equal, "
                                       "or fitted with --fit_weights_on.")
    fit_weights_on: str = setting("", "File glob(s) of labelled shards: fit the weights for the most GAP there.")
    fit_top_k: int = setting(100, "Fitting: the classes of each input's ranking kept per video (with its labels).",
                             at_least=20)
    num_classes: int = setting(3862, "Classes of the prediction files (train dirs and exports bring their own).", at_least=1)
    batch_size: int = setting(1024, "Videos per batch (memory: one [batch, classes] matrix per input).", at_least=1)
    num_readers: str = setting("auto", READERS_HELP, check=_reader_count)
    device: str = setting("auto", "'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'.", check=_device_name)

    def __post_init__(self) -> None:
        self.inputs = parse_list(self.inputs, str)
        self.weights = parse_list(self.weights, float)
        self.num_readers = str(self.num_readers)

    def _own_problems(self) -> list[str]:
        if self.weights and self.fit_weights_on:
            return ["give --weights or --fit_weights_on, not both"]
        if self.weights and len(self.weights) != len(self.inputs):
            return [f"--weights lists {len(self.weights)} weights for {len(self.inputs)} inputs"]
        if self.weights and not (all(map(math.isfinite, self.weights)) and min(self.weights) >= 0 < sum(self.weights)):
            return [f"--weights must be finite, non-negative and of a positive sum, got {shown(self.weights)}"]
        return []


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def field_type(cls: type, name: str) -> type:
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return hint


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
        if kind == list[dict] or kind is dict:
            return _yaml_field(value, list if kind != dict else dict)
        if typing.get_origin(kind) is list:
            return parse_list(value, typing.get_args(kind)[0])
    except (ValueError, TypeError, argparse.ArgumentTypeError) as err:
        raise ValueError(f"{source}: field '{name}' expects {_type_name(kind)}, got {value!r}") from err
    return value


def _yaml_field(value: Any, kind: type) -> Any:
    """A list-of-mappings field (tasks:) or a mapping field (model_hparams): YAML's value, or the same as YAML text
    from a flag, empty text for none (the entries are checked later)."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise ValueError(value) from err
    if value is None:
        return kind()
    if not isinstance(value, (list, tuple) if kind is list else dict):
        raise ValueError(value)
    return kind(value)


def _type_name(kind: Any) -> str:
    if kind is dict:
        return "a mapping (YAML)"
    if kind == list[dict]:
        return "a list of mappings (YAML)"
    if typing.get_origin(kind) is list:
        return f"a comma-separated list of {typing.get_args(kind)[0].__name__}"
    return kind.__name__


def shown(value: Any) -> str:
    """A field's value as a message shows it: lists in the starter kit's comma form, 'a,b'."""
    return repr(",".join(map(str, value)) if isinstance(value, list) else value)


class ConfigError(ValueError):
    """A config with problems: `problems` lists them, one line each; the message heads them with what was read."""

    def __init__(self, heading: str, problems: list[str]):
        super().__init__(f"{heading}:\n  " + "\n  ".join(problems))
        self.problems = problems


# A config's checks beyond its fields' own rules, made by the layer that knows what they need (yt8m.training.checks
# for TrainConfig): problems of `config`, leaving out the fields in `skip` (their values did not parse).
Checks = Callable[[Any, set[str]], list[str]]


def config_from_dict(cls: type[T], values: dict[str, Any], source: str = "config", check_values: bool = True,
                     checks: Optional[Checks] = None) -> T:
    """Build `cls` from a mapping, naming every unknown or ill-typed field and (with `check_values`) every invalid
    value, and what `checks` finds, in one error. Configs a run stored (config.yaml, checkpoints) load with
    check_values=False: they were checked when made, and later versions must still read them.

    A config with `model_hparams` takes the names that are not its fields as the model's hyper-parameters; which
    are the chosen model's (and which are unknown) `checks` says."""
    known = set(field_names(cls))
    takes_hparams = HPARAMS_FIELD in known
    unknown = [] if takes_hparams else sorted(set(values) - known)
    problems = [f"{source}: unknown field '{k}'{closest(k, sorted(known))}" for k in unknown]
    coerced = {key: value for key, value in values.items() if key not in known and takes_hparams}
    for key, value in values.items():
        if key in known:
            try:
                coerced[key] = _coerce(cls, key, value, source)
            except ValueError as err:
                problems.append(str(err))
    config = cls(**coerced)
    if check_values:
        ill_typed = {key for key in values if key in known and key not in coerced}
        problems += config_problems(config, skip=ill_typed)
        problems += checks(config, ill_typed) if checks is not None else []
    if problems:
        raise ConfigError(f"invalid config ({source})", problems)
    return config


def config_problems(config: Any, skip: set[str] = frozenset()) -> list[str]:
    """Every invalid value of `config` (by its fields' rules) and every invalid combination (by each config class's
    `_own_problems`), as lines naming the flag; fields in `skip` are left out."""
    problems = []
    for f in dataclasses.fields(config):
        problem = None if f.name in skip else _value_problem(f.metadata, getattr(config, f.name))
        if problem:
            problems.append(f"--{f.name} {problem}")
    for cls in type(config).__mro__:
        if "_own_problems" in vars(cls):
            problems += vars(cls)["_own_problems"](config)
    return problems


def _value_problem(rules: Any, value: Any) -> Optional[str]:
    if rules.get("required") and value in ("", None):
        return "is required"
    if value is None or value == "":
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    bounds = [("at_least", lambda low: value >= low, "at least"), ("above", lambda low: value > low, "above"),
              ("at_most", lambda high: value <= high, "at most")]
    for key, holds, words in bounds:
        if key in rules and not holds(rules[key]):
            return f"must be {words} {rules[key]:g}, got {value}"
    if "choices" in rules and value not in rules["choices"]():
        return f"must be one of {', '.join(rules['choices']())}, got {value!r}"
    if "check" in rules:
        return rules["check"](value)
    return None


def load_yaml(path: str) -> dict[str, Any]:
    """A YAML file's mapping; plain YAML only (no `!!python` tags), errors as one line naming the file and line."""
    if not storage.exists(path):
        raise FileNotFoundError(f"config file not found: {path}")
    with storage.open_file(path, "r") as fh:
        try:
            data = yaml.safe_load(fh) or {}
        except yaml.YAMLError as err:
            raise ValueError(f"{path}: not a valid YAML config: {_one_line(err)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config file must hold a mapping of field: value")
    return data


def _one_line(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err)
    return where + " ".join(str(problem).split())


def config_values(config: Any) -> dict[str, Any]:
    """A config's fields as a mapping, the model's hyper-parameters under their own names (the flags' form): what
    config.yaml and checkpoints store, and `config_from_dict` reads back."""
    values = dataclasses.asdict(config)
    return {**values, **values.pop(HPARAMS_FIELD)} if HPARAMS_FIELD in values else values


def save_config(config: Any, path: str) -> None:
    write_file_atomically(path, lambda out: yaml.safe_dump(config_values(config), out, sort_keys=False))


def load_config(cls: type[T], path: str) -> T:
    """A config a run stored (its values were checked when it was made)."""
    return config_from_dict(cls, load_yaml(path), source=path, check_values=False)


def checkpoint_config(payload: dict[str, Any], path: str) -> "TrainConfig":
    """The training config a checkpoint payload (yt8m.io.checkpoints) stores."""
    return config_from_dict(TrainConfig, payload["config"], source=f"{path} (config)", check_values=False)


def differing_fields(old: Any, new: Any, names: Sequence[str]) -> list[tuple[str, Any, Any]]:
    """(name, old value, new value) of each named config field that differs."""
    return [(name, getattr(old, name), getattr(new, name)) for name in names if getattr(old, name) != getattr(new, name)]


def add_config_arguments(parser: argparse.ArgumentParser, cls: type,
                         extra: Sequence[tuple[dataclasses.Field, Any]] = ()) -> None:
    """Add one `--name` flag per field of `cls` (a mapping or list of mappings takes YAML text) and per (field, type)
    of `extra`; booleans also take `--noname` and `--name=false`.

    Values stay text here and are typed by `config_from_dict`, so that one error lists every bad flag. Defaults are
    suppressed so that `parse_config` can tell which flags were given.
    """
    fields = [(f, field_type(cls, f.name)) for f in dataclasses.fields(cls)]
    for f, kind in [*fields, *extra]:
        help_text = f"{f.metadata.get('help', '')} (default: {f.metadata.get('shown_default', _shown_default(f))})"
        if kind is bool:
            parser.add_argument(f"--{f.name}", nargs="?", const="true", default=argparse.SUPPRESS, metavar="BOOL",
                                help=help_text)
            parser.add_argument(f"--no{f.name}", dest=f.name, action="store_const", const="false",
                                default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        else:
            metavar = "A,B,..." if typing.get_origin(kind) is list else kind.__name__.upper()
            parser.add_argument(f"--{f.name}", default=argparse.SUPPRESS, metavar=metavar, help=help_text)


def _shown_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return ",".join(map(str, f.default_factory()))
    return f.default


class FlagError(ValueError):
    """A command line a command cannot take (an unknown flag, a missing or malformed value): one line, exit 1."""


class FlagParser(argparse.ArgumentParser):
    """The flags of a `yt8m` command: only whole names (argparse would take --num_epoch as --num_epochs), and a bad
    command line raised as a FlagError of one line, an unknown flag with the nearest known one, instead of argparse's
    usage block and exit status 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Optional[Sequence[str]] = None,  # type: ignore[override]
                   namespace: Optional[argparse.Namespace] = None) -> argparse.Namespace:
        argv = list(sys.argv[1:] if args is None else args)
        # Unknown flags first: argparse would otherwise name a required flag the misspelt one was meant to be.
        unknown = self._unknown_flags(argv)
        if unknown:
            known = self._flag_names()
            named = ", ".join(f"{flag}{_did_you_mean(flag, known)}" for flag in unknown)
            raise FlagError(f"unknown flag{'s' if len(unknown) > 1 else ''} {named}; {self._help_hint()}")
        parsed, extra = self.parse_known_args(argv, namespace)
        if extra:
            raise FlagError(f"unexpected argument(s) {' '.join(map(repr, extra))}; {self._help_hint()}")
        return parsed

    def error(self, message: str) -> typing.NoReturn:
        raise FlagError(f"{message}; {self._help_hint()}")

    def _unknown_flags(self, argv: list[str]) -> list[str]:
        """The long flags of `argv` that no parser of this command takes (up to a `--`, after which all is values)."""
        known = set(self._flag_names(hidden=True))
        given = argv[:argv.index("--")] if "--" in argv else argv
        return [flag for flag in (token.split("=", 1)[0] for token in given if token.startswith("--"))
                if flag not in known]

    def _flag_names(self, hidden: bool = False) -> list[str]:
        """Every long flag of this parser and of its sub-commands' (`yt8m bench read`); `hidden`: also those the
        help leaves out (--noframe_features)."""
        parsers = [self] + [sub for action in self._actions if isinstance(action, argparse._SubParsersAction)
                            for sub in action.choices.values()]
        return [flag for parser in parsers for action in parser._actions for flag in action.option_strings
                if flag.startswith("--") and (hidden or action.help != argparse.SUPPRESS)]

    def _help_hint(self) -> str:
        return f"`{self.prog} --help` lists the flags"


def _did_you_mean(flag: str, known: Sequence[str]) -> str:
    match = nearest(flag, known)
    return f" (did you mean {match}?)" if match else ""


def add_config_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, metavar="FILE.yaml",
                        help="YAML file with the same field names as the flags; flags override it.")


def parse_config(cls: type[T], args: argparse.Namespace, check_values: bool = True, checks: Optional[Checks] = None,
                 extra_names: Sequence[str] = ()) -> tuple[T, set[str]]:
    """Resolve a config from `--config FILE.yaml` and the flags given; flags win. `check_values=False` leaves the
    values' checks to a caller that completes the config first (eval, from the train dir); `checks` adds the
    config's own (see config_from_dict); `extra_names` are the flags of `add_config_arguments`' `extra`.

    Returns the config and the names of the fields set explicitly (by file or flag).
    """
    values: dict[str, Any] = {}
    file_path = getattr(args, "config", None)
    if file_path:
        values.update(load_yaml(file_path))
    names = set(field_names(cls)) | set(extra_names)
    flags = {k: v for k, v in vars(args).items() if k in names}
    values.update(flags)
    source = " and ".join(part for part in (file_path, "flags" if flags else "") if part) or "defaults"
    return config_from_dict(cls, values, source=source, check_values=check_values, checks=checks), set(values)

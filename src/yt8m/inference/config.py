"""The configs of `yt8m predict` and `yt8m ensemble`, in sections: the shards read, where the model comes from, what
is written (the same output settings for both), and the 2019 segment task's predictions."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from yt8m.config import shown
from yt8m.data.reading.spec import SEGMENT_SIZE_HELP, num_readers_setting
from yt8m.distributed.ranks import device_setting
from yt8m.eval.config import ModelReading
from yt8m.eval.segment_metrics import DEFAULT_TOP_N
from yt8m.fields import setting

PREDICTION_FORMATS = ("csv", "jsonl")


@dataclass(frozen=True)
class PredictDataConfig(ModelReading):
    """The `data` section of predict: the shards predicted, and how they are read."""

    batch_size: int = setting(8192, "Examples per batch (predictions need no gradients: more fit).", at_least=1)
    input_data_pattern: str = setting("", "File glob(s) of the shards to predict; labels are not needed.",
                                      required=True)


@dataclass(frozen=True)
class ModelSourceConfig:
    """The `source` section of predict: the model that predicts, a checkpoint's or an ONNX export's, given as is or
    packed in a .tgz (and the .tgz to pack it into)."""

    train_dir: str = setting("", "The train dir whose latest checkpoint predicts (or give --model).")
    model: str = setting("", "An ONNX export (`yt8m export --output`: FILE.onnx or DIR) to predict with onnxruntime.")
    task: str = setting("", "A multi-task train dir: the task whose head predicts (default: its first task).")
    input_model_tgz: str = setting("", "Predict with the model of this .tgz (written by --output_model_tgz, as the "
                                       "starter kit's inference.py): unpacked into --untar_model_dir.")
    untar_model_dir: str = setting("/tmp/yt8m-model", "With --input_model_tgz: the folder it is unpacked into (new or "
                                                      "empty, or holding the same archive's files).")
    output_model_tgz: str = setting("", "Also pack the model that predicts (its checkpoint and config, or its ONNX "
                                        "export) into this .tgz, which --input_model_tgz reads.")

    def problems(self) -> list[str]:
        if sum(map(bool, (self.model, self.train_dir, self.input_model_tgz))) != 1:
            return ["give exactly one of --train_dir (a checkpoint), --model (an ONNX export) and --input_model_tgz "
                    "(either, packed by --output_model_tgz)"]
        if self.task and self.model:
            return ["--task picks a head of a multi-task train dir: an ONNX export has one (`yt8m export --task`)"]
        return []


@dataclass(frozen=True)
class OutputConfig:
    """The `output` section of predict and ensemble: the file written, its format and the predictions per video."""

    output_file: str = setting("", "The file to write: a Kaggle CSV (VideoId,LabelConfidencePairs) or JSON lines.",
                               required=True)
    output_format: str = setting("csv", "'csv' (Kaggle) or 'jsonl': one {video_id, class_indexes, predictions} per "
                                        "line.", choices=lambda: PREDICTION_FORMATS)
    top_k: int = setting(20, "Predictions written per video.", at_least=1)


@dataclass(frozen=True)
class SegmentOutputConfig:
    """The `segments` section of predict: the 2019 segment task's Class,Segments CSV."""

    segment_labels: bool = setting(False, "The 2019 segment task: score every --segment_size-frame segment of every "
                                          "video and write a Class,Segments CSV of the best segments per class.")
    segment_size: int = setting(5, SEGMENT_SIZE_HELP, at_least=1)
    segment_label_ids_file: str = setting("", "With --segment_labels: the classes to write, one class index per line "
                                              "(a header line and further columns allowed, e.g. the 2019 "
                                              "segment_vocabulary.csv); default: the 1,000 classes rated in 2019.")
    segment_max_pred: int = setting(DEFAULT_TOP_N, "With --segment_labels: segments written per class, best first.",
                                    at_least=1)


@dataclass(frozen=True)
class PredictConfig:
    """Everything `yt8m predict` needs; features and model come from the train dir's checkpoint or the ONNX
    export's metadata."""

    data: PredictDataConfig = dataclasses.field(default_factory=PredictDataConfig)
    source: ModelSourceConfig = dataclasses.field(default_factory=ModelSourceConfig)
    output: OutputConfig = dataclasses.field(default_factory=OutputConfig)
    segments: SegmentOutputConfig = dataclasses.field(default_factory=SegmentOutputConfig)


@dataclass(frozen=True)
class EnsembleInputsConfig:
    """The `inputs` section of ensemble: what is combined, and with which weights."""

    inputs: list[str] = setting([], "Train dirs (latest checkpoint), ONNX exports or predictions files (.csv, .jsonl) "
                                    "to combine; also given as the command's arguments.", required=True,
                                    positional=True)
    weights: list[float] = setting([], "One weight per input (comma-separated; normalized to sum 1); default: equal, "
                                       "or fitted with --fit_weights_on.")
    fit_weights_on: str = setting("", "File glob(s) of labelled shards: fit the weights for the most GAP there.")
    fit_top_k: int = setting(100, "Fitting: the classes of each input's ranking kept per video (with its labels).",
                             at_least=20)
    num_classes: int = setting(3862, "Classes of the prediction files (train dirs and exports bring their own).",
                               at_least=1)

    def problems(self) -> list[str]:
        weights = self.weights
        if weights and self.fit_weights_on:
            return ["give --weights or --fit_weights_on, not both"]
        if weights and len(weights) != len(self.inputs):
            return [f"--weights lists {len(weights)} weights for {len(self.inputs)} inputs"]
        if weights and not (all(map(math.isfinite, weights)) and min(weights) >= 0 < sum(weights)):
            return [f"--weights must be finite, non-negative and of a positive sum, got {shown(weights)}"]
        return []


@dataclass(frozen=True)
class EnsembleDataConfig:
    """The `data` section of ensemble: the shards its model inputs predict, and how they are read."""

    input_data_pattern: str = setting("", "File glob(s) of the shards to predict; needed with a train dir or export "
                                          "input; with prediction files only, the videos written (default: the first "
                                          "file's).")
    batch_size: int = setting(1024, "Videos per batch (memory: one [batch, classes] matrix per input).", at_least=1)
    num_readers: str = num_readers_setting()
    device: str = device_setting()


@dataclass(frozen=True)
class EnsembleConfig:
    """Everything `yt8m ensemble` needs; its output flags are `yt8m predict`'s."""

    inputs: EnsembleInputsConfig = dataclasses.field(default_factory=EnsembleInputsConfig)
    data: EnsembleDataConfig = dataclasses.field(default_factory=EnsembleDataConfig)
    output: OutputConfig = dataclasses.field(default_factory=OutputConfig)

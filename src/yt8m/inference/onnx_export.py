"""ONNX export of a checkpoint for serving (`export_checkpoint`: the model and a metadata JSON beside it), and
`load_exported`, which runs such a model with onnxruntime for `yt8m predict --model`."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import time
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn

from yt8m import __version__
from yt8m.config import config_values
from yt8m.data.format.decode import dequantize
from yt8m.data.reading.spec import FeatureSpec
from yt8m.io import storage
from yt8m.io.checkpoints import load_checkpoint
from yt8m.io.files import copy_file_atomically, write_file_atomically
from yt8m.models.checkpoints import TrainedModel, build_model_from_payload
from yt8m.models.frame import LstmModel, _frame_counts
from yt8m.models.model_size import ModelSize, model_size
from yt8m.models.multihead import Network
from yt8m.optional import require

log = logging.getLogger("yt8m.export")

GRAPH_NOTES = """\
The graph is the model's eval forward: L2 normalization, frame masking and sampling, sigmoid. Its batch
axis, and the frame axis of frame-level models, are dynamic. Frame-level models take uint8 frames as
stored in the shards (dequantized in the graph, after any sampling), zero-padded after num_frames. DbofModel
exports its eval-mode sampling (evenly spaced frames, or the middle run), so it predicts as `yt8m predict`
does, never at random.
LstmModel exports as an unpacked LSTM read at each video's last real frame: the same outputs as the
packed sequences it trains with, which torch.export cannot trace."""

METADATA_FORMAT = "yt8m-onnx-1"
MODEL_FILE = "model.onnx"
METADATA_FILE = "metadata.json"
OUTPUT_NAMES = ("logits", "predictions")
# An export whose onnxruntime outputs drift further than this from torch's on the example batch is refused.
VERIFY_TOLERANCE = 1e-5
_EXAMPLE_FRAMES = (4, 2, 3, 0)  # real frames of the example videos: full, padded, and one without frames
_METADATA_FIELDS = {"format": str, "model": str, "feature_names": list, "feature_sizes": list,
                    "frame_features": bool, "max_frames": int, "num_classes": int, "inputs": list, "outputs": list}


class ExportError(ValueError):
    """An exported model or its metadata that cannot be used; the message names the file and field."""


class OnnxGraph(nn.Module):
    """What is exported: the model's forward as a (logits, predictions) tuple, named by OUTPUT_NAMES."""

    def __init__(self, model: Network):
        super().__init__()
        self.model = model

    def forward(self, features: torch.Tensor,
                num_frames: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        output = self.model(features, num_frames)
        return output["logits"], output["predictions"]


class LstmLastStepGraph(OnnxGraph):
    """LstmModel without packed sequences: the LSTM runs over the padded frames and each video's output is
    read at its last real frame. An LSTM is causal, so padding after that frame cannot reach it: this is
    the final state of the packed run, hidden[-1], which LstmModel classifies."""

    def __init__(self, model: LstmModel):
        super().__init__(model)
        self.lstm_model = model

    def forward(self, features: torch.Tensor,
                num_frames: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.lstm_model
        steps, _ = model.lstm(model.prepare_input(features, num_frames))  # as BaseModel.forward
        last = (_frame_counts(features, num_frames) - 1).view(-1, 1, 1).expand(-1, 1, steps.shape[-1])
        logits = model.classifier.compute_logits(steps.gather(1, last).squeeze(1), None)
        return logits, torch.sigmoid(logits)


def graph_for(model: Network) -> OnnxGraph:
    return LstmLastStepGraph(model) if isinstance(model, LstmModel) else OnnxGraph(model)


def example_inputs(model: Network) -> tuple[torch.Tensor, ...]:
    """A small seeded batch to trace and verify with: for frame-level models zero-padded videos of
    different lengths, so that the masking and the last-frame reads are exercised."""
    generator = torch.Generator().manual_seed(0)
    batch = len(_EXAMPLE_FRAMES)
    if not model.frame_level:
        return (torch.randn(batch, model.feature_size, generator=generator),)
    num_frames = torch.tensor(_EXAMPLE_FRAMES, dtype=torch.int64)
    frames = torch.randint(0, 256, (batch, max(_EXAMPLE_FRAMES), model.feature_size), generator=generator,
                           dtype=torch.uint8)
    real = torch.arange(frames.shape[1]) < num_frames[:, None]
    return frames * real.unsqueeze(-1), num_frames


def input_names(model: Network) -> list[str]:
    return ["features", "num_frames"] if model.frame_level else ["features"]


def export_onnx(model: Network, path: str) -> dict[str, Any]:
    """Write `model` (switched to eval mode) as an ONNX file at `path` (see GRAPH_NOTES), checked by
    onnx.checker and verified against torch with onnxruntime; returns the opset and the max difference."""
    import onnx  # the onnx extra

    graph = graph_for(model).eval()  # eval() reaches the model: its eval-mode forward is what is exported
    inputs = example_inputs(model)
    batch = torch.export.Dim("batch")
    dynamic_shapes = ({0: batch, 1: torch.export.Dim("frames")}, {0: batch}) if model.frame_level else ({0: batch},)
    with torch.no_grad():
        program = torch.onnx.export(graph, inputs, dynamo=True, dynamic_shapes=dynamic_shapes,
                                    input_names=input_names(model), output_names=list(OUTPUT_NAMES), verbose=False)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if program is None:
        raise ExportError(f"{path}: torch.onnx.export made no program")
    program.save(path)  # weights go to a side file only past protobuf's 2 GB limit
    onnx.checker.check_model(path, full_check=True)
    differences, expected = check_differences(model, create_session(path, "cpu"), inputs)
    difference = float(differences.max())
    if not difference <= VERIFY_TOLERANCE:
        raise ExportError(f"{path}: " + unfaithful_export(model, inputs, differences, expected))
    opset = next(entry.version for entry in onnx.load(path, load_external_data=False).opset_import
                 if entry.domain in ("", "ai.onnx"))
    return {"opset": opset, "verified_max_abs_diff": difference}


def check_differences(model: Network, session: Any, inputs: Sequence[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """(largest |onnxruntime - torch| per input video, nan where either gives nan; torch's predictions) over one
    batch."""
    with torch.no_grad():
        expected = model(*inputs)["predictions"].numpy()
    feeds = {name: tensor.numpy() for name, tensor in zip(input_names(model), inputs)}
    actual = session.run(["predictions"], feeds)[0]
    return np.abs(actual - expected).max(axis=1), expected


def unfaithful_export(model: Network, inputs: Sequence[torch.Tensor], differences: np.ndarray,
                      expected: np.ndarray) -> str:
    """Why the check refused an export, in one line: by how much its predictions differ and on which of the check's
    input videos (the one that differs most, nan first); where torch's own predictions are not finite, or the video
    has no frames, what the model must do."""
    index = int(np.argmax(np.where(np.isnan(differences), np.inf, differences)))
    message = (f"onnxruntime's predictions differ from torch's by {differences[index]:.3g} (tolerance "
               f"{VERIFY_TOLERANCE:g}) on {_check_input(model, inputs, index)}")
    without_frames = model.frame_level and int(inputs[1][index]) == 0
    if np.isfinite(expected[index]).all():
        advice = "check how it masks with num_frames" if without_frames else "the export is not faithful"
        return f"{message}: {advice}"
    message += f"; torch's own predictions for it are {_non_finite(expected[index])}"
    if without_frames:
        return (f"{message}: a model must give finite outputs for a video without frames: mask with num_frames so "
                "that no softmax or mean runs over zero frames (e.g. num_frames.clamp(min=1) to read one zero frame, "
                "as yt8m's models do, or a zero vector for such a video)")
    return f"{message}: a model must give finite outputs"


def _non_finite(values: np.ndarray) -> str:
    return "nan" if np.isnan(values).any() else "inf"


def _check_input(model: Network, inputs: Sequence[torch.Tensor], index: int) -> str:
    """One of the check's input videos, described: its frames, for frame-level models."""
    batch = inputs[0].shape[0]
    if not model.frame_level:
        return f"the check's video {index} of {batch} (random feature vectors)"
    frames, real = inputs[0].shape[1], int(inputs[1][index])
    if real == 0:
        return f"the check's video with 0 frames (video {index} of {batch}, num_frames 0)"
    padding = f", then {frames - real} padding frames" if real < frames else ""
    return f"the check's video {index} of {batch} ({real} frames{padding})"


def artifact_paths(output: str) -> tuple[str, str]:
    """(model file, metadata file) of an export: OUT/model.onnx and OUT/metadata.json when OUT is a
    directory or has no suffix, else OUT and OUT.json."""
    if storage.isdir(output) or not os.path.splitext(output)[1]:
        return f"{output.rstrip('/')}/{MODEL_FILE}", f"{output.rstrip('/')}/{METADATA_FILE}"
    return output, f"{output}.json"


def build_metadata(trained: TrainedModel, checkpoint: str, model_path: str, opset: int,
                   size: ModelSize) -> dict[str, Any]:
    """Everything a server needs besides the graph: how to read and feed the inputs, where the model came from, and
    its size."""
    import onnx  # the onnx extra

    graph = onnx.load(model_path, load_external_data=False).graph
    model, features = trained.model, trained.features
    return {
        "format": METADATA_FORMAT, "yt8m_version": __version__, "model_file": os.path.basename(model_path),
        "model": model.name, "model_config": config_values(model), "feature_names": features.feature_names,
        "feature_sizes": features.feature_sizes, "frame_features": features.frame_features,
        "max_frames": features.max_frames, "num_classes": features.num_classes, "global_step": trained.step,
        "source_checkpoint": os.path.abspath(checkpoint) if storage.is_local(checkpoint) else checkpoint,
        "opset": opset,
        "model_size": size.as_dict(),
        "inputs": [_describe(value) for value in graph.input], "outputs": [_describe(value) for value in graph.output],
    }


def _describe(value: Any) -> dict[str, Any]:
    """An ONNX graph input or output as {name, dtype, shape}, dynamic axes by name."""
    import onnx  # the onnx extra

    tensor = value.type.tensor_type
    shape = [dim.dim_param or dim.dim_value for dim in tensor.shape.dim]
    return {"name": value.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name, "shape": shape}


def export_checkpoint(checkpoint: str, output: str, task: str = "") -> dict[str, Any]:
    """Export one checkpoint to OUT (see `artifact_paths`); the metadata is written last, atomically, so a
    model without its metadata is an unfinished export that `load_exported` refuses. Of a multi-task checkpoint
    the head of `task` (default: the first task) is exported, its metadata naming the task and its id key.
    OUT on object storage: exported to a local folder (onnx writes and checks files there), then uploaded, the
    metadata last."""
    require("onnx", "ONNX export")
    if storage.is_local(output):
        return _export_to_local(checkpoint, output, task)
    model_url, metadata_url = artifact_paths(output)
    storage.remove(metadata_url)
    with tempfile.TemporaryDirectory(prefix="yt8m-export-") as stage:
        local_model = os.path.join(stage, os.path.basename(model_url))
        exported = _export_to_local(checkpoint, local_model, task)
        _copy_graph(local_model, model_url)
        copy_file_atomically(exported["metadata_file"], metadata_url)
    return {**exported, "model_file": model_url, "metadata_file": metadata_url}


def _copy_graph(source: str, destination: str) -> None:
    """Copy an ONNX graph and the external weights file beside it (MODEL.data), if it has one; either side may be
    object storage. The names stay paired: the graph refers to its weights file by name."""
    copy_file_atomically(source, destination)
    if storage.exists(f"{source}.data"):
        copy_file_atomically(f"{source}.data", f"{destination}.data")


def _export_to_local(checkpoint: str, output: str, task: str) -> dict[str, Any]:
    stored = load_checkpoint(checkpoint)
    trained = build_model_from_payload(stored, checkpoint, "cpu", task)
    model_path, metadata_path = artifact_paths(output)
    if os.path.exists(metadata_path):
        os.remove(metadata_path)
    started = time.perf_counter()
    exported = export_onnx(trained.network, model_path)
    metadata = build_metadata(trained, checkpoint, model_path, exported["opset"], model_size(trained.network))
    for spec in stored.tasks:
        if spec["name"] == (task or stored.tasks[0]["name"]):
            metadata.update(task=spec["name"], id_key=spec["id_key"])
    write_file_atomically(metadata_path, lambda out: json.dump(metadata, out, indent=1))
    return {"model_file": model_path, "metadata_file": metadata_path, "model": trained.model.name,
            "global_step": trained.step,
            "source_checkpoint": checkpoint, "bytes": _exported_bytes(model_path),
            "seconds": round(time.perf_counter() - started, 3),
            **exported}


def _exported_bytes(model_path: str) -> int:
    """The model file plus the external weights file it may have."""
    data = f"{model_path}.data"
    return os.path.getsize(model_path) + (os.path.getsize(data) if os.path.exists(data) else 0)


@dataclasses.dataclass
class ExportedModel:
    """An exported model ready to predict: its onnxruntime session and its checked metadata."""

    session: Any
    metadata: dict[str, Any]
    model_file: str

    def feature_spec(self):
        meta = self.metadata
        return FeatureSpec(meta["feature_names"], meta["feature_sizes"], meta["frame_features"],
                           meta["max_frames"], meta["num_classes"])

    def predict(self, features: np.ndarray, num_frames: Optional[np.ndarray] = None,
                output: str = "predictions") -> np.ndarray:
        """Probabilities [batch, classes] (or with output="logits", logits) for raw (unnormalized) features, as
        the dataset yields them: frame level uint8 frames as stored (an export taking float32 frames, as exports
        did before they took uint8, gets them dequantized here, padding zero)."""
        takes_uint8 = self.session.get_inputs()[0].type == "tensor(uint8)"
        if takes_uint8 and features.dtype != np.uint8:
            raise ExportError(f"{self.model_file}: the model takes uint8 frames as stored in the shards, got "
                              f"{features.dtype}")
        if features.dtype == np.uint8 and not takes_uint8:
            if num_frames is None:
                raise ExportError(f"{self.model_file}: uint8 frames come with their frame counts")
            features = _dequantized(features, num_frames)
        feeds = {"features": np.ascontiguousarray(features, dtype=np.uint8 if takes_uint8 else np.float32)}
        if self.metadata["frame_features"]:
            feeds["num_frames"] = np.ascontiguousarray(num_frames, dtype=np.int64)
        return self.session.run([output], feeds)[0]


def _dequantized(frames: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
    """float32 frames of uint8 [batch, frames, D], zero after each video's num_frames."""
    real = np.arange(frames.shape[1]) < np.asarray(num_frames)[:, None]
    return np.where(real[:, :, None], dequantize(frames), np.float32(0))


def load_exported(path: str, device: str = "auto") -> ExportedModel:
    """The export at `path` (what `yt8m export --output` was given), its metadata checked against the graph."""
    require("onnx", "Predicting with an ONNX export")
    model_path, metadata_path = artifact_paths(path)
    metadata = read_metadata(metadata_path)
    if not storage.exists(model_path):
        raise FileNotFoundError(f"exported model not found: {model_path} (metadata {metadata_path} is there)")
    if storage.is_local(model_path):
        session = create_session(model_path, device)
    else:  # onnxruntime reads local files: the graph and its external weights are fetched beside each other
        with tempfile.TemporaryDirectory(prefix="yt8m-export-") as stage:
            local_model = os.path.join(stage, os.path.basename(model_path))
            _copy_graph(model_path, local_model)
            session = create_session(local_model, device)
    check_metadata_matches(metadata, session, metadata_path)
    return ExportedModel(session, metadata, model_path)


def read_metadata(path: str) -> dict[str, Any]:
    if not storage.exists(path):
        raise FileNotFoundError(f"export metadata not found: {path} (written last by `yt8m export`; "
                                "re-export if the export was interrupted)")
    try:
        with storage.open_file(path, "r") as fh:
            metadata = json.load(fh)
    except json.JSONDecodeError as err:
        raise ExportError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(metadata, dict):
        raise ExportError(f"{path}: expected a JSON object")
    for name, kind in _METADATA_FIELDS.items():
        if name not in metadata:
            raise ExportError(f"{path}: field '{name}' is missing")
        if not isinstance(metadata[name], kind) or (kind is int and isinstance(metadata[name], bool)):
            raise ExportError(f"{path}: field '{name}' must be {kind.__name__}, got {metadata[name]!r}")
    if metadata["format"] != METADATA_FORMAT:
        raise ExportError(f"{path}: field 'format' is {metadata['format']!r}, expected {METADATA_FORMAT!r}")
    names, sizes = metadata["feature_names"], metadata["feature_sizes"]
    if not all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in sizes):
        raise ExportError(f"{path}: field 'feature_sizes' must list positive integers, got {sizes!r}")
    if not names or len(names) != len(sizes) or not all(isinstance(name, str) for name in names):
        raise ExportError(f"{path}: field 'feature_names' {names!r} must list one name per feature size {sizes!r}")
    return metadata


def check_metadata_matches(metadata: dict[str, Any], session: Any, path: str) -> None:
    """The metadata must describe the graph it sits beside: input names, feature width, classes."""
    inputs = {value.name: value.shape for value in session.get_inputs()}
    outputs = {value.name: value.shape for value in session.get_outputs()}
    expected_inputs = ["features", "num_frames"] if metadata["frame_features"] else ["features"]
    if sorted(inputs) != sorted(expected_inputs):
        raise ExportError(f"{path}: field 'frame_features' is {metadata['frame_features']}, so the model should take "
                          f"inputs {expected_inputs}; it takes {sorted(inputs)}")
    width = sum(metadata["feature_sizes"])
    if inputs["features"][-1] != width:
        raise ExportError(f"{path}: field 'feature_sizes' {metadata['feature_sizes']} adds up to {width}, but the "
                          f"model's input 'features' has {inputs['features'][-1]} features per row")
    if "predictions" not in outputs or outputs["predictions"][-1] != metadata["num_classes"]:
        raise ExportError(f"{path}: field 'num_classes' is {metadata['num_classes']}, but the model's output "
                          f"'predictions' has shape {outputs.get('predictions')}")


def onnx_providers(device: str) -> list[Any]:
    """onnxruntime execution providers for --device: 'auto' takes CUDA when onnxruntime has it."""
    import onnxruntime  # the onnx extra

    available = onnxruntime.get_available_providers()
    kind, _, index = device.partition(":")
    if kind == "cuda" or (kind == "auto" and "CUDAExecutionProvider" in available):
        if "CUDAExecutionProvider" not in available:
            raise ValueError(f"--device {device}: this onnxruntime has no CUDA provider (install onnxruntime-gpu)")
        return [("CUDAExecutionProvider", {"device_id": int(index or 0)}), "CPUExecutionProvider"]
    if kind not in ("cpu", "auto"):
        raise ValueError(f"--device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return ["CPUExecutionProvider"]


def create_session(model_path: str, device: str) -> Any:
    import onnxruntime  # the onnx extra
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors  # the onnx extra

    try:
        return onnxruntime.InferenceSession(model_path, providers=onnx_providers(device))
    except (ort_errors.Fail, ort_errors.InvalidProtobuf, ort_errors.InvalidGraph) as err:
        raise ExportError(f"{model_path}: onnxruntime cannot load it ({err})") from err

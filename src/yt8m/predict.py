"""`yt8m predict` (the starter kit's inference.py): each video's top-k classes as a Kaggle CSV or JSON
lines, from a train dir's checkpoint or an ONNX export; `yt8m convert-predictions` turns JSON lines into the CSV.

Streams batch by batch in constant memory; shards with or without labels work alike.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from typing import Any, Callable, Iterable, Iterator, Sequence, TextIO

import torch
from torch import nn

from yt8m.checkpoint import build_model_from_checkpoint, latest_checkpoint
from yt8m.config import PredictConfig, add_config_arguments, add_config_file_argument, parse_config
from yt8m.files import write_file_atomically
from yt8m.runtime import reader_workers, resolve_device, setup_logging, to_device

log = logging.getLogger("yt8m.predict")

CSV_HEADER = "VideoId,LabelConfidencePairs\n"
OUTPUT_FORMATS = ("csv", "jsonl")

# A batch dict of YT8MDataset -> probabilities [batch, classes] on the CPU.
Predictor = Callable[[dict], torch.Tensor]


def format_csv_row(video_id: str, classes: Sequence[int], confidences: Sequence[float]) -> str:
    """One Kaggle CSV line, `id,class confidence class confidence ...`: the one place the CSV is formatted."""
    pairs = " ".join("%i %f" % pair for pair in zip(classes, confidences))
    return f"{video_id},{pairs}\n"


def format_jsonl_row(video_id: str, classes: Sequence[int], confidences: Sequence[float]) -> str:
    return json.dumps({"video_id": video_id, "class_indexes": list(classes), "predictions": list(confidences)}) + "\n"


_ROW_FORMATTERS = {"csv": format_csv_row, "jsonl": format_jsonl_row}


def format_rows(video_ids: Sequence[str], predictions: torch.Tensor, top_k: int, output_format: str = "csv") -> str:
    """One line per video of its top-k classes, confidences descending."""
    values, indices = torch.topk(predictions.float(), k=min(top_k, predictions.shape[1]), dim=1)
    format_row = _ROW_FORMATTERS[output_format]
    return "".join(format_row(video_id, classes, confidences)
                   for video_id, classes, confidences in zip(video_ids, indices.tolist(), values.tolist()))


def write_predictions(predict: Predictor, batches: Iterable[dict], out: TextIO, top_k: int,
                      output_format: str = "csv") -> int:
    """Write (for CSV, the header and) one row per video of `batches` to `out`; returns the number of videos."""
    if output_format == "csv":
        out.write(CSV_HEADER)
    videos, started = 0, time.perf_counter()
    for batch in batches:
        out.write(format_rows(batch["video_ids"], predict(batch), top_k, output_format))
        videos += len(batch["video_ids"])
        log.info("predicted %d videos, %.0f videos/s", videos, videos / max(time.perf_counter() - started, 1e-9))
    return videos


def checkpoint_predictor(model: nn.Module, device: torch.device) -> Predictor:
    model.eval()

    @torch.no_grad()
    def predict(batch: dict) -> torch.Tensor:
        inputs = to_device(batch, device)
        return model(inputs["features"], inputs.get("num_frames"))["predictions"].cpu()

    return predict


def onnx_predictor(exported: Any) -> Predictor:
    """Predictions of an `ExportedModel` (onnxruntime) on the dataset's batches."""
    def predict(batch: dict) -> torch.Tensor:
        num_frames = batch.get("num_frames")
        return torch.from_numpy(exported.predict(batch["features"].numpy(),
                                                 None if num_frames is None else num_frames.numpy()))

    return predict


def load_predictor(config: PredictConfig) -> tuple[Predictor, Any, dict[str, Any]]:
    """The predictor for --model (ONNX) or --train_dir (latest checkpoint), the FeatureSpec its inputs
    are read with, and what the summary reports about the model."""
    from yt8m.data.dataset import FeatureSpec

    if config.model:
        from yt8m.onnx_export import load_exported

        exported = load_exported(config.model, config.device)
        meta = exported.metadata
        return onnx_predictor(exported), exported.feature_spec(), {
            "model_file": exported.model_file, "global_step": meta.get("global_step"),
            "providers": exported.session.get_providers()}
    path = latest_checkpoint(config.train_dir)
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {config.train_dir}/checkpoints: train a model there first")
    device = resolve_device(config.device)
    model, trained, step = build_model_from_checkpoint(path, device)
    return checkpoint_predictor(model, device), FeatureSpec.from_config(trained), {"checkpoint": path, "global_step": step}


def check_predict_config(config: PredictConfig) -> None:
    for name in ("input_data_pattern", "output_file"):
        if not getattr(config, name):
            raise ValueError(f"--{name} is required")
    if bool(config.model) == bool(config.train_dir):
        raise ValueError("give exactly one of --train_dir (a checkpoint) and --model (an ONNX export)")
    if config.output_format not in OUTPUT_FORMATS:
        raise ValueError(f"--output_format must be one of {', '.join(OUTPUT_FORMATS)}, got {config.output_format!r}")
    if config.top_k < 1:
        raise ValueError(f"--top_k must be at least 1, got {config.top_k}")


def run_predict(config: PredictConfig) -> dict[str, Any]:
    """Predict with an ONNX export or the train dir's latest checkpoint; returns a summary of what was written."""
    from yt8m.data.dataset import YT8MDataset, make_loader

    check_predict_config(config)
    predict, spec, source = load_predictor(config)
    dataset = YT8MDataset(config.input_data_pattern, spec, config.batch_size, skip_corrupt=config.skip_corrupt)
    pin_memory = not config.model and resolve_device(config.device).type == "cuda"
    loader = make_loader(dataset, reader_workers(config.num_readers, dataset.spec.frame_features), pin_memory=pin_memory)
    log.info("predicting %s with %s", config.input_data_pattern, source)
    started = time.perf_counter()
    videos = write_file_atomically(config.output_file, lambda out: write_predictions(
        predict, loader, out, config.top_k, config.output_format))
    seconds = time.perf_counter() - started
    log.info("wrote %d videos to %s in %.1f s", videos, config.output_file, seconds)
    return {"output_file": config.output_file, "output_format": config.output_format, "videos": videos,
            **source, "seconds": round(seconds, 3)}


def read_jsonl_predictions(path: str) -> Iterator[tuple[str, list[int], list[float]]]:
    """(video id, class indexes, confidences) of each line of a `--output_format jsonl` file, checked."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"predictions file not found: {path}")
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            video_id, classes, confidences = _parse_jsonl_record(where, line)
            if video_id in seen:
                raise ValueError(f"{where}: video {video_id!r} is already on line {seen[video_id]}")
            seen[video_id] = number
            yield video_id, classes, confidences


def _parse_jsonl_record(where: str, line: str) -> tuple[str, list[int], list[float]]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not a JSON object ({err})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for field in ("video_id", "class_indexes", "predictions"):
        if field not in record:
            raise ValueError(f"{where}: field '{field}' is missing")
    video_id, classes, confidences = record["video_id"], record["class_indexes"], record["predictions"]
    if not isinstance(video_id, str) or not video_id or "," in video_id:
        raise ValueError(f"{where}: field 'video_id' must be a non-empty string without commas, got {video_id!r}")
    if not isinstance(classes, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                                for c in classes):
        raise ValueError(f"{where}: field 'class_indexes' must be a list of non-negative integers, got {classes!r}")
    if not isinstance(confidences, list) or not all(isinstance(p, (int, float)) and not isinstance(p, bool)
                                                    and math.isfinite(p) for p in confidences):
        raise ValueError(f"{where}: field 'predictions' must be a list of finite numbers, got {confidences!r}")
    if len(classes) != len(confidences):
        raise ValueError(f"{where}: fields 'class_indexes' ({len(classes)}) and 'predictions' "
                         f"({len(confidences)}) must have the same length")
    return video_id, classes, confidences


def convert_predictions(input_file: str, output_file: str, top_k: int = 20) -> int:
    """The Kaggle CSV of a JSON-lines predictions file: each video's `top_k` most confident classes
    (a stable sort, so equal confidences keep the file's order); returns the number of videos."""
    if top_k < 1:
        raise ValueError(f"--top_k must be at least 1, got {top_k}")

    def write(out: TextIO) -> int:
        out.write(CSV_HEADER)
        videos = 0
        for video_id, classes, confidences in read_jsonl_predictions(input_file):
            ranked = sorted(zip(classes, confidences), key=lambda pair: -pair[1])[:top_k]
            out.write(format_csv_row(video_id, [c for c, _ in ranked], [p for _, p in ranked]))
            videos += 1
        return videos

    return write_file_atomically(output_file, write)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="yt8m predict", description=__doc__)
    add_config_file_argument(parser)
    add_config_arguments(parser, PredictConfig)
    config, _ = parse_config(PredictConfig, parser.parse_args(argv))
    setup_logging()
    print(json.dumps(run_predict(config)), flush=True)
    return 0


def convert_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="yt8m convert-predictions",
                                     description="Turn `yt8m predict --output_format jsonl` output into the Kaggle CSV.")
    parser.add_argument("--input", required=True, help="JSON lines: video_id, class_indexes, predictions.")
    parser.add_argument("--output", required=True, help="The Kaggle CSV to write (VideoId,LabelConfidencePairs).")
    parser.add_argument("--top_k", type=int, default=20, help="Classes kept per video (default: 20).")
    args = parser.parse_args(argv)
    setup_logging()
    videos = convert_predictions(args.input, args.output, args.top_k)
    print(json.dumps({"output_file": args.output, "videos": videos}), flush=True)
    return 0

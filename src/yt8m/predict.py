"""`yt8m predict` (the starter kit's inference.py): a Kaggle CSV of each video's top-k classes.

Streams batch by batch in constant memory; shards with or without labels work alike.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from typing import Any, Iterable, Sequence, TextIO

import torch
from torch import nn

from yt8m.checkpoint import build_model_from_checkpoint, latest_checkpoint
from yt8m.config import PredictConfig, add_config_arguments, add_config_file_argument, parse_config
from yt8m.runtime import reader_workers, resolve_device, setup_logging, to_device

log = logging.getLogger("yt8m.predict")

CSV_HEADER = "VideoId,LabelConfidencePairs\n"


def format_rows(video_ids: Sequence[str], predictions: torch.Tensor, top_k: int) -> str:
    """One CSV line per video: `id,class confidence class confidence ...`, confidences descending."""
    values, indices = torch.topk(predictions.float(), k=min(top_k, predictions.shape[1]), dim=1)
    lines = []
    for video_id, classes, confidences in zip(video_ids, indices.tolist(), values.tolist()):
        pairs = " ".join("%i %f" % pair for pair in zip(classes, confidences))
        lines.append(f"{video_id},{pairs}\n")
    return "".join(lines)


def write_predictions(model: nn.Module, batches: Iterable[dict], out: TextIO, top_k: int,
                      device: str | torch.device = "cpu") -> int:
    """Write the header and one row per video of `batches` to `out`; returns the number of videos."""
    device = torch.device(device)
    model.eval()
    out.write(CSV_HEADER)
    videos, started = 0, time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            features = to_device(batch, device)
            output = model(features["features"], features.get("num_frames"))
            out.write(format_rows(batch["video_ids"], output["predictions"].cpu(), top_k))
            videos += len(batch["video_ids"])
            log.info("predicted %d videos, %.0f videos/s", videos, videos / max(time.perf_counter() - started, 1e-9))
    return videos


def write_predictions_csv(model: nn.Module, batches: Iterable[dict], output_file: str, top_k: int,
                          device: str | torch.device = "cpu") -> int:
    """The whole CSV at `output_file`, which appears only once complete (written under a temporary name)."""
    directory = os.path.dirname(os.path.abspath(output_file))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{output_file}.tmp"
    with open(tmp, "w", newline="") as out:
        videos = write_predictions(model, batches, out, top_k, device)
    os.replace(tmp, output_file)
    return videos


def run_predict(config: PredictConfig) -> dict[str, Any]:
    """Predict with the train dir's latest checkpoint; returns a summary of what was written."""
    from yt8m.data.dataset import FeatureSpec, YT8MDataset, make_loader

    for name in ("input_data_pattern", "train_dir", "output_file"):
        if not getattr(config, name):
            raise ValueError(f"--{name} is required")
    path = latest_checkpoint(config.train_dir)
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {config.train_dir}/checkpoints: train a model there first")
    device = resolve_device(config.device)
    model, trained, step = build_model_from_checkpoint(path, device)
    dataset = YT8MDataset(config.input_data_pattern, FeatureSpec.from_config(trained), config.batch_size,
                          skip_corrupt=config.skip_corrupt)
    loader = make_loader(dataset, reader_workers(config.num_readers), pin_memory=device.type == "cuda")
    log.info("predicting %s with %s (step %d)", config.input_data_pattern, path, step)
    started = time.perf_counter()
    videos = write_predictions_csv(model, loader, config.output_file, config.top_k, device)
    seconds = time.perf_counter() - started
    log.info("wrote %d videos to %s in %.1f s", videos, config.output_file, seconds)
    return {"output_file": config.output_file, "videos": videos, "global_step": step, "seconds": round(seconds, 3)}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="yt8m predict", description=__doc__)
    add_config_file_argument(parser)
    add_config_arguments(parser, PredictConfig)
    config, _ = parse_config(PredictConfig, parser.parse_args(argv))
    setup_logging()
    print(json.dumps(run_predict(config)), flush=True)
    return 0

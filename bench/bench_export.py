"""Export size and prediction throughput, onnxruntime (CPU provider) against torch, of starter-kit sized
models: MoeModel (1152 features, 3862 classes, batch 1024) and frame-level DbofModel / LstmModel.

Run on demand: `.venv/bin/python bench/bench_export.py [--models MoeModel,DbofModel] [--frame_batch_size 128]`.
Prints one JSON line per model: bytes of the .onnx file, export seconds, examples/s of each runtime
(best of --repeats passes over --batches batches, after one warm-up batch) and their max abs difference.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Callable

import numpy as np
import torch

from yt8m.inference.onnx_export import create_session, export_onnx, input_names
from yt8m.models import create_model, is_frame_level
from yt8m.runtime import available_cpus

FEATURE_SIZE = 1152  # mean_rgb 1024 + mean_audio 128, or rgb + audio per frame
NUM_CLASSES = 3862


def make_inputs(model: torch.nn.Module, batch: int, frames: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Video level: raw features at the scale of dequantized YT8M values. Frame level: uint8 frames as the shards store
    them (what the models and their exports take, dequantized inside), videos of 50-100% of `frames`, zero-padded."""
    generator = torch.Generator().manual_seed(seed)
    if not model.frame_level:
        return (torch.rand(batch, FEATURE_SIZE, generator=generator) * 4 - 2,)
    num_frames = torch.randint(frames // 2, frames + 1, (batch,), generator=generator)
    features = torch.randint(0, 256, (batch, frames, FEATURE_SIZE), generator=generator, dtype=torch.uint8)
    return features * (torch.arange(frames) < num_frames[:, None]).unsqueeze(-1), num_frames


def best_examples_per_sec(run: Callable[[int], np.ndarray], batch: int, batches: int, repeats: int) -> float:
    run(0)  # warm-up: allocations, kernel selection
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for index in range(batches):
            run(index)
        best = min(best, time.perf_counter() - started)
    return batch * batches / best


def bench_model(name: str, batch: int, frames: int, batches: int, repeats: int, folder: str) -> dict:
    torch.manual_seed(0)
    model = create_model(name, FEATURE_SIZE, NUM_CLASSES)
    path = os.path.join(folder, f"{name}.onnx")
    started = time.perf_counter()
    exported = export_onnx(model, path)  # leaves the model in eval mode
    export_seconds = time.perf_counter() - started
    session = create_session(path, "cpu")
    inputs = [make_inputs(model, batch, frames, seed) for seed in range(min(batches, 2))]  # alternated: not all from cache
    feeds = [{n: t.numpy() for n, t in zip(input_names(model), tensors)} for tensors in inputs]

    def torch_run(index: int) -> np.ndarray:
        with torch.no_grad():
            return model(*inputs[index % len(inputs)])["predictions"].numpy()

    def onnx_run(index: int) -> np.ndarray:
        return session.run(["predictions"], feeds[index % len(feeds)])[0]

    torch_rate = best_examples_per_sec(torch_run, batch, batches, repeats)
    onnx_rate = best_examples_per_sec(onnx_run, batch, batches, repeats)
    return {
        "model": name, "batch_size": batch, "frames": frames if model.frame_level else None,
        "parameters": sum(p.numel() for p in model.parameters()), "onnx_bytes": os.path.getsize(path),
        "export_seconds": round(export_seconds, 2), "opset": exported["opset"],
        "torch_examples_per_sec": round(torch_rate, 1), "onnxruntime_examples_per_sec": round(onnx_rate, 1),
        "onnxruntime_speedup": round(onnx_rate / torch_rate, 3),
        "max_abs_diff": float(np.abs(torch_run(0) - onnx_run(0)).max()),
        "torch_threads": torch.get_num_threads(), "cpus": available_cpus(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="MoeModel,DbofModel", help="Comma-separated; LstmModel is slow on CPU.")
    parser.add_argument("--batch_size", type=int, default=1024, help="Video-level batch size.")
    parser.add_argument("--frame_batch_size", type=int, default=128,
                        help="Frame-level batch size (1024 x 300 frames x 1152 floats would need 1.4 GB per batch).")
    parser.add_argument("--frames", type=int, default=300, help="Padded frames per frame-level batch.")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="Best of this many passes is reported.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            batch = args.frame_batch_size if is_frame_level(name) else args.batch_size
            print(json.dumps(bench_model(name, batch, args.frames, args.batches, args.repeats, folder)), flush=True)


if __name__ == "__main__":
    main()

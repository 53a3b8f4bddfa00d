"""`yt8m eval` (the starter kit's eval.py) and `evaluate_model`, the in-process evaluation it runs.

Evaluates a train dir's latest checkpoint once, or watches it and evaluates each new checkpoint until the final one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from typing import Any, Iterable, Iterator, Optional, Sequence

import torch
from torch import nn
from tqdm import tqdm

from yt8m.checkpoint import build_model_from_checkpoint, differing_fields, final_checkpoint, latest_checkpoint
from yt8m.config import (
    MODEL_IDENTITY_FIELDS,
    DataConfig,
    EvalConfig,
    ModelConfig,
    TrainConfig,
    add_config_arguments,
    add_config_file_argument,
    field_names,
    load_config,
    parse_config,
)
from yt8m.files import write_file_atomically
from yt8m.runtime import reader_workers, resolve_device, setup_logging, to_device

log = logging.getLogger("yt8m.eval")

METRIC_KEYS = ("gap", "map", "map_all_classes", "hit_at_one", "perr", "loss", "num_videos")


def evaluate_model(model: nn.Module, dataset_or_loader: Iterable[dict], loss_fn: nn.Module, num_classes: int,
                   top_k: int = 20, device: str | torch.device = "cpu") -> dict[str, Any]:
    """GAP, mAP, Hit@1, PERR and loss of `model` over one pass of the batches; restores the model's mode.

    Batches without a single video or without a single label (test shards) are a ValueError, not metrics of 0.
    """
    from yt8m.metrics import EvaluationMetrics

    device = torch.device(device)
    source = getattr(getattr(dataset_or_loader, "dataset", dataset_or_loader), "pattern", "the evaluation data")
    was_training = model.training
    model.eval()
    videos, started = 0, time.perf_counter()
    try:
        with torch.no_grad(), EvaluationMetrics(num_classes, top_k) as metrics, \
                tqdm(unit="video", desc="eval", dynamic_ncols=True, disable=not sys.stderr.isatty()) as bar:
            for index, batch in enumerate(dataset_or_loader, start=1):
                batch = to_device(batch, device)
                output = model(batch["features"], batch.get("num_frames"))
                loss = loss_fn(output, batch["labels"]).item()
                metrics.accumulate(output["predictions"].float().cpu().numpy(), batch["labels"].cpu().numpy(), loss)
                videos += batch["labels"].shape[0]
                bar.update(batch["labels"].shape[0])
                log.info("eval batch %d: %d videos so far, batch loss %.5f, %.0f videos/s", index, videos, loss,
                         videos / max(time.perf_counter() - started, 1e-9))
            if not videos:
                raise ValueError(f"no videos in {source}: nothing to evaluate")
            if not metrics.num_labels:
                raise ValueError(f"no labels in {source}: evaluation needs labelled shards "
                                 "(test shards have none; `yt8m predict` takes them)")
            return metrics.get()
    finally:
        model.train(was_training)


def resolve_eval_config(config: EvalConfig, given: set[str]) -> EvalConfig:
    """Fill the model and data fields not given from the train dir's config.yaml; given ones must agree."""
    path = os.path.join(config.train_dir, "config.yaml")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{config.train_dir} is not a yt8m train dir (no config.yaml): train a model there first")
    trained = load_config(TrainConfig, path)
    identity = [name for name in dict.fromkeys([*MODEL_IDENTITY_FIELDS, *field_names(ModelConfig)]) if name in given]
    differing = differing_fields(trained, config, identity)
    if differing:
        lines = "\n".join(f"  --{name}: given {new!r}, {path} has {old!r}" for name, old, new in differing)
        raise ValueError(f"the flags disagree with the model in {config.train_dir}:\n{lines}\n"
                         f"Drop these flags (they are read from the train dir) or point --train_dir elsewhere.")
    inherited = set(field_names(DataConfig)) | set(field_names(ModelConfig)) | {"label_loss"}
    return dataclasses.replace(config, **{name: getattr(trained, name) for name in inherited - given})


def write_metrics(train_dir: str, result: dict[str, Any], writer) -> str:
    """DIR/eval/metrics-<step>.json (written atomically) and the same scalars for TensorBoard."""
    path = os.path.join(train_dir, "eval", f"metrics-{result['global_step']:08d}.json")
    write_file_atomically(path, lambda out: json.dump(result, out, indent=1))
    for name in METRIC_KEYS:
        writer.add_scalar(name, result[name], result["global_step"])
    writer.flush()
    return path


def evaluate_checkpoints(config: EvalConfig, given: set[str] = frozenset()) -> Iterator[dict[str, Any]]:
    """Yield the metrics of the latest checkpoint, then (unless run_once) of each new one until the final."""
    from torch.utils.tensorboard import SummaryWriter

    from yt8m.data.dataset import FeatureSpec, YT8MDataset, make_loader
    from yt8m.losses import create_loss

    if not config.eval_data_pattern:
        raise ValueError("--eval_data_pattern is required")
    if not config.run_once:
        wait_for(lambda: os.path.exists(os.path.join(config.train_dir, "config.yaml")), config)
    config = resolve_eval_config(config, given)
    device = resolve_device(config.device)
    dataset = YT8MDataset(config.eval_data_pattern, FeatureSpec.from_config(config), config.batch_size,
                          skip_corrupt=config.skip_corrupt)
    loader = make_loader(dataset, reader_workers(config.num_readers), pin_memory=device.type == "cuda")
    loss_fn = create_loss(config.label_loss)
    writer = SummaryWriter(os.path.join(config.train_dir, "eval"))
    evaluated: Optional[str] = None
    try:
        while True:
            latest = latest_checkpoint(config.train_dir)
            if latest is None and config.run_once:
                raise FileNotFoundError(f"no checkpoint in {config.train_dir}/checkpoints: train a model there first")
            if latest is not None and latest != evaluated:
                result = evaluate_checkpoint(latest, loader, loss_fn, config, device)
                if result is not None:
                    write_metrics(config.train_dir, result, writer)
                    yield result
                    evaluated = latest
                if config.run_once and result is not None:
                    return
                continue
            if evaluated is not None and final_checkpoint(config.train_dir) == evaluated:
                log.info("evaluated the final checkpoint %s; done", evaluated)
                return
            time.sleep(config.poll_interval_secs)
    finally:
        writer.close()


def evaluate_checkpoint(path: str, loader: Iterable[dict], loss_fn: nn.Module, config: EvalConfig,
                        device: torch.device) -> Optional[dict[str, Any]]:
    """One checkpoint's metrics, or None when the trainer pruned it before it could be read."""
    try:
        model, _, step = build_model_from_checkpoint(path, device)
    except FileNotFoundError:
        log.info("%s was removed before it could be evaluated; moving on to a newer one", path)
        return None
    log.info("evaluating %s (step %d) on %s", path, step, config.eval_data_pattern)
    metrics = evaluate_model(model, loader, loss_fn, config.num_classes, config.top_k, device)
    result = {"global_step": step, **{name: metrics[name] for name in METRIC_KEYS}}
    log.info("step %d: %s", step, ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in result.items() if k != "global_step"))
    return result


def wait_for(condition, config: EvalConfig) -> None:
    logged = False
    while not condition():
        if not logged:
            log.info("waiting for training to start in %s", config.train_dir)
            logged = True
        time.sleep(config.poll_interval_secs)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="yt8m eval", description=__doc__)
    add_config_file_argument(parser)
    add_config_arguments(parser, EvalConfig)
    config, given = parse_config(EvalConfig, parser.parse_args(argv))
    setup_logging()
    for result in evaluate_checkpoints(config, given):
        print(json.dumps(result), flush=True)
    return 0

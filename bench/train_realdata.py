"""Validation GAP per epoch of LogisticModel and MoeModel trained on real YouTube-8M 2018 video-level shards.

Trains on validate0000-0047 and evaluates on validate0048-0063 after every epoch (an epoch-end hook).
Usage: .venv/bin/python bench/train_realdata.py [--models LogisticModel,MoeModel] [--num_epochs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from yt8m.config import config_from_dict
from yt8m.data.reading.dataset import YT8MDataset, make_loader
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.eval.evaluate import evaluate_model
from yt8m.process_settings import configure_training_process
from yt8m.runtime import setup_logging
from yt8m.tasks.video import features_task
from yt8m.training import TrainConfig, TrainEvent, train

SHARDS = Path(__file__).resolve().parents[1].parent / "shared" / "realdata" / "yt8m_2018_video_validate"
TRAIN_SHARDS = range(0, 48)
VALIDATE_SHARDS = range(48, 64)
# The starter kit, 10 epochs with its defaults on all 64 shards, evaluated on 39k other validate videos.
STARTER_KIT_GAP = {"LogisticModel": 0.568, "MoeModel": 0.600}


def shard_pattern(shards: range) -> str:
    return ",".join(str(SHARDS / f"validate{index:04d}.tfrecord") for index in shards)


class EpochValidation:
    """Epoch-end hook: evaluate the live model on the validation shards and keep the GAP curve."""

    def __init__(self, config: TrainConfig) -> None:
        dataset = YT8MDataset(shard_pattern(VALIDATE_SHARDS), config.features, 1024, ReadOptions(cache_in_memory=True))
        self.loader = make_loader(dataset, num_workers=0)
        self.task = features_task(config.features, config.loss.name, top_n=config.validation.top_n)
        self.curve: list[dict] = []

    def __call__(self, event: TrainEvent) -> None:
        if event.kind != "epoch_end":
            return
        metrics = evaluate_model(event.model, self.loader, self.task)
        point = {"model": event.config.model.name, "epoch": event.epoch, "step": event.step,
                 "train_loss": round(event.loss, 5), **{k: metrics[k] for k in ("gap", "map", "hit_at_one", "loss")}}
        self.curve.append(point)
        print(json.dumps(point), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="LogisticModel,MoeModel")
    parser.add_argument("--num_epochs", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--work_dir", default=None, help="Where the train dirs go (default: a temp dir).")
    parser.add_argument("--mixed_precision", action="store_true", help="Train with bfloat16 autocast.")
    args = parser.parse_args()
    setup_logging()
    configure_training_process()  # as `yt8m train` does
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="yt8m-realdata-")
    finals = {}
    for model in args.models.split(","):
        config = config_from_dict(TrainConfig, dict(
            train_data_pattern=shard_pattern(TRAIN_SHARDS), train_dir=os.path.join(work_dir, model), model=model,
            feature_names="mean_rgb,mean_audio", feature_sizes="1024,128", batch_size=args.batch_size,
            num_epochs=args.num_epochs, export_model_steps=10 ** 9, num_readers=1, cache_in_memory=True,
            start_new_model=True, log_every_steps=10, mixed_precision=args.mixed_precision), source="train_realdata")
        validation = EpochValidation(config)
        summary = train(config, hooks=[validation])
        finals[model] = {"final_gap": validation.curve[-1]["gap"], "best_gap": max(p["gap"] for p in validation.curve),
                         "epochs": len(validation.curve), "train_examples_per_sec": summary["examples_per_sec"],
                         "starter_kit_gap_reference": STARTER_KIT_GAP.get(model)}
    print(json.dumps(finals), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

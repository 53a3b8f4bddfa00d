"""`yt8m predict`: each video's top-k classes as a Kaggle CSV or JSON lines (`run_predict`), from a checkpoint or an
ONNX export; with --segment_labels the 2019 segment CSV (yt8m.inference.segment_predict).

Streams batch by batch in memory that does not grow with the videos (the ids written so far, checked for duplicates,
live in a temporary SQLite file); shards with or without labels work alike. The output is written under a temporary
name and renamed when complete; a video id the format cannot hold, a duplicate id or a prediction that is not finite
is an error, and no output is left.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any, Iterable

import torch

from yt8m.config import ConfigError, config_problems
from yt8m.data.format.tfrecord import list_shards
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.dataset import YT8MDataset, make_loader
from yt8m.data.reading.inspection import find_video
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.distributed.across_ranks import SpilledPieces, from_every_rank, this_rank_shards, together
from yt8m.distributed.ranks import all_reduce_sum, launched_by_torchrun, process_group, rank_and_world_size, send_stream
from yt8m.inference.config import OutputConfig, PredictConfig
from yt8m.inference.model_tgz import pack_model, unpack_model
from yt8m.inference.predictions import Locator, Predictor, load_predictor, predicted_rows, write_predictions, write_rows
from yt8m.inference.segment_predict import predict_segments
from yt8m.io.files import write_file_atomically
from yt8m.runtime import reader_workers, resolve_device

log = logging.getLogger("yt8m.inference.predict")

def run_predict(config: PredictConfig) -> dict[str, Any]:
    """Predict with an ONNX export or the train dir's latest checkpoint; returns a summary of what was written.
    With --segment_labels: the 2019 segment CSV (yt8m.inference.segment_predict). Under torchrun the processes split the
    shards (yt8m.distributed.across_ranks) and rank 0 writes every process's rows, in shard order, to the one output
    file."""
    problems = config_problems(config)
    if problems:
        raise ConfigError("invalid predict config", problems)
    source = config.source
    if source.input_model_tgz:
        if launched_by_torchrun():
            raise ConfigError("invalid predict config", ["--input_model_tgz is unpacked by one process: unpack it "
                                                         "once, then predict with --train_dir under torchrun"])
        unpacked = unpack_model(source.input_model_tgz, source.untar_model_dir)
        config = dataclasses.replace(config, source=dataclasses.replace(source, **unpacked))
        log.info("unpacked --input_model_tgz %s into %s", source.input_model_tgz, source.untar_model_dir)
    if not launched_by_torchrun():
        return _run_predict(config)
    with process_group(torch.device("cpu")):  # gloo: the rows travel as pickled text, whatever the model's device
        return _run_predict(config)


def _run_predict(config: PredictConfig) -> dict[str, Any]:
    rank, world_size = rank_and_world_size()
    data, output, model_source = config.data, config.output, config.source
    if config.segments.segment_labels and world_size > 1:
        raise ConfigError("invalid predict config", ["--segment_labels ranks each class's segments over every "
                                                     "video: run it as one process, not under torchrun"])
    predict, spec, source = load_predictor(model_source, data.device)
    if model_source.output_model_tgz and rank == 0:
        packed = pack_model(model_source.output_model_tgz, source.get("checkpoint", ""), model_source.model)
        log.info("packed %s into --output_model_tgz %s", ", ".join(packed), model_source.output_model_tgz)
        source = {**source, "output_model_tgz": model_source.output_model_tgz}
    if config.segments.segment_labels:
        return predict_segments(config, predict, spec, source)
    # Whole shards per process, in contiguous blocks: not YT8MDataset's split for training.
    listed = list_shards(data.input_data_pattern)
    all_paths = list(listed)
    dataset = YT8MDataset(this_rank_shards(listed, f"shards to predict ({data.input_data_pattern})"), spec,
                          data.batch_size, ReadOptions(skip_corrupt=data.skip_corrupt, rank=0, world_size=1))
    pin_memory = not model_source.model and resolve_device(data.device).type == "cuda"
    loader: Iterable[Batch] = make_loader(dataset, reader_workers(data.num_readers, dataset.spec.frame_features),
                                          pin_memory=pin_memory) if dataset.paths else []
    log.info("predicting %s with %s", data.input_data_pattern, source)
    started = time.perf_counter()
    locate = functools.partial(find_video, all_paths)
    if world_size == 1:
        videos = write_file_atomically(output.output_file, lambda out: write_predictions(
            predict, loader, out, output.top_k, output.output_format, output.output_file, locate))
    else:
        videos = _write_across_ranks(output, predict, loader, locate)
    seconds = time.perf_counter() - started
    if rank == 0:
        log.info("wrote %d videos to %s in %.1f s", videos, output.output_file, seconds)
    skipped = {"skipped_files": all_reduce_sum(dataset.skipped_files, torch.device("cpu")),
               "skipped_records": all_reduce_sum(dataset.skipped_records, torch.device("cpu"))} \
        if data.skip_corrupt else {}
    processes = {"processes": world_size} if world_size > 1 else {}
    return {"output_file": output.output_file, "output_format": output.output_format, "videos": videos,
            **source, **skipped, **processes, "seconds": round(seconds, 3)}


def _write_across_ranks(config: OutputConfig, predict: Predictor, batches: Iterable[Batch], locate: Locator) -> int:
    """Every process predicts its batches into a temporary file; once all have succeeded, rank 0 writes its own
    rows and then each other process's, in rank order, to the output (checking ids for duplicates over all).
    Returns the videos written (at rank 0; the others: 0)."""
    spilled = SpilledPieces()
    try:
        with together():  # a failed process fails all, before any output is begun
            for rows in predicted_rows(predict, batches, config.top_k, config.output_format, config.output_file,
                                       locate):
                spilled.add(rows)
        if rank_and_world_size()[0] != 0:
            send_stream(spilled)
            return 0
        return write_file_atomically(config.output_file, lambda out: write_rows(
            from_every_rank(spilled), out, config.output_format, config.output_file, locate))
    finally:
        spilled.close()



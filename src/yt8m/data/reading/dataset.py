"""PyTorch datasets over YouTube-8M TFRecord shards: streamed, split over ranks and workers, shuffled, batched.

Video-level Examples become [B, D] batches, frame-level SequenceExamples padded [B, T, D] batches, and each rated
2019 segment a [segment_size, D] example; video-level sets that fit in RAM can be decoded once and served from memory.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator, Mapping, Optional, Sequence

from torch.utils.data import DataLoader, IterableDataset

from yt8m.data.format.tfrecord import list_shards
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.batch_build import finish_batch
from yt8m.data.reading.batch_memory import BatchMemory
from yt8m.data.reading.cache import CachedDataset, VideoCache
from yt8m.data.reading.cache_estimate import cache_load_batch, mean_record_bytes
from yt8m.data.reading.delivery import Delivery, batch_loader, in_process, worker_deliveries
from yt8m.data.reading.read_plan import ReadOptions, ReadPlan, reader_shares
from yt8m.data.reading.read_stats import ReadCounter, ReadStats
from yt8m.data.reading.shard_reader import ShardReader
from yt8m.data.reading.spec import FeatureSpec


class YT8MDataset(IterableDataset):
    """Whole batches (yt8m.data.reading.batch.Batch) from YT8M shards, one epoch per `iter()`: the files of `pattern`
    (comma-separated globs, or the paths themselves), read as `options` (ReadOptions) say.

    The records are split over distributed ranks and DataLoader workers so that each is read exactly once
    per epoch. With `shuffle`, the file order changes every epoch (`set_epoch`) and records pass a bounded
    shuffle buffer; without it the order is fixed. With the spec's `segment_labels`, each rated segment of a record
    is an example (a record without ratings gives none), with `label_weights` beside `labels`. `cache_in_memory`
    (video level) decodes this rank's records once and serves later epochs from RAM; `record_bytes` counts the
    record bytes read in `read_stats`.

    With `skip_corrupt`, a shard with a framing error (CRC, truncation) is read up to it and the rest skipped, and a
    record that fails to decode is skipped, each with a warning naming the file and offset. `read_stats` (ReadStats;
    also `skipped_files`, `skipped_records`) counts them over every epoch read so far: in the process that iterates
    the dataset, or in the main process when the batches come through make_loader's workers, which send the
    counts along with their batches. Shards that mix 2017 and 2018 id keys get one warning.
    """

    def __init__(self, pattern: str | Sequence[str] | Mapping[str, Optional[int]], spec: FeatureSpec, batch_size: int,
                 options: ReadOptions = ReadOptions()):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if options.cache_in_memory and spec.segment_labels:
            raise ValueError("cache_in_memory holds videos; rated segments are streamed")
        self.spec = spec.checked()
        self.batch_size = batch_size
        self.options = options
        self.plan = ReadPlan(list_shards(pattern) if isinstance(pattern, str) else pattern, options)
        self.counter = ReadCounter()
        self.memory = BatchMemory()
        self.cache: Optional[CachedDataset] = None
        self.batch_loader_worker = False  # set in make_loader's workers: they send Delivery items to BatchLoader
        self.resuming: Optional[tuple[int, dict[int, Any], int]] = None  # resume_at's epoch, positions, rotation

    @property
    def paths(self) -> list[str]:
        return self.plan.paths

    @property
    def read_stats(self) -> ReadStats:
        return self.counter.total

    @property
    def skipped_files(self) -> int:
        return self.read_stats.skipped_files

    @property
    def skipped_records(self) -> int:
        return self.read_stats.skipped_records

    @functools.cached_property
    def record_bytes(self) -> float:
        """The mean size of its records as a shuffle buffer holds them, from its first shards' first records (a few
        requests, once)."""
        return mean_record_bytes(self.paths, sizes=self.plan.sizes)

    def set_epoch(self, epoch: int) -> None:
        self.plan.set_epoch(epoch)

    def resume_at(self, epoch: int, positions: Mapping[int, Any], rotation: int) -> None:
        """Read epoch `epoch` on from `positions` (each reader's, by index: where it stood after the last batch a run
        trained on; a reader without one starts at the epoch's start), its DataLoader workers `rotation` places on (so
        that worker 0 reads the shares of the worker whose batch came next): the batches that follow are those the
        uninterrupted epoch gives after them, in the same order."""
        self.resuming = (epoch, dict(positions), rotation)

    def __iter__(self) -> Iterator[Batch | Delivery]:
        """Batches; in a worker of make_loader's BatchLoader, Delivery items (a batch, or read counts or an error)
        that BatchLoader turns back into batches."""
        if self.batch_loader_worker:
            return worker_deliveries(self._batches(), self.counter, self.spec.num_classes)
        return in_process(self._batches(), self.counter, self.spec.num_classes, self.memory.pin_memory)

    def _batches(self) -> Iterator[Batch]:
        """This reader's batches, labels as LabelIds; a generator, so that a RAM cache is filled (and its errors
        raised) where the first batch is asked for."""
        epoch, positions, rotation = self.resuming if self.resuming is not None else (-1, {}, 0)
        if epoch != self.plan.epoch:
            positions, rotation = {}, 0
        if self.options.cache_in_memory:
            if self.cache is None:
                self.load_cache()
            assert self.cache is not None  # load_cache sets it (or raises)
            yield from self.cache.batches(positions.get(0))
            return
        reader, readers = self.plan.reader(rotation)
        shard_reader = ShardReader(self.spec, self.batch_size, self.options, self.counter, self.memory)
        yield from shard_reader.batches(self.plan.shares(reader, readers), self.plan.shuffle_stream(reader, readers),
                                        reader, positions.get(reader))

    def stream_instead_of_caching(self) -> None:
        """Read the shards every epoch after all (a RAM cache that would not fit the memory)."""
        self.options = dataclasses.replace(self.options, cache_in_memory=False)

    def check_first_record(self) -> None:
        """Decode the first record of the first file with the spec, so that a mismatch (a wrong feature size, a
        missing feature, another label space) fails before a run starts, with the error reading would give."""
        probe = ShardReader(self.spec, 1, self.options, ReadCounter(), BatchMemory())
        next(probe.batches(reader_shares(self.paths[:1], 0, 1, self.plan.sizes), None), None)

    def load_cache(self, num_workers: int = 0) -> None:
        """Decode this rank's records into RAM (with `num_workers` reader processes); later epochs reuse them."""
        load_batch = cache_load_batch(self.spec, self.batch_size)
        streamed = ReadOptions(skip_corrupt=self.options.skip_corrupt, rank=self.plan.rank,
                               world_size=self.plan.world_size)
        if num_workers == 0:  # all of this rank's records, even when called inside a DataLoader worker
            # counted where this dataset's own reading is
            reader = ShardReader(self.spec, load_batch, streamed, self.counter, BatchMemory())
            batches = (finish_batch(batch, self.spec.num_classes) for batch in reader.batches(self.plan.rank_shares(),
                                                                                              None))
            videos = VideoCache.from_batches(batches, self.spec)
        else:  # in the main process (make_loader), where the loading dataset absorbed its workers' counts and warned
            loading = YT8MDataset(self.plan.sizes, self.spec, load_batch, streamed)
            videos = VideoCache.from_batches(make_loader(loading, num_workers), self.spec)
            self.read_stats.add(loading.read_stats)
        self.cache = CachedDataset(videos, self.plan, self.batch_size, self.options.drop_remainder)


def make_loader(dataset: YT8MDataset, num_workers: int, pin_memory: bool = False) -> DataLoader:
    """A DataLoader passing the dataset's batches through (batch_size=None), read by `num_workers` processes.

    Workers are started anew each epoch so `set_epoch` reaches them. A RAM cache is filled by `num_workers`
    processes, then served in-process: its batches are gathers from memory, and a worker process would only
    compete with the model for the cores and copy each batch once more (bench/bench_train.py on 2 cores:
    LogisticModel 5.4k examples/s with one worker, 11.1k in-process).
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if dataset.options.cache_in_memory:
        if dataset.cache is None:
            dataset.load_cache(num_workers)
        num_workers = 0
    return batch_loader(dataset, num_workers, pin_memory)

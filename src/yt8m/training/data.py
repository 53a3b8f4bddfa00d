"""A run's training data: the datasets of its tasks' sources (one for a run of one task), read in turn batch by
batch, each batch tagged with its source so that the task set knows which tasks it feeds."""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import torch

from yt8m.data.format.tfrecord import read_records
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.cache import CachePosition
from yt8m.data.reading.dataset import YT8MDataset, make_loader
from yt8m.data.reading.memory_budget import available_memory, human_bytes
from yt8m.data.reading.node_plan import plan_node
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.data.reading.shuffle_stream import StreamPosition
from yt8m.data.reading.spec import DataConfig, FeatureSpec
from yt8m.distributed.across_ranks import agreed_listing
from yt8m.models.model_size import ModelSize
from yt8m.process_settings import map_frame_batch_blocks
from yt8m.runtime import processes_sharing_machine, reader_workers
from yt8m.tasks.taskset import TaskSet, TaskSource, naming_tasks
from yt8m.training.memory_checks import RunMemory, cache_fits, reading_needs, run_memory

log = logging.getLogger("yt8m.train")


# How many of a frame-level batch's float32 copies the reusing heap (process_settings.reuse_freed_memory) grew by,
# beyond those alive: FrameLevelLogisticModel at batch 1024 of 300 frames on the CPU, 12.3 GB peak RSS at step 6
# against 4.5 GB with those blocks mapped (1.4 GB a copy). Mapping them costs page faults: DbofModel at batch 64
# (88 MB a copy) trained 10% slower so, hence only where the growth would take a good part of the memory.
HEAP_GROWTH_COPIES = 6
HEAP_GROWTH_SHARE = 1 / 8


def heap_growing_frame_copies(datasets: list[YT8MDataset], device: torch.device) -> int:
    """The bytes of the largest frame-level batch's float32 copy where, on the CPU, the heap's growth by copies of it
    would take more than an eighth of the memory available; else 0 (also where nothing says how much is available).
    On a GPU the copies are made on the device."""
    memory = available_memory()
    if device.type != "cpu" or memory is None:
        return 0
    copy_bytes = max((4 * dataset.batch_size * dataset.spec.max_frames * dataset.spec.feature_size
                      for dataset in datasets if dataset.spec.frame_features), default=0)
    return copy_bytes if HEAP_GROWTH_COPIES * copy_bytes > HEAP_GROWTH_SHARE * memory else 0


def streamed_opens(datasets: list[YT8MDataset]) -> int:
    """The shards the streamed sources' readers opened (a RAM cache's filling aside)."""
    return sum(dataset.read_stats.files_opened for dataset in datasets if not dataset.options.cache_in_memory)


class TrainingData:
    """The training sources' datasets, read in turn: which source gives the next batch is drawn per batch
    (--task_sampling), seeded by the run's seed and the epoch; an epoch ends when every source is read through."""

    def __init__(self, data: DataConfig, features: FeatureSpec, batch_size: int, seed: int, task_sampling: str,
                 tasks: TaskSet):
        self.data, self.seed, self.task_sampling, self.tasks = data, seed, task_sampling, tasks
        options = ReadOptions(shuffle=True, seed=seed, shuffle_buffer=data.shuffle_buffer,
                              skip_corrupt=data.skip_corrupt, cache_in_memory=data.cache_in_memory, record_bytes=True)
        self.datasets = [YT8MDataset(source.pattern, source_spec(features, source), batch_size, options)
                         for source in tasks.sources]
        for source, dataset in zip(tasks.sources, self.datasets):
            agreed_listing(dataset.plan.sizes, f"training shards ({source.pattern})")
        self.loaders: list[Iterable[Batch]] = []
        self._epoch = 0  # the epoch read last
        self._trained: list[dict[str, Any]] = []  # each source's readers' positions after the batches trained on
        self._interleaving: Optional[dict[str, Any]] = None
        self._epoch_start: list[int] = []  # each dataset's count (record bytes, or cached examples) as the epoch began
        self._examples: list[int] = []  # this epoch's examples of each source
        self._resumed_opens: Optional[tuple[int, int]] = None  # a resume's files opened before it, shards read

    def check_first_records(self) -> None:
        """Decode each source's first record, so that a mismatch fails before the run starts; a source without a
        single record (a task that would train nothing while the run succeeds) is an error too."""
        for source, dataset in zip(self.tasks.sources, self.datasets):
            with naming_tasks(source):
                if not any(next(read_records(path, size=size), None) is not None
                           for path, size in dataset.plan.sizes.items()):
                    raise ValueError(f"{source.pattern} has no training examples: its files hold no records; "
                                     f"nothing was trained")
                dataset.check_first_record()

    def memory(self, size: ModelSize) -> RunMemory:
        """What a run of a model of `size` on these sources will still take once the model is built."""
        return run_memory(size, self.datasets, self.readers)

    @functools.cached_property
    def readers(self) -> int:
        """The reader workers each source is read with, as asked (or `auto`'s choice), on this process's CPUs."""
        return max(reader_workers(self.data.num_readers, dataset.spec.frame_features) for dataset in self.datasets)

    def open(self, device: torch.device, memory: RunMemory, size: ModelSize) -> RunMemory:
        """Start reading (make the loaders); with the train dir locked, as a RAM cache is filled here (where its
        estimate fits the memory less what the run itself takes: otherwise the sources are streamed, or
        --cache_in_memory_required stops the run). The readers and shuffle buffers are planned for the whole
        machine (every process of the run on it): fewer of them where they would not fit, each change logged. The
        run's memory, as read so."""
        if self.data.cache_in_memory and not cache_fits(self.datasets, self.data.cache_in_memory_required,
                                                        memory.reserve(streaming=False)):
            for dataset in self.datasets:
                dataset.stream_instead_of_caching()
        plan = plan_node(self.readers, self.data.shuffle_buffer, reading_needs(memory, self.datasets, self.streaming),
                         processes_sharing_machine(), available_memory())
        for note in plan.notes:
            log.warning("the run's reading on this machine: %s", note)
        for dataset in self.datasets if plan.shuffle_buffer != self.data.shuffle_buffer else ():
            dataset.options = dataclasses.replace(dataset.options, shuffle_buffer=plan.shuffle_buffer)
        copy_bytes = heap_growing_frame_copies(self.datasets, device)
        if copy_bytes:
            map_frame_batch_blocks()
            log.info("frame-level batches of %s each in float32 on the CPU: blocks over 32 MB are mapped on their "
                     "own, so that copies of them do not grow the heap", human_bytes(copy_bytes))
        self.loaders = [make_loader(dataset, plan.readers, pin_memory=device.type == "cuda")
                        for dataset in self.datasets]
        return run_memory(size, self.datasets, plan.readers)

    @property
    def streaming(self) -> bool:
        """Whether any source is read from its shards each epoch (not a RAM cache)."""
        return any(not dataset.options.cache_in_memory for dataset in self.datasets)

    def epoch_batches(self, epoch: int, resume: Optional[dict[str, Any]] = None) -> Iterator[Batch]:
        """The epoch's batches, each with where the run's reading stood after it (an EpochPosition); from `resume`
        (a `state()` of this epoch, which `resumes` accepts) on: the batches that followed it, in the same order,
        reading only the shards its readers' buffers held records of (yt8m.data.reading.shuffle_stream)."""
        self._epoch = epoch
        self._trained = [{"positions": {}, "last": None} for _ in self.datasets]
        for index, dataset in enumerate(self.datasets):
            dataset.set_epoch(epoch)
            if resume is not None:
                positions, rotation = resumed_positions(resume["sources"][index], self.loaders[index])
                dataset.resume_at(epoch, positions, rotation)
                self._trained[index] = {"positions": positions, "last": resume["sources"][index]["last"]}
        self._epoch_start = [dataset.read_stats.record_bytes for dataset in self.datasets]
        self._resumed_opens = (None if resume is None or not self.streaming
                               else (streamed_opens(self.datasets), shards_read(resume)))
        self._examples = [0] * len(self.datasets)
        self._interleaving = resume["interleave"] if resume is not None else None
        streams = [self._counted(tagged(loader, index, source), index) for index, (loader, source)
                   in enumerate(zip(self.loaders, self.tasks.sources))]
        if len(streams) == 1:
            return streams[0]
        rng = np.random.default_rng([self.seed, epoch, len(self.datasets)])
        return Interleaving(streams, self.task_sampling, self.source_weights(), rng, self._interleaving).batches()

    def _counted(self, batches: Iterable[Batch], index: int) -> Iterator[Batch]:
        for batch in batches:
            self._examples[index] += len(batch)
            batch.position = EpochPosition(index, batch.position)
            yield batch

    def trained(self, batch: Batch) -> None:
        """Note that the run trained on `batch`: where its reading stood after it is what a checkpoint keeps."""
        position = batch.position
        if self._resumed_opens is not None:
            opened_before, read_before = self._resumed_opens
            log.info("resumed epoch %d: its readers opened %d shards for their first batches, of the %d they had "
                     "read when the checkpoint was written", self._epoch + 1,
                     streamed_opens(self.datasets) - opened_before, read_before)
            self._resumed_opens = None
        if not isinstance(position, EpochPosition) or position.reader is None:
            return
        source = self._trained[position.source]
        source["positions"][position.reader.reader] = position.reader
        source["last"] = position.reader.reader
        self._interleaving = position.interleave

    def state(self) -> dict[str, Any]:
        """Where this process's reading stands, as a checkpoint keeps it (plain values): each source's readers'
        positions after the batches trained on, the reader of the last one, the interleaving of the sources, and what
        a resume must agree with (the processes, workers, batches and buffers)."""
        return {"epoch": self._epoch, "world_size": self.datasets[0].plan.world_size,
                "batch_size": self.datasets[0].batch_size,
                "workers": [getattr(loader, "num_workers", 0) for loader in self.loaders],
                "shuffle_buffers": [dataset.options.shuffle_buffer for dataset in self.datasets],
                "segments": any(dataset.spec.segment_labels for dataset in self.datasets),
                "sources": [{"positions": {reader: dataclasses.asdict(position)
                                           for reader, position in source["positions"].items()},
                             "last": source["last"]} for source in self._trained],
                "interleave": self._interleaving}

    def resumes(self, state: Optional[dict[str, Any]]) -> bool:
        """Whether a checkpoint's `state` lets this run go on from its readers' positions (the same processes,
        workers, batch size and shuffle buffers; no 2019 segments); else it reads the epoch up to the checkpoint
        again, as a checkpoint written before positions were kept is resumed (saying why)."""
        mine = self.state()
        keys = ("world_size", "batch_size", "workers", "shuffle_buffers")
        if state is None or state.get("segments") or mine["segments"] or any(state.get(key) != mine[key]
                                                                              for key in keys):
            log.info("resuming by reading the epoch up to the checkpoint again: %s",
                     "its readers' positions were not kept" if state is None else
                     "2019 segments are resumed so" if mine["segments"] or state.get("segments") else
                     "it was read with other processes, workers, batches or buffers")
            return False
        return True

    def epoch_fraction(self) -> Optional[float]:
        """The share of this epoch's data this process has read (for the total steps and the ETA): the record bytes
        read against its share of the shards' bytes, or for a RAM cache the examples served against its size."""
        if not self._examples:
            return None
        if any(dataset.options.cache_in_memory for dataset in self.datasets):
            cached = sum(len(dataset.cache) for dataset in self.datasets if dataset.cache is not None)
            return sum(self._examples) / cached if cached else None
        share = sum(dataset.plan.shard_bytes / dataset.plan.world_size for dataset in self.datasets)
        read = sum(dataset.read_stats.record_bytes - start for dataset, start in zip(self.datasets, self._epoch_start))
        return read / share if share else None

    def source_weights(self) -> list[float]:
        if self.task_sampling == "weights":
            weights = dict(zip(self.tasks.names, (spec.objective.weight for spec in self.tasks.specs)))
            return [sum(weights[name] for name in source.tasks) for source in self.tasks.sources]
        return [float(dataset.plan.shard_bytes) for dataset in self.datasets]

    @property
    def skipped_files(self) -> int:
        return sum(dataset.skipped_files for dataset in self.datasets)

    @property
    def skipped_records(self) -> int:
        return sum(dataset.skipped_records for dataset in self.datasets)


def source_spec(features: FeatureSpec, source: TaskSource) -> FeatureSpec:
    """How a source's records are read: the run's features, the source's label space and kind of labels."""
    return dataclasses.replace(features, num_classes=source.record_classes, segment_labels=source.segments)


def tagged(batches: Iterable[Batch], index: int, source: TaskSource) -> Iterator[Batch]:
    with naming_tasks(source):
        for batch in batches:
            batch.source = index
            yield batch


@dataclass
class EpochPosition:
    """Where a run's reading stood after a batch: the batch's source, its reader's position (a StreamPosition or
    CachePosition; None where it keeps none: 2019 segments), and the sources' interleaving (Interleaving.state)."""

    source: int
    reader: Any
    interleave: Optional[dict[str, Any]] = None


def shards_read(state: dict[str, Any]) -> int:
    """The shares a state's readers had read some of (their stream positions' share counts)."""
    return sum(len(position.get("share_records", ())) for source in state["sources"]
               for position in source["positions"].values())


def resumed_positions(source: dict[str, Any], loader: Any) -> tuple[dict[int, Any], int]:
    """A source's readers' positions as the dataset resumes them, and the rotation of its workers: the worker after
    the one whose batch was trained on last reads first, as in the uninterrupted epoch."""
    positions = {reader: (StreamPosition(**{**value, "blocks": tuple(value["blocks"]),
                                           "share_records": tuple(value["share_records"])})
                          if "fill" in value else CachePosition(**value))
                 for reader, value in source["positions"].items()}
    workers = getattr(loader, "num_workers", 0)
    rotation = (source["last"] + 1) % workers if workers and source["last"] is not None else 0
    return positions, rotation


class Interleaving:
    """The sources' batches in one sequence: 'round_robin' takes them in turn, otherwise each next batch comes from
    a source drawn with probability proportional to its weight; a source that runs out drops out. Each batch carries
    the interleaving's state after it (the random stream's, the sources left, the turn), from which `state` resumes."""

    def __init__(self, streams: list[Iterator[Batch]], sampling: str, weights: list[float],
                 rng: np.random.Generator, state: Optional[dict[str, Any]] = None):
        self.streams, self.sampling, self.weights, self.rng = streams, sampling, weights, rng
        self.active, self.turn = list(range(len(streams))), 0
        if state is not None:
            self.rng.bit_generator.state = state["rng"]
            self.active, self.turn = list(state["active"]), state["turn"]

    def batches(self) -> Iterator[Batch]:
        while self.active:
            index = self._next_source()
            batch = next(self.streams[index], None)
            if batch is None:
                self.active.remove(index)
                continue
            position = getattr(batch, "position", None)
            if isinstance(position, EpochPosition):
                position.interleave = {"rng": self.rng.bit_generator.state, "active": list(self.active),
                                             "turn": self.turn}
            yield batch

    def _next_source(self) -> int:
        if self.sampling == "round_robin":
            self.turn += 1
            return self.active[(self.turn - 1) % len(self.active)]
        chances = np.array([self.weights[i] for i in self.active], dtype=np.float64)
        chances = chances / chances.sum() if chances.sum() > 0 else np.full(len(self.active), 1 / len(self.active))
        return self.active[int(self.rng.choice(len(self.active), p=chances))]

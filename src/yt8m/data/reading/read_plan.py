"""How a dataset reads its shards: the options a caller sets (ReadOptions), and which records each reader (rank x
DataLoader worker) takes epoch by epoch, in which file order and shuffle stream (ReadPlan, a sampler for streams)."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Iterator, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import torch.distributed as dist
from torch.utils.data import get_worker_info

from yt8m.io import storage


@dataclass(frozen=True)
class ReadOptions:
    """How YT8MDataset reads: `shuffle` (the file order changes every epoch, records pass a bounded buffer of
    `shuffle_buffer` records, seeded by `seed` and the epoch), `skip_corrupt` (damaged files and records are skipped
    and counted instead of raised), `drop_remainder` (only full batches), this process's `rank` of `world_size`
    (default: the process group's, else 0 of 1), `cache_in_memory` (video level: this rank's records decoded once and
    served from RAM), `record_bytes` (the record bytes read are counted in read_stats)."""

    shuffle: bool = False
    seed: int = 0
    shuffle_buffer: int = 10000
    skip_corrupt: bool = False
    drop_remainder: bool = False
    rank: Optional[int] = None
    world_size: Optional[int] = None
    cache_in_memory: bool = False
    record_bytes: bool = False

    def __post_init__(self) -> None:
        if self.shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be positive, got {self.shuffle_buffer}")


class ReaderShare(NamedTuple):
    """A reader's share of one file: record i of `path` if i % stride == phase; `size`: the file's bytes where its
    listing gave them (opening it then asks the store nothing more)."""

    path: str
    stride: int
    phase: int
    size: Optional[int] = None


def reader_shares(paths: Sequence[str], reader: int, readers: int,
                  sizes: Optional[Mapping[str, Optional[int]]] = None) -> list[ReaderShare]:
    """The shares reader `reader` of `readers` reads (each with its file's size from `sizes`, where known).

    With at least as many files as readers, whole files are dealt out; otherwise the readers sharing a file
    take its records in turn. Either way every record of every file lands with exactly one reader.
    """
    known = sizes or {}
    if len(paths) >= readers:
        return [ReaderShare(path, 1, 0, known.get(path)) for path in paths[reader::readers]]
    file_index = reader % len(paths)
    sharers = len(range(file_index, readers, len(paths)))
    path = paths[file_index]
    return [ReaderShare(path, sharers, reader // len(paths), known.get(path))]


def _resolved_rank(rank: Optional[int], world_size: Optional[int]) -> tuple[int, int]:
    if rank is None or world_size is None:
        initialized = dist.is_available() and dist.is_initialized()
        rank = (dist.get_rank() if initialized else 0) if rank is None else rank
        world_size = (dist.get_world_size() if initialized else 1) if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size), got rank={rank}, world_size={world_size}")
    return rank, world_size


def _worker_slot() -> tuple[int, int]:
    """(this DataLoader worker, workers); (0, 1) outside a DataLoader's workers."""
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


class ReadPlan:
    """Which records each reader takes in the epoch set last (`set_epoch`): the readers are this process's rank times
    the DataLoader workers of the process calling, and each record is read by exactly one of them per epoch. With
    `shuffle` the file order and every reader's shuffle stream change with the epoch; without it the order is fixed.
    """

    def __init__(self, paths: Sequence[str] | Mapping[str, Optional[int]], options: ReadOptions):
        """`paths`, or the files with the sizes their listing gave (yt8m.data.format.tfrecord.list_shards)."""
        self.paths = list(paths)
        self.sizes: dict[str, Optional[int]] = dict(paths) if isinstance(paths, Mapping) else dict.fromkeys(paths)
        self.shuffle, self.seed = options.shuffle, options.seed
        self.rank, self.world_size = _resolved_rank(options.rank, options.world_size)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @functools.cached_property
    def shard_bytes(self) -> int:
        """The files' bytes, as their listing gave them (a file listed without its size, a local one, stat'ed once):
        the shuffle buffers' cap, the RAM cache's estimate, the ETA's share of the epoch and the sources' sampling
        weights read it."""
        return sum(size if size is not None else storage.size(path) for path, size in self.sizes.items())

    def reader(self, rotation: int = 0) -> tuple[int, int]:
        """(the reader calling, readers): this rank's DataLoader workers come one after another; `rotation` places on
        (a resumed epoch's worker 0 reads as the worker whose batch came next)."""
        worker, workers = _worker_slot()
        return self.rank * workers + (worker + rotation) % workers, self.world_size * workers

    def shares(self, reader: int, readers: int) -> list[ReaderShare]:
        """What `reader` reads this epoch, in this epoch's file order."""
        return reader_shares(self._file_order(), reader, readers, self.sizes)

    def rank_shares(self) -> list[ReaderShare]:
        """Every record of this rank, in file order, for one reader (a RAM cache's filling)."""
        return reader_shares(self.paths, self.rank, self.world_size, self.sizes)

    def shuffle_stream(self, reader: int, readers: int) -> Optional[np.random.Generator]:
        """The random stream of `reader`'s shuffle buffer this epoch; None where records keep their order."""
        return self._rng(reader, readers) if self.shuffle else None

    def cached_batches(self, videos: int, batch_size: int) -> Iterator[np.ndarray]:
        """The indices of each batch the calling DataLoader worker serves from a RAM cache of `videos` this epoch:
        the epoch's order (shuffled or not) cut into batches, dealt out over the workers."""
        order = self._rng().permutation(videos) if self.shuffle else np.arange(videos)
        worker, workers = _worker_slot()
        for start in itertools.islice(range(0, videos, batch_size), worker, None, workers):
            yield order[start:start + batch_size]

    def _rng(self, *stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch, *stream])

    def _file_order(self) -> list[str]:
        if not self.shuffle:
            return list(self.paths)
        return [self.paths[i] for i in self._rng().permutation(len(self.paths)).tolist()]

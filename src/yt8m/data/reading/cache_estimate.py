"""How much RAM a cache of a dataset's records would take, estimated before filling it: the first records of the first
shard are decoded into a small VideoCache, and its bytes a record scaled by the shards' bytes (one rank's share)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from yt8m.data.format.tfrecord import CorruptRecordError, is_compressed, read_records
from yt8m.data.reading.batch_build import finish_batch
from yt8m.data.reading.batch_memory import BatchMemory
from yt8m.data.reading.cache import VideoCache
from yt8m.data.reading.memory_budget import human_bytes
from yt8m.data.reading.read_plan import ReadOptions, reader_shares
from yt8m.data.reading.read_stats import ReadCounter
from yt8m.data.reading.shard_reader import ShardReader
from yt8m.data.reading.spec import FeatureSpec
from yt8m.io import storage

# Records decoded for the sample: enough to average the frame counts of frame-level videos, a fraction of a second;
# from the first SAMPLE_SHARDS shards at most, in order (an empty first shard is passed over): a release of thousands
# of small shards on object storage is sized by a few requests, not by 64 of them.
SAMPLE_RECORDS = 256
SAMPLE_SHARDS = 4


@dataclass(frozen=True)
class CacheEstimate:
    """A RAM cache's size as estimated: its records (of this rank) and the bytes they would hold."""

    records: int
    nbytes: int

    def __str__(self) -> str:
        return f"{human_bytes(self.nbytes)} for about {self.records:,} videos"

    def __add__(self, other: "CacheEstimate") -> "CacheEstimate":
        return CacheEstimate(self.records + other.records, self.nbytes + other.nbytes)


def _file_bytes_per_record(path: str, sample_records: int, sample_bytes: int) -> float:
    """A record's share of its file's bytes: the sample's record bytes a record where the shards are plain; a GZIP
    shard's records are counted (the whole first file) against its compressed size."""
    if not is_compressed(path):
        return sample_bytes / sample_records
    return storage.size(path) / max(1, sum(1 for _ in read_records(path)))


def fill_batch_bytes(spec: FeatureSpec, batch_size: int, records: Optional[int] = None) -> int:
    """The buffers of one batch the cache is filled from (features as decoded, padded frames at most, and dense
    float32 labels; of `records` videos at most): freed after the fill but kept by the allocator, so measured as
    part of the cache's growth (bench/README.md: about 20 of 180-200 MB on the real 2018 shards)."""
    load_batch = min(cache_load_batch(spec, batch_size), records if records is not None else batch_size * 1024)
    return batch_bytes(spec, load_batch)


def batch_bytes(spec: FeatureSpec, videos: int) -> int:
    """A batch of `videos` as read: features (frames as uint8, padded to --max_frames; video level float32) and dense
    float32 labels."""
    features = spec.max_frames * spec.feature_size if spec.frame_features else spec.feature_size * 4
    return videos * (features + spec.num_classes * 4)


def cache_load_batch(spec: FeatureSpec, batch_size: int) -> int:
    """The batch size a cache is filled with: frame level the run's (a few MB each, where 1024 videos would take 350
    MB at once), video level at least 1024 (fewer, larger reads)."""
    return batch_size if spec.frame_features else max(batch_size, 1024)


def estimate_cache(paths: Sequence[str], spec: FeatureSpec, skip_corrupt: bool = False, world_size: int = 1,
                   batch_size: int = 1024, shard_bytes: Optional[int] = None,
                   sizes: Optional[Mapping[str, Optional[int]]] = None) -> CacheEstimate:
    """The estimate for the records of `paths` one of `world_size` ranks caches (filled in batches of `batch_size`
    as YT8MDataset.load_cache does): the sample's cache bytes and record bytes a record, the files' bytes
    (uncompressed shards: a record's bytes are the file's; `shard_bytes` where the caller has them) over the record
    bytes, and one fill batch's buffers. `sizes`: the files' sizes from their listing, where known."""
    if not paths:
        return CacheEstimate(0, 0)
    counter = ReadCounter()
    reader = ShardReader(spec, SAMPLE_RECORDS, ReadOptions(skip_corrupt=skip_corrupt, rank=0, world_size=1,
                                                            record_bytes=True), counter, BatchMemory())
    sample = next(reader.batches(reader_shares(list(paths)[:SAMPLE_SHARDS], 0, 1, sizes), None), None)
    record_bytes = counter.take_unsent().record_bytes
    if sample is None or not record_bytes:
        return CacheEstimate(0, 0)
    cache = VideoCache.from_batches([finish_batch(sample, spec.num_classes)], spec)
    if shard_bytes is None:
        shard_bytes = sum(storage.size(path) for path in paths)
    records = shard_bytes / _file_bytes_per_record(paths[0], len(sample), record_bytes)
    records /= max(1, world_size)
    return CacheEstimate(round(records), round(records * cache.nbytes / len(sample))
                         + fill_batch_bytes(spec, batch_size, round(records)))


def mean_record_bytes(paths: Sequence[str], sample_records: int = SAMPLE_RECORDS,
                      sizes: Optional[Mapping[str, Optional[int]]] = None) -> float:
    """The mean size of the first shards' first records (SAMPLE_SHARDS at most) as a shuffle buffer holds them
    (serialized, uncompressed); 0 where those files hold none. A damaged record ends the sample: reporting it is the
    run's reading's job. `sizes`: the files' sizes from their listing, where known."""
    lengths: list[int] = []
    try:
        for path in paths[:SAMPLE_SHARDS]:
            for _, record in read_records(path, size=(sizes or {}).get(path)):
                lengths.append(len(record))
                if len(lengths) == sample_records:
                    return sum(lengths) / len(lengths)
    except CorruptRecordError:
        pass
    return sum(lengths) / len(lengths) if lengths else 0.0

"""PyTorch datasets over YouTube-8M TFRecord shards: streamed, split over ranks and workers, shuffled, batched.

Video-level Examples become [B, D] batches, frame-level SequenceExamples padded [B, T, D] batches, and each rated
2019 segment a [segment_size, D] example; video-level sets that fit in RAM can be decoded once and served from memory.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import logging
import pickle
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterable, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from yt8m.data.batch import Batch
from yt8m.data.batch_decode import PackedRecords
from yt8m.data.batch_memory import RecycledBuffers, SharedSlots, SlotRef, copy_out, fresh_shared
from yt8m.data.spec import FeatureSpec
from yt8m.data.decode import (CLASSES_2017, CLASSES_2018, LabelIds, RecordError, SegmentRatings, decode_frame_batch,
                              decode_segment_video, decode_video_batch, record_id_key)
from yt8m.data.tfrecord import CorruptRecordError, RecordChunk, expand_pattern, read_record_chunks, read_records

# A shuffle buffer of 10k frame-level records would hold gigabytes per reader; payload bytes cap it too.
SHUFFLE_BUFFER_MAX_BYTES = 512 << 20
# Framing bytes around each payload: length, length CRC, payload CRC.
RECORD_OVERHEAD_BYTES = 16
# Frames a frame-level batch's rows hold at first, where max_frames asks for more (segment prediction reads every
# frame): YT8M's videos have fewer, and a slot of 64 such rows takes 75 MB.
ROW_FRAMES = 1024
_RANDOM_BLOCK = 4096
logger = logging.getLogger(__name__)
Record = tuple  # (path, (byte offset, payload)): built by zip, with no Python frame per record


@dataclass
class ReadStats:
    """What reading met besides good records: `skipped_files` counts the shards cut short under skip_corrupt
    (a CRC mismatch or truncation skips the rest of the file), `skipped_records` the records skipped under
    skip_corrupt because they failed to decode (a missing, wrong-size or non-finite feature, a label out of range,
    bad wire data), and `id_key_files` maps each id key seen ("id": 2018 and later, "video_id": 2017) to a file
    using it, decided per file from its first record."""

    skipped_files: int = 0
    skipped_records: int = 0
    id_key_files: dict[str, str] = field(default_factory=dict)
    record_bytes: int = 0  # the TFRecord bytes of the records read (framing included), where the dataset counts them

    def add(self, other: "ReadStats") -> None:
        self.skipped_files += other.skipped_files
        self.skipped_records += other.skipped_records
        self.record_bytes += other.record_bytes
        for key, path in other.id_key_files.items():
            self.id_key_files.setdefault(key, path)

    def __bool__(self) -> bool:
        return bool(self.skipped_files or self.skipped_records or self.id_key_files or self.record_bytes)


@dataclass
class _Delivery:
    """What a DataLoader worker sends: a batch, and what it met since the last one (its read counts, or the data
    error that ended its reading); BatchLoader takes the counts and the error out in the main process."""

    batch: Optional[Batch] = None
    read_stats: Optional[ReadStats] = None
    error: Optional[BaseException] = None
    num_classes: int = 0  # what the batch's label ids expand to

    def pin_memory(self) -> "_Delivery":
        """Called by the DataLoader's pinning thread (pin_memory=True), off the training loop's thread: the batch
        made whole (finish_batch) in pinned memory, its features copied out of their shared slot (freeing it)."""
        if self.batch is None:
            return self
        batch = finish_batch(self.batch, self.num_classes, pin_memory=True)
        return _Delivery(batch.pin_memory(), self.read_stats, self.error, self.num_classes)


def _default_rank(rank: Optional[int], world_size: Optional[int]) -> tuple[int, int]:
    if rank is None or world_size is None:
        initialized = dist.is_available() and dist.is_initialized()
        rank = (dist.get_rank() if initialized else 0) if rank is None else rank
        world_size = (dist.get_world_size() if initialized else 1) if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size), got rank={rank}, world_size={world_size}")
    return rank, world_size


def _worker_slot() -> tuple[int, int]:
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


def reader_shares(paths: list[str], reader: int, readers: int) -> list[tuple[str, int, int]]:
    """The (path, stride, phase) triples reader `reader` of `readers` reads: record i of `path` if i % stride == phase.

    With at least as many files as readers, whole files are dealt out; otherwise the readers sharing a file
    take its records in turn. Either way every record of every file lands with exactly one reader.
    """
    if len(paths) >= readers:
        return [(path, 1, 0) for path in paths[reader::readers]]
    file_index = reader % len(paths)
    sharers = len(range(file_index, readers, len(paths)))
    return [(paths[file_index], sharers, reader // len(paths))]


def _shuffled(records: Iterator[Record], capacity: int, rng: np.random.Generator) -> Iterator[Record]:
    """A bounded shuffle buffer (TensorFlow's `shuffle`): each record leaves for a random one held back."""
    buffer: list[Record] = []
    held_bytes = 0
    for record in records:
        buffer.append(record)
        held_bytes += len(record[1][1])
        if len(buffer) >= capacity or held_bytes >= SHUFFLE_BUFFER_MAX_BYTES:
            break
    size = len(buffer)
    for block in iter(lambda: list(itertools.islice(records, _RANDOM_BLOCK)), []):
        for record, slot in zip(block, rng.integers(0, size, len(block)).tolist()):
            yield buffer[slot]
            buffer[slot] = record
    for slot in rng.permutation(size).tolist():
        yield buffer[slot]


# The batch entries sent as LabelIds and expanded by finish_batch; "label_weights" (segments): the rated classes.
LABEL_ID_KEYS = ("labels", "label_weights")


def finish_batch(batch: Batch, num_classes: int, pin_memory: bool = False) -> Batch:
    """Make a batch from the loader whole: features still in a worker's shared slot copied out (and the slot freed),
    LabelIds expanded into the bool [B, num_classes] multi-hot `labels` tensor, and `label_weights` where the batch
    has them (no-op when done); pinned where asked.

    bool: a quarter of float32's bytes to build and copy to a GPU (float32 labels at 3862 classes would take
    3.4x the features' bytes); the losses cast them. Workers send the ids, a few KB, instead of the tensor:
    fresh shared memory costs a page fault per 4 KB, which made workers slower than reading in-process.
    """
    if isinstance(batch.features, SlotRef):
        batch.features = copy_out(batch.features, pin_memory)
    for key in LABEL_ID_KEYS:
        if isinstance(label_ids := getattr(batch, key), LabelIds):
            shape = (len(label_ids.offsets) - 1, num_classes)
            # made where it stays: pinned memory is filled in place, not copied into
            expanded = torch.zeros(shape, dtype=torch.bool, pin_memory=True) if pin_memory else \
                torch.from_numpy(np.zeros(shape, bool))
            label_ids.multi_hot(num_classes, out=expanded.numpy())
            setattr(batch, key, expanded)
    return batch


def _record_pieces(records: Iterator[Record]) -> Iterator[tuple[PackedRecords, list]]:
    """Each record as a piece of its own, decoded where its payload lies (frame-level records are large: a call per
    record costs little next to copying them together first)."""
    for path, (offset, payload) in records:
        yield PackedRecords(np.frombuffer(payload, np.uint8), [len(payload)]), [(path, offset)]


def _packed_chunks(records: Iterator[Record], room: Callable[[], int]) -> Iterator[tuple[PackedRecords, list]]:
    """Pieces of batches of records (shuffled ones), `room()` records each, each payload copied once into one array.

    The array is reused: each batch is valid only until the next is asked for (the caller decodes it first).
    Reuse and sizing matter: growing a bytearray record by record copied it over and over, and a fresh
    array per batch cost a page fault per 4 KB.
    """
    data = np.empty(1 << 20, np.uint8)
    view = memoryview(data)
    while True:
        ends, sources, end = [], [], 0
        for path, (offset, payload) in itertools.islice(records, room()):
            start, end = end, end + len(payload)
            if end > len(data):
                data = np.concatenate([data[:start], np.empty(max(end, 2 * len(data)) - start, np.uint8)])
                view = memoryview(data)
            view[start:end] = payload
            ends.append(end)
            sources.append((path, offset))
        if not ends:
            return
        yield PackedRecords(data[:end], ends), sources


NewTensor = Callable[..., tuple[Optional[SlotRef], torch.Tensor]]  # (shape, dtype[, in_slot]): YT8MDataset._new_tensor


class _BatchBuilder:
    """A batch decoded piece by piece straight into its rows of one tensor (`new_tensor` gives it: a worker's shared
    slot, or memory of its own). In file order a piece is the records of one chunk of a reader's buffer, decoded where
    they lie, never copied: the whole batch at once (but where it spans files or read buffers). Labels stay LabelIds
    (see finish_batch). With `skip`, a record that fails to decode goes to it (its error naming file and offset) and
    leaves room for the next one."""

    def __init__(self, batch_size: int, spec: FeatureSpec, skip: Optional[Callable[[RecordError], None]],
                 slot: Optional[SlotRef], features: torch.Tensor):
        self.spec, self.skip = spec, skip
        self.slot, self.features = slot, features
        self.batch_size = batch_size
        self.count = self.record_bytes = 0
        self.video_ids: list[str] = []
        self.labels: list[LabelIds] = []

    @property
    def room(self) -> int:
        return self.batch_size - self.count

    def add(self, packed: PackedRecords, source: Callable[[int], tuple[str, int]]) -> None:
        """Decode `packed` into the next rows; `source(i)` names record i's file and byte offset for errors."""
        rows = slice(self.count, self.count + len(packed))
        on_error = None if self.skip is None else lambda err: self.skip(err.at(*source(err.batch_index)))
        try:
            video_ids, labels = self.decode(packed, rows, on_error)
        except RecordError as err:
            raise err.at(*source(err.batch_index)) from err
        self.count += len(video_ids)
        self.record_bytes += int((packed.ends - packed.starts).sum()) + RECORD_OVERHEAD_BYTES * len(packed)
        self.video_ids += video_ids
        self.labels.append(labels)

    def decode(self, packed: PackedRecords, rows: slice, on_error: Optional[Callable[[RecordError], None]]
               ) -> tuple[list[str], LabelIds]:
        raise NotImplementedError

    def _sent(self, features: torch.Tensor) -> Any:
        """What the batch carries as features: the slot they lie in (copied out by finish_batch), or the tensor."""
        if self.slot is None:
            return features
        return self.slot._replace(shape=tuple(features.shape))


class _VideoBatchBuilder(_BatchBuilder):
    """A video-level batch: float32 [B, D], every row written whole by the decoder (no zeroing first)."""

    def __init__(self, batch_size: int, spec: FeatureSpec, skip: Optional[Callable[[RecordError], None]],
                 new_tensor: NewTensor, free_slot: Callable[[SlotRef], None]):
        super().__init__(batch_size, spec, skip, *new_tensor((batch_size, spec.feature_size), torch.float32))

    def decode(self, packed: PackedRecords, rows: slice, on_error: Optional[Callable[[RecordError], None]]
               ) -> tuple[list[str], LabelIds]:
        spec = self.spec
        decoded = decode_video_batch(packed, spec.feature_names, spec.feature_sizes, spec.num_classes,
                                     out=self.features.numpy()[rows], on_error=on_error)
        return decoded.video_ids, decoded.labels

    def finish(self) -> tuple[Batch, int]:
        features = self.features[:self.count]
        return Batch(self.video_ids, self._sent(features), LabelIds.concat(self.labels)), self.record_bytes


class _FrameBatchBuilder(_BatchBuilder):
    """A frame-level batch: uint8 [B, T, D] frames as stored (dequantized by the model, on its device), zero-padded
    after each video's num_frames, T the batch's longest video (at least 1). Rows are decoded max_frames apart (at
    most ROW_FRAMES: more only for a piece whose records may hold more frames), then moved together where the
    batch's videos are all shorter."""

    def __init__(self, batch_size: int, spec: FeatureSpec, skip: Optional[Callable[[RecordError], None]],
                 new_tensor: NewTensor, free_slot: Callable[[SlotRef], None]):
        shape = (batch_size, min(spec.max_frames, ROW_FRAMES), spec.feature_size)
        super().__init__(batch_size, spec, skip, *new_tensor(shape, torch.uint8))
        self.new_tensor, self.free_slot = new_tensor, free_slot
        self.num_frames = np.zeros(batch_size, np.int64)

    def decode(self, packed: PackedRecords, rows: slice, on_error: Optional[Callable[[RecordError], None]]
               ) -> tuple[list[str], LabelIds]:
        spec = self.spec
        # A frame holds at least its D bytes of values: a record of n bytes holds at most n // D frames.
        most_frames = int(((packed.ends - packed.starts) // spec.feature_size).max(initial=0))
        if min(most_frames, spec.max_frames) > self.features.shape[1]:
            self._grow(min(most_frames, spec.max_frames))
        decoded = decode_frame_batch(packed, spec.feature_names, spec.feature_sizes, spec.num_classes,
                                     min(spec.max_frames, self.features.shape[1]), self.features.numpy()[rows],
                                     self.num_frames[rows], on_error)
        return decoded.video_ids, decoded.labels

    def _grow(self, frames: int) -> None:
        """Rows of `frames` frames, the rows decoded so far copied over; in memory of the batch's own (a worker's
        slot, freed, holds ROW_FRAMES)."""
        old, old_slot = self.features, self.slot
        _, self.features = self.new_tensor((self.batch_size, frames, self.spec.feature_size), torch.uint8, False)
        self.slot = None
        kept = old.shape[1]
        self.features[:self.count, :kept] = old[:self.count]
        self.features[:self.count, kept:] = 0
        if old_slot is not None:
            self.free_slot(old_slot)

    def finish(self) -> tuple[Batch, int]:
        num_frames = self.num_frames[:self.count]
        frames = _rows_together(self.features, self.count, max(1, int(num_frames.max(initial=0))))
        batch = Batch(self.video_ids, self._sent(frames), LabelIds.concat(self.labels),
                      num_frames=torch.from_numpy(num_frames.copy()))
        return batch, self.record_bytes


def _rows_together(frames: torch.Tensor, count: int, kept: int) -> torch.Tensor:
    """The first `count` rows of uint8 [B, F, D] with their first `kept` frames, as one contiguous [count, kept, D]
    tensor at the start of the same memory (rows moved where kept < F; each row is zero after its frames)."""
    _, capacity, width = frames.shape
    if kept == capacity:
        return frames[:count]
    flat = frames.view(-1).numpy()
    row_bytes, kept_bytes = capacity * width, kept * width
    for row in range(1, count):  # forward: a row never lands on one not yet moved (numpy copies overlaps safely)
        flat[row * kept_bytes:(row + 1) * kept_bytes] = flat[row * row_bytes:row * row_bytes + kept_bytes]
    return frames.view(-1)[:count * kept_bytes].view(count, kept, width)


def _next_chunk(chunks: Generator[RecordChunk, Optional[int], None], limit: Optional[int]) -> Optional[RecordChunk]:
    """The next chunk of up to `limit` records (the first: as many as the generator was made for), or None."""
    try:
        return next(chunks) if inspect.getgeneratorstate(chunks) == inspect.GEN_CREATED else chunks.send(limit)
    except StopIteration:
        return None


DecodedSegment = tuple  # (segment id, present class ids, rated class ids, uint8 frames [S, D], record bytes)


def _segment_examples(video_id: str, frames: np.ndarray, ratings: SegmentRatings, segment_size: int,
                      record_bytes: int) -> list[DecodedSegment]:
    """One example per distinct rated start (all classes rated there), as the starter kit groups them; the
    record's bytes are counted with its first segment."""
    examples = []
    for index, start in enumerate(np.unique(ratings.start_times).tolist()):
        rated = ratings.start_times == start
        examples.append((f"{video_id}:{start}", ratings.labels[rated & (ratings.scores > 0)].tolist(),
                         ratings.labels[rated].tolist(), frames[start:start + segment_size],
                         record_bytes if index == 0 else 0))
    return examples


def _segment_batch(segments: list[DecodedSegment], spec: FeatureSpec) -> Batch:
    """One segment batch: [B, segment_size, D] uint8 frames as stored, labels (rated present) and label_weights
    (rated either way) as LabelIds."""
    features = torch.from_numpy(np.stack([segment[3] for segment in segments]))
    return Batch([segment[0] for segment in segments], features, LabelIds.from_lists([segment[1] for segment in segments]),
                 num_frames=torch.full((len(segments),), spec.segment_size, dtype=torch.int64),
                 label_weights=LabelIds.from_lists([segment[2] for segment in segments]))


class YT8MDataset(IterableDataset):
    """Whole batches (yt8m.data.batch.Batch) from YT8M shards, one epoch per `iter()`.

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

    def __init__(self, pattern: str, spec: FeatureSpec, batch_size: int, *, shuffle: bool = False,
                 seed: int = 0, shuffle_buffer: int = 10000, skip_corrupt: bool = False,
                 drop_remainder: bool = False, rank: Optional[int] = None, world_size: Optional[int] = None,
                 cache_in_memory: bool = False, record_bytes: bool = False):
        if batch_size < 1 or shuffle_buffer < 1:
            raise ValueError(f"batch_size and shuffle_buffer must be positive, got {batch_size}, {shuffle_buffer}")
        if cache_in_memory and spec.segment_labels:
            raise ValueError("cache_in_memory holds videos; rated segments are streamed")
        self.spec = spec.checked()
        self.paths = expand_pattern(pattern)
        self.pattern = pattern
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.skip_corrupt = skip_corrupt
        self.drop_remainder = drop_remainder
        self.rank, self.world_size = _default_rank(rank, world_size)
        self.cache_in_memory = cache_in_memory
        self.record_bytes = record_bytes
        self.epoch = 0
        self.read_stats = ReadStats()
        self._unsent = ReadStats()  # read since the last batch: absorbed into read_stats, or sent by a worker
        self.cache: Optional[VideoCache] = None
        self.batch_loader_worker = False  # set in make_loader's workers: they send _Delivery items to BatchLoader
        self.slots: Optional[SharedSlots] = None  # make_loader's workers decode into these (set while they run)
        self.pin_memory = False  # in-process batches in pinned memory (a CUDA run's make_loader sets it)
        self._recycled = RecycledBuffers()  # in-process batches' memory otherwise

    @property
    def skipped_files(self) -> int:
        return self.read_stats.skipped_files

    @property
    def skipped_records(self) -> int:
        return self.read_stats.skipped_records

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Batch]:
        if self.batch_loader_worker:
            return self._deliveries()
        return self._batches_in_process()

    def _batches_in_process(self) -> Iterator[Batch]:
        """In this process (or a worker of a DataLoader of one's own): batches with their labels expanded."""
        for batch in self._batches():
            self.absorb(self._take_unsent())
            yield finish_batch(batch, self.spec.num_classes, self.pin_memory)
        self.absorb(self._take_unsent())

    def _deliveries(self) -> Iterator[_Delivery]:
        """In a worker of make_loader's BatchLoader: each batch (labels as LabelIds) with what was read since the last,
        then what was read after it; a data error is sent as data."""
        try:
            for batch in self._batches():
                yield _Delivery(batch, self._take_unsent() or None, num_classes=self.spec.num_classes)
            if self._unsent:
                yield _Delivery(read_stats=self._take_unsent())
        except (ValueError, OSError) as err:
            if not _sendable(err):
                raise
            # Sent as data: torch would re-create it with the worker's traceback in its message.
            yield _Delivery(error=err)

    def _batches(self) -> Iterator[Batch]:
        if self.cache_in_memory and self.cache is None:
            self.load_cache()
        worker, workers = _worker_slot()
        if self.cache_in_memory:
            return self._cached_batches(worker, workers)
        return self._streamed_batches(worker, workers)

    def _take_unsent(self) -> ReadStats:
        stats, self._unsent = self._unsent, ReadStats()
        return stats

    def absorb(self, stats: ReadStats) -> None:
        """Add what a reader met to `read_stats`, warning the first time two id keys have been seen."""
        mixed_before = len(self.read_stats.id_key_files) > 1
        self.read_stats.add(stats)
        files = self.read_stats.id_key_files
        if not mixed_before and len(files) > 1:
            logger.warning("these shards mix YouTube-8M releases: id key 'id' (2018 and later, %d classes; e.g. %s) "
                           "and 'video_id' (2017, %d classes; e.g. %s); their label ids mean different classes",
                           CLASSES_2018, files.get("id"), CLASSES_2017, files.get("video_id"))

    def _epoch_rng(self, *stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch, *stream])

    def _epoch_paths(self) -> list[str]:
        if not self.shuffle:
            return list(self.paths)
        return [self.paths[i] for i in self._epoch_rng().permutation(len(self.paths)).tolist()]

    def _count_corrupt(self, err: CorruptRecordError) -> None:
        self._unsent.skipped_files += 1

    def _skip_record(self, err: RecordError) -> None:
        logger.warning("%s; skipping this record", err)
        self._unsent.skipped_records += 1

    def _note_id_key(self, path: str, payload: bytes) -> None:
        key = record_id_key(payload, self.spec.frame_features)
        if key is not None:
            self._unsent.id_key_files.setdefault(key, path)

    def _new_builder(self) -> _BatchBuilder:
        builder = _FrameBatchBuilder if self.spec.frame_features else _VideoBatchBuilder
        return builder(self.batch_size, self.spec, self._skip_record if self.skip_corrupt else None, self._new_tensor,
                       self._free_slot)

    def _free_slot(self, ref: SlotRef) -> None:
        self.slots.give_back(ref)

    def _new_tensor(self, shape: tuple[int, ...], dtype: torch.dtype,
                    in_slot: bool = True) -> tuple[Optional[SlotRef], torch.Tensor]:
        """A batch's tensor (contents undefined): in a make_loader worker its next shared slot (`in_slot`), in another
        DataLoader's worker fresh shared memory, in-process memory of its own (pinned for a CUDA run)."""
        info = get_worker_info()
        if info is None and self.pin_memory:
            return None, torch.empty(shape, dtype=dtype, pin_memory=True)
        if info is None:
            return None, self._recycled.tensor(shape, dtype)
        if self.slots is not None and in_slot:
            return self.slots.take(info.id, shape, dtype)
        return None, fresh_shared(shape, dtype)

    def _records(self, shares: Iterable[tuple[str, int, int]]) -> Iterator[Record]:
        """The shares' records, each paired with its file's path; iterated at C speed (chain, zip, islice)."""
        per_file = (zip(itertools.repeat(path), itertools.islice(self._read(path), phase, None, stride))
                    for path, stride, phase in shares)
        return itertools.chain.from_iterable(per_file)

    def _read(self, path: str) -> Iterator[tuple[int, bytes]]:
        """The file's records; opened (and its id key noted) when called, as _records reaches the file."""
        records = read_records(path, skip_corrupt=self.skip_corrupt, on_corrupt=self._count_corrupt)
        first = next(records, None)
        if first is None:
            return iter(())
        self._note_id_key(path, first[1])
        return itertools.chain((first,), records)

    def _in_order_batches(self, shares: list[tuple[str, int, int]]) -> Iterator[tuple[Batch, int]]:
        """Batches in file order, each decoded chunk by chunk of the readers' buffers."""
        batch = self._new_builder()
        for path, stride, phase in shares:
            limit = batch.room * stride
            chunks = read_record_chunks(path, limit, self.skip_corrupt, self._count_corrupt)
            first = 0  # the file index of the chunk's first record
            while (chunk := _next_chunk(chunks, limit)) is not None:
                if not first:
                    self._note_id_key(path, chunk.data[chunk.starts[0]:chunk.ends[0]].tobytes())
                taken = slice((phase - first) % stride, None, stride)
                first += len(chunk.starts)
                offsets = chunk.offsets[taken]
                batch.add(PackedRecords(chunk.data, chunk.ends[taken], chunk.starts[taken]),
                          lambda index: (path, int(offsets[index])))
                if not batch.room:
                    yield batch.finish()
                    batch = self._new_builder()
                limit = batch.room * stride
        if batch.count:
            yield batch.finish()

    def _shuffled_batches(self, records: Iterator[Record]) -> Iterator[tuple[Batch, int]]:
        batch = self._new_builder()
        pieces = _record_pieces(records) if self.spec.frame_features else _packed_chunks(records, lambda: batch.room)
        for packed, sources in pieces:
            batch.add(packed, sources.__getitem__)
            if not batch.room:
                yield batch.finish()
                batch = self._new_builder()
        if batch.count:
            yield batch.finish()

    def _streamed_batches(self, worker: int, workers: int) -> Iterator[Batch]:
        reader, readers = self.rank * workers + worker, self.world_size * workers
        shares = reader_shares(self._epoch_paths(), reader, readers)
        if not self.shuffle and not self.spec.segment_labels:
            batches = self._in_order_batches(shares)
        else:
            records = self._records(shares)
            if self.shuffle:
                records = _shuffled(records, self.shuffle_buffer, self._epoch_rng(reader, readers))
            if self.spec.segment_labels:
                batches = self._segment_batches(records)
            else:
                batches = self._shuffled_batches(records)
        for batch, record_bytes in batches:
            if len(batch) < self.batch_size and self.drop_remainder:
                return
            if self.record_bytes:
                self._unsent.record_bytes += record_bytes
            yield batch

    def _segment_batches(self, records: Iterator[Record]) -> Iterator[tuple[Batch, int]]:
        segments = itertools.chain.from_iterable(map(self._decode_segments, records))
        for chunk in iter(lambda: list(itertools.islice(segments, self.batch_size)), []):
            yield _segment_batch(chunk, self.spec), sum(segment[4] for segment in chunk)

    def _decode_segments(self, record: Record) -> list[DecodedSegment]:
        """The rated segments of one record (every frame read, none cut at max_frames); none where skip_corrupt
        skips it."""
        spec = self.spec
        decoded = self._decode_or_skip(record, lambda payload: decode_segment_video(
            payload, spec.feature_names, spec.feature_sizes, spec.num_classes, spec.segment_size))
        if decoded is None:
            return []
        return _segment_examples(*decoded, spec.segment_size, len(record[1][1]) + RECORD_OVERHEAD_BYTES)

    def _decode_or_skip(self, record: Record, decode: Callable[[bytes], tuple]) -> Optional[tuple]:
        """`decode(payload)`; a RecordError names the file and offset, and under skip_corrupt skips the record."""
        path, (offset, payload) = record
        try:
            return decode(payload)
        except RecordError as err:
            if not self.skip_corrupt:
                raise err.at(path, offset) from err
            self._skip_record(err.at(path, offset))
            return None

    def check_first_record(self) -> None:
        """Decode the first record of the first file with the spec, so that a mismatch (a wrong feature size, a
        missing feature, another label space) fails before a run starts, with the error reading would give."""
        probe = copy.copy(self)
        probe.paths, probe.batch_size, probe.shuffle, probe.cache_in_memory = self.paths[:1], 1, False, False
        probe.rank, probe.world_size, probe.read_stats, probe._unsent = 0, 1, ReadStats(), ReadStats()
        next(probe._streamed_batches(0, 1), None)

    def load_cache(self, num_workers: int = 0) -> None:
        """Decode this rank's records into RAM (with `num_workers` reader processes); later epochs reuse them."""
        # frame level: batches of the run's size, a few MB each where 1024 videos would take 350 MB at once
        load_batch = self.batch_size if self.spec.frame_features else max(self.batch_size, 1024)
        streamed = YT8MDataset(self.pattern, self.spec, load_batch, skip_corrupt=self.skip_corrupt, rank=self.rank,
                               world_size=self.world_size)
        if num_workers == 0:  # all of this rank's records, even when called inside a DataLoader worker
            batches = (finish_batch(batch, self.spec.num_classes) for batch in streamed._streamed_batches(0, 1))
            self.cache = VideoCache.from_batches(batches, self.spec)
            self._unsent.add(streamed._unsent)  # counted where this dataset's own reading is
        else:  # in the main process (make_loader), where `streamed` absorbed its workers' counts and warned
            self.cache = VideoCache.from_batches(make_loader(streamed, num_workers), self.spec)
            self.read_stats.add(streamed.read_stats)

    def _cached_batches(self, worker: int, workers: int) -> Iterator[Batch]:
        cache = self.cache
        order = self._epoch_rng().permutation(len(cache)) if self.shuffle else np.arange(len(cache))
        starts = range(0, len(order), self.batch_size)
        for start in itertools.islice(starts, worker, None, workers):
            indices = order[start:start + self.batch_size]
            if len(indices) < self.batch_size and self.drop_remainder:
                return
            yield cache.batch(indices)


class _VideoRows:
    """Video-level features in one float32 array [N, D] (joined once every batch is in)."""

    def __init__(self, feature_size: int):
        self.parts: list[np.ndarray] = []
        self.features = np.zeros((0, feature_size), np.float32)

    def add(self, batch: Batch) -> None:
        self.parts.append(batch.features.numpy())

    def done(self) -> None:
        if self.parts:
            self.features, self.parts = np.concatenate(self.parts), []

    def take(self, indices: np.ndarray) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        return torch.from_numpy(self.features[indices]), None


class _FrameRows:
    """Frame-level videos as stored, uint8 (a quarter of float32's bytes): each batch's real frames back to back in
    one [frames, D] array (no padding), and per video its array, first frame and frame count."""

    def __init__(self, feature_size: int):
        self.feature_size = feature_size
        self.chunks: list[np.ndarray] = []
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (chunk, first frame, frames) per video
        self.chunk_of = self.first_frame = self.num_frames = np.zeros(0, np.int64)

    def add(self, batch: Batch) -> None:
        counts = batch.num_frames.numpy()
        real = np.arange(batch.features.shape[1]) < counts[:, None]
        self.parts.append((np.full(len(counts), len(self.chunks)), np.cumsum(counts) - counts, counts))
        self.chunks.append(batch.features.numpy()[real])  # the real frames, video after video: padding let go

    def done(self) -> None:
        if self.parts:
            self.chunk_of, self.first_frame, self.num_frames = (np.concatenate(part).astype(np.int64)
                                                                for part in zip(*self.parts))
            self.parts = []

    def take(self, indices: np.ndarray) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        counts = self.num_frames[indices]
        frames = np.zeros((len(indices), max(1, int(counts.max(initial=0))), self.feature_size), np.uint8)
        for row, (chunk, first, count) in enumerate(zip(self.chunk_of[indices].tolist(),
                                                        self.first_frame[indices].tolist(), counts.tolist())):
            frames[row, :count] = self.chunks[chunk][first:first + count]
        return torch.from_numpy(frames), torch.from_numpy(counts)


class VideoCache:
    """Decoded records held in RAM: features (float32 rows, or uint8 frames as stored), labels as CSR, ids as a numpy
    array."""

    def __init__(self, video_ids: np.ndarray, features: _VideoRows | _FrameRows, label_values: np.ndarray,
                 label_offsets: np.ndarray):
        self.video_ids = video_ids
        self.features = features
        self.label_values = label_values
        self.label_offsets = label_offsets

    @classmethod
    def from_batches(cls, batches: Iterable[Batch], spec: FeatureSpec) -> "VideoCache":
        """The batches' videos; each frame-level batch is packed as it comes, its padded tensor let go."""
        features = (_FrameRows if spec.frame_features else _VideoRows)(spec.feature_size)
        ids, values, counts = [], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for batch in batches:
            ids.extend(batch.video_ids)
            rows, classes = np.nonzero(batch.labels.numpy())
            values.append(classes)
            counts.append(np.bincount(rows, minlength=len(batch)))
            features.add(batch)
        features.done()
        offsets = np.concatenate([[0], np.cumsum(np.concatenate(counts))]).astype(np.int64)
        return cls(np.array(ids, str), features, np.concatenate(values).astype(np.int64), offsets)

    def __len__(self) -> int:
        return len(self.video_ids)

    def batch(self, indices: np.ndarray) -> Batch:
        starts, counts = self.label_offsets[indices], np.diff(self.label_offsets)[indices]
        offsets = np.concatenate([[0], np.cumsum(counts)])
        # Each row's label slice, gathered at once: position j of row r is starts[r] + j.
        positions = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1])
        features, num_frames = self.features.take(indices)
        return Batch(self.video_ids[indices].tolist(), features, LabelIds(self.label_values[positions], offsets),
                     num_frames=num_frames)


class BatchLoader(DataLoader):
    """A DataLoader over a YT8MDataset whose workers send LabelIds, expanded into multi-hot tensors here in the main
    process, with their read counts, added to the dataset's `read_stats`. A data error in a worker (RecordError,
    CorruptRecordError, another ValueError or OSError) is raised here as it was there: same type, same message."""

    def __iter__(self) -> Iterator[Batch]:
        dataset = self.dataset
        if self.num_workers == 0:  # the batches themselves (pinned by the DataLoader where asked)
            yield from super().__iter__()
            return
        # held here while the workers run: the pinning thread finds it by its token, which holds it only weakly
        slots = dataset.slots = SharedSlots(self.num_workers, self.prefetch_factor + 1, _slot_bytes(dataset),
                                            self.multiprocessing_context or torch.multiprocessing)
        try:
            deliveries = super().__iter__()  # starts the workers, which take the slots with the dataset
        finally:
            dataset.slots = None
        for delivery in deliveries:
            if delivery.error is not None:
                raise delivery.error
            if delivery.read_stats is not None:
                dataset.absorb(delivery.read_stats)
            if delivery.batch is not None:
                yield finish_batch(delivery.batch, dataset.spec.num_classes, self.pin_memory)

    @property
    def read_stats(self) -> ReadStats:
        return self.dataset.read_stats


def _slot_bytes(dataset: YT8MDataset) -> int:
    """The bytes of a worker's batch tensor: float32 [B, D] video level, uint8 [B, max_frames, D] frame level (rated
    segments are sent as torch sends tensors: they take no slot)."""
    spec = dataset.spec
    if spec.segment_labels:
        return 0
    if spec.frame_features:
        return dataset.batch_size * min(spec.max_frames, ROW_FRAMES) * spec.feature_size
    return dataset.batch_size * spec.feature_size * torch.float32.itemsize


def _sendable(err: BaseException) -> bool:
    """Whether a worker can send `err` as data; the worker's traceback goes along as a note (Python 3.11+), shown
    wherever a traceback is printed."""
    if hasattr(err, "add_note"):
        err.add_note("Raised in a DataLoader worker process:\n" + "".join(traceback.format_tb(err.__traceback__)))
    try:
        pickle.dumps(err)
    except Exception:  # anything unpicklable takes torch's own way, traceback in the message
        return False
    return True


def _deliver_to_batch_loader(worker_id: int) -> None:
    get_worker_info().dataset.batch_loader_worker = True


def _as_is(item: Any) -> Any:
    return item


def make_loader(dataset: YT8MDataset, num_workers: int, pin_memory: bool = False) -> DataLoader:
    """A DataLoader passing the dataset's batches through (batch_size=None), read by `num_workers` processes.

    Workers are started anew each epoch so `set_epoch` reaches them. A RAM cache is filled by `num_workers`
    processes, then served in-process: its batches are gathers from memory, and a worker process would only
    compete with the model for the cores and copy each batch once more (bench/bench_train.py on 2 cores:
    LogisticModel 5.4k examples/s with one worker, 11.1k in-process).
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if dataset.cache_in_memory:
        if dataset.cache is None:
            dataset.load_cache(num_workers)
        num_workers = 0
    dataset.pin_memory = pin_memory and num_workers == 0
    return BatchLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=_as_is, pin_memory=pin_memory,
                       worker_init_fn=_deliver_to_batch_loader, persistent_workers=False,
                       prefetch_factor=2 if num_workers > 0 else None)

"""Batches built from decoded records: video- and frame-level ones decoded piece by piece straight into one tensor,
2019 segment batches stacked from each record's rated segments, and every batch made whole (finish_batch)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import torch

from yt8m.data.format.batch_decode import PackedRecords
from yt8m.data.format.decode import LabelIds, SegmentRatings, decode_frame_batch, decode_video_batch
from yt8m.data.format.wire_scan import RecordError
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.batch_memory import BatchMemory, SlotRef, copy_out
from yt8m.data.reading.spec import FeatureSpec

# Framing bytes around each payload: length, length CRC, payload CRC.
RECORD_OVERHEAD_BYTES = 16
# Frames a frame-level batch's rows hold at first, where max_frames asks for more (segment prediction reads every
# frame): YT8M's videos have fewer, and a slot of 64 such rows takes 75 MB.
ROW_FRAMES = 1024
# The batch entries sent as LabelIds and expanded by finish_batch; "label_weights" (segments): the rated classes.
LABEL_ID_KEYS = ("labels", "label_weights")
SkipRecord = Callable[[RecordError], None]


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


class BatchBuilder:
    """A batch decoded piece by piece straight into its rows of one tensor (`memory` gives it: a worker's shared slot,
    or memory of its own). In file order a piece is the records of one chunk of a reader's buffer, decoded where
    they lie, never copied: the whole batch at once (but where it spans files or read buffers). Labels stay LabelIds
    (see finish_batch). With `skip`, a record that fails to decode goes to it (its error naming file and offset) and
    leaves room for the next one."""

    def __init__(self, batch_size: int, spec: FeatureSpec, skip: Optional[SkipRecord], slot: Optional[SlotRef],
                 features: torch.Tensor):
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
        skip = self.skip
        on_error = None if skip is None else lambda err: skip(_located(err, source))
        try:
            video_ids, labels = self.decode(packed, rows, on_error)
        except RecordError as err:
            raise _located(err, source) from err
        self.count += len(video_ids)
        self.record_bytes += int((packed.ends - packed.starts).sum()) + RECORD_OVERHEAD_BYTES * len(packed)
        self.video_ids += video_ids
        self.labels.append(labels)

    def decode(self, packed: PackedRecords, rows: slice, on_error: Optional[SkipRecord]
               ) -> tuple[list[str], LabelIds]:
        raise NotImplementedError

    def finish(self) -> tuple[Batch, int]:
        """The batch, and the record bytes (framing included) it was decoded from."""
        raise NotImplementedError

    def _sent(self, features: torch.Tensor) -> Any:
        """What the batch carries as features: the slot they lie in (copied out by finish_batch), or the tensor."""
        if self.slot is None:
            return features
        return self.slot._replace(shape=tuple(features.shape))


class _VideoBatchBuilder(BatchBuilder):
    """A video-level batch: float32 [B, D], every row written whole by the decoder (no zeroing first)."""

    def __init__(self, batch_size: int, spec: FeatureSpec, skip: Optional[SkipRecord], memory: BatchMemory):
        super().__init__(batch_size, spec, skip, *memory.new_tensor((batch_size, spec.feature_size), torch.float32))

    def decode(self, packed: PackedRecords, rows: slice, on_error: Optional[SkipRecord]
               ) -> tuple[list[str], LabelIds]:
        spec = self.spec
        decoded = decode_video_batch(packed, spec.feature_names, spec.feature_sizes, spec.num_classes,
                                     out=self.features.numpy()[rows], on_error=on_error)
        return decoded.video_ids, decoded.labels

    def finish(self) -> tuple[Batch, int]:
        features = self.features[:self.count]
        return Batch(self.video_ids, self._sent(features), LabelIds.concat(self.labels)), self.record_bytes


class _FrameBatchBuilder(BatchBuilder):
    """A frame-level batch: uint8 [B, T, D] frames as stored (dequantized by the model, on its device), zero-padded
    after each video's num_frames, T the batch's longest video (at least 1). Rows are decoded max_frames apart (at
    most ROW_FRAMES: more only for a piece whose records may hold more frames), then moved together where the
    batch's videos are all shorter."""

    def __init__(self, batch_size: int, spec: FeatureSpec, skip: Optional[SkipRecord], memory: BatchMemory):
        shape = (batch_size, min(spec.max_frames, ROW_FRAMES), spec.feature_size)
        super().__init__(batch_size, spec, skip, *memory.new_tensor(shape, torch.uint8))
        self.memory = memory
        self.num_frames = np.zeros(batch_size, np.int64)

    def decode(self, packed: PackedRecords, rows: slice, on_error: Optional[SkipRecord]
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
        _, self.features = self.memory.new_tensor((self.batch_size, frames, self.spec.feature_size), torch.uint8,
                                                  False)
        self.slot = None
        kept = old.shape[1]
        self.features[:self.count, :kept] = old[:self.count]
        self.features[:self.count, kept:] = 0
        if old_slot is not None:
            self.memory.free_slot(old_slot)

    def finish(self) -> tuple[Batch, int]:
        num_frames = self.num_frames[:self.count]
        frames = _rows_together(self.features, self.count, max(1, int(num_frames.max(initial=0))))
        batch = Batch(self.video_ids, self._sent(frames), LabelIds.concat(self.labels),
                      num_frames=torch.from_numpy(num_frames.copy()))
        return batch, self.record_bytes


def _located(err: RecordError, source: Callable[[int], tuple[str, int]]) -> RecordError:
    """The same error naming its record's file and byte offset (`source(i)` names record i's)."""
    assert err.batch_index is not None, "the batch decoders set batch_index on each RecordError they raise or pass on"
    return err.at(*source(err.batch_index))


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


def batch_builder(batch_size: int, spec: FeatureSpec, skip: Optional[SkipRecord], memory: BatchMemory) -> BatchBuilder:
    """An empty batch of the spec's level."""
    builder = _FrameBatchBuilder if spec.frame_features else _VideoBatchBuilder
    return builder(batch_size, spec, skip, memory)


class DecodedSegment(NamedTuple):
    """One rated 2019 segment of a record, an example of a segment batch; the record's bytes are counted with its
    first segment (0 for the others)."""

    segment_id: str  # VIDEOID:START
    present: list[int]  # the classes rated present
    rated: list[int]  # the classes rated either way
    frames: np.ndarray  # uint8 [segment_size, D]
    record_bytes: int


def segment_examples(video_id: str, frames: np.ndarray, ratings: SegmentRatings, segment_size: int,
                     record_bytes: int) -> list[DecodedSegment]:
    """One example per distinct rated start (all classes rated there), as the starter kit groups them."""
    examples = []
    for index, start in enumerate(np.unique(ratings.start_times).tolist()):
        rated = ratings.start_times == start
        examples.append(DecodedSegment(f"{video_id}:{start}", ratings.labels[rated & (ratings.scores > 0)].tolist(),
                                       ratings.labels[rated].tolist(), frames[start:start + segment_size],
                                       record_bytes if index == 0 else 0))
    return examples


def segment_batch(segments: list[DecodedSegment], spec: FeatureSpec) -> Batch:
    """One segment batch: [B, segment_size, D] uint8 frames as stored, labels (rated present) and label_weights
    (rated either way) as LabelIds."""
    features = torch.from_numpy(np.stack([segment.frames for segment in segments]))
    return Batch([segment.segment_id for segment in segments], features,
                 LabelIds.from_lists([segment.present for segment in segments]),
                 num_frames=torch.full((len(segments),), spec.segment_size, dtype=torch.int64),
                 label_weights=LabelIds.from_lists([segment.rated for segment in segments]))

"""The RAM cache: a rank's decoded videos held in memory (float32 rows, or frame-level uint8 frames as stored, without
padding), served as a dataset of their own in each epoch's order, split over DataLoader workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import numpy as np
import torch
from torch.utils.data import IterableDataset

from yt8m.data.format.decode import LabelIds
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.read_plan import ReadPlan
from yt8m.data.reading.spec import FeatureSpec


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

    @property
    def nbytes(self) -> int:
        return self.features.nbytes + sum(part.nbytes for part in self.parts)


class _FrameRows:
    """Frame-level videos as stored, uint8 (a quarter of float32's bytes): each batch's real frames back to back in
    one [frames, D] array (no padding), and per video its array, first frame and frame count."""

    def __init__(self, feature_size: int):
        self.feature_size = feature_size
        self.chunks: list[np.ndarray] = []
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (chunk, first frame, frames) per video
        self.chunk_of = self.first_frame = self.num_frames = np.zeros(0, np.int64)

    def add(self, batch: Batch) -> None:
        assert batch.num_frames is not None  # a frame-level batch counts its videos' frames
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

    @property
    def nbytes(self) -> int:
        index = self.chunk_of.nbytes + self.first_frame.nbytes + self.num_frames.nbytes
        return sum(chunk.nbytes for chunk in self.chunks) + index + sum(a.nbytes for part in self.parts for a in part)


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

    @property
    def nbytes(self) -> int:
        """The bytes its arrays hold (what the cache adds to the process's memory, allocator overhead aside)."""
        return (self.video_ids.nbytes + self.features.nbytes + self.label_values.nbytes
                + self.label_offsets.nbytes)

    def batch(self, indices: np.ndarray) -> Batch:
        starts, counts = self.label_offsets[indices], np.diff(self.label_offsets)[indices]
        offsets = np.concatenate([[0], np.cumsum(counts)])
        # Each row's label slice, gathered at once: position j of row r is starts[r] + j.
        positions = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1])
        features, num_frames = self.features.take(indices)
        return Batch(self.video_ids[indices].tolist(), features, LabelIds(self.label_values[positions], offsets),
                     num_frames=num_frames)


class CachedDataset(IterableDataset):
    """Batches of `batch_size` videos from a VideoCache, in the order `plan` gives the epoch (shuffled or not), each
    DataLoader worker serving its share of them; labels as LabelIds (see finish_batch). With `drop_remainder` a
    short last batch is left out."""

    def __init__(self, videos: VideoCache, plan: ReadPlan, batch_size: int, drop_remainder: bool):
        self.videos, self.plan = videos, plan
        self.batch_size, self.drop_remainder = batch_size, drop_remainder

    def __len__(self) -> int:
        return len(self.videos)

    def __iter__(self) -> Iterator[Batch]:
        return self.batches()

    def batches(self, resume: Optional[CachePosition] = None) -> Iterator[Batch]:
        """The epoch's batches, each with its CachePosition; from `resume` on (its batches skipped unread)."""
        skip = resume.batches if resume is not None else 0
        for number, indices in enumerate(self.plan.cached_batches(len(self.videos), self.batch_size), start=1):
            if len(indices) < self.batch_size and self.drop_remainder:
                return
            if number > skip:
                batch = self.videos.batch(indices)
                batch.position = CachePosition(0, number)
                yield batch


@dataclass(frozen=True)
class CachePosition:
    """Where a RAM cache's reader stood after one of its batches: the batches it served this epoch."""

    reader: int
    batches: int

"""Learnable synthetic YouTube-8M data: video-level, frame-level and 2019 segment-rated TFRecord shards.

Classes follow Zipf-like frequencies and add noisy prototype vectors to the features; in frame-level videos
some classes show only in a window of frames, which the segment ratings mark. Ground truth is `VideoId,Labels`;
the classes are listed as the 2018 and 2019 vocabularies list theirs.
"""

from __future__ import annotations

import csv
import posixpath
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import fsspec
import numpy as np

from yt8m.data.format.encode import encode_frame_example, encode_video_example
from yt8m.data.format.tfrecord import TFRecordWriter

KINDS = ("video", "frame", "segment")
SPLITS = ("train", "validate", "test")
LABELED_SPLITS = ("train", "validate")  # test shards carry no labels, as in YT8M
VIDEO_FEATURE_NAMES = ("mean_rgb", "mean_audio")
FRAME_FEATURE_NAMES = ("rgb", "audio")

ZIPF_EXPONENT = 1.0
MEAN_LABELS = 3.0  # 1 + Poisson(2): about 3 per video, as in YT8M
MAX_LABELS = 8
UNLABELED_RATE = 0.01  # a few labeled-split videos with no label at all
HIDDEN_LABEL_RATE = 0.2  # labels with no evidence in the features: no model can find them
DISTRACTOR_WEIGHT = 0.6  # one unlabeled class per video leaks into the features
PROTOTYPE_STD = 0.06
OFFSET_STD = 0.3
NOISE_STD = 0.5
VIDEO_NOISE_STD = 0.35  # frame level: per video, shared by all its frames
FRAME_NOISE_STD = 0.35  # frame level: per frame
LOCALIZED_RATE = 0.5  # frame-level labels whose evidence lies only in a window of frames
LOCALIZED_GAIN = 3.0  # the window holds strong evidence that averaging over all frames dilutes
SEGMENT_FRAMES = 5  # 2019 segments: 5 frames (seconds) starting at a multiple of 5
VALUE_RANGE = (-2.0, 2.0)
ID_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
ID_MULTIPLIER = 1_000_003  # prime, coprime with every power of 62: a bijection that scatters ids
SYNTHETIC_VERTICALS = 24  # as many as the 2018 vocabulary's Vertical1 values
VOCABULARY_COLUMNS = ("Index", "TrainVideoCount", "KnowledgeGraphId", "Name", "WikiUrl", "Vertical1", "Vertical2",
                      "Vertical3", "WikiDescription")  # the 2018 vocabulary.csv's
SEGMENT_VOCABULARY_COLUMNS = ("Index", "KnowledgeGraphId", "Name", "PositiveSegmentCount",
                              "TotalSegmentCount")  # the 2019 segment_vocabulary.csv's


@dataclass
class _World:
    """What every split of one data set shares: class frequencies and feature prototypes."""

    class_probs: np.ndarray  # [C]
    prototypes: np.ndarray  # [C + 1, D]; the last row is zero, for padded label slots
    offset: np.ndarray  # [D], a per-dimension mean


@dataclass
class _Videos:
    """Labels and evidence weights of a block of videos; label slots past `counts` hold class C."""

    ids: list[str]
    labels: np.ndarray  # [N, MAX_LABELS] sorted class ids, padded with C
    counts: np.ndarray  # [N]
    weights: np.ndarray  # [N, MAX_LABELS] evidence strength, 0 for hidden labels and padding
    distractors: np.ndarray  # [N] one class per video that shows weakly without being labeled

    def label_list(self, row: int) -> list[int]:
        return self.labels[row, :self.counts[row]].tolist()


def _make_world(num_classes: int, feature_size: int, seed: int) -> _World:
    rng = np.random.default_rng([seed, 0xC1A55])
    probs = 1.0 / np.arange(1, num_classes + 1) ** ZIPF_EXPONENT
    prototypes = np.zeros((num_classes + 1, feature_size), np.float32)
    prototypes[:num_classes] = rng.standard_normal((num_classes, feature_size), np.float32) * PROTOTYPE_STD
    prototypes[:num_classes] *= np.sqrt(1024 / feature_size)  # the same prototype norm at any feature size
    offset = rng.standard_normal(feature_size, np.float32) * OFFSET_STD
    return _World(probs / probs.sum(), prototypes, offset)


def _video_ids(start: int, count: int, total: int) -> list[str]:
    """`count` distinct ids from a fixed scatter of [0, total): base-62, 4 characters as in YT8M 2018 (or more)."""
    width = 4
    while len(ID_ALPHABET) ** width < total:
        width += 1
    space = len(ID_ALPHABET) ** width
    codes = (np.arange(start, start + count, dtype=np.int64) * ID_MULTIPLIER) % space
    digits = (codes[:, None] // len(ID_ALPHABET) ** np.arange(width - 1, -1, -1)) % len(ID_ALPHABET)
    alphabet = np.array(list(ID_ALPHABET))
    return ["".join(row) for row in alphabet[digits].tolist()]


def _draw_videos(rng: np.random.Generator, world: _World, ids: list[str]) -> _Videos:
    count = len(ids)
    num_classes = len(world.class_probs)
    counts = np.minimum(1 + rng.poisson(MEAN_LABELS - 1, count), min(MAX_LABELS, num_classes))
    counts[rng.random(count) < UNLABELED_RATE] = 0
    draws = rng.choice(num_classes, size=(count, 4 * MAX_LABELS), p=world.class_probs)
    # Keep the first `counts[i]` distinct classes of each row's draws.
    order = np.argsort(draws, axis=1, kind="stable")
    ranked = np.take_along_axis(draws, order, axis=1)
    first_sorted = np.ones_like(ranked, dtype=bool)
    first_sorted[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
    first = np.empty_like(first_sorted)
    np.put_along_axis(first, order, first_sorted, axis=1)
    rank = np.cumsum(first, axis=1) - 1
    keep = first & (rank < counts[:, None])
    labels = np.full((count, MAX_LABELS), num_classes, np.int64)
    rows, cols = np.nonzero(keep)
    labels[rows, rank[rows, cols]] = draws[rows, cols]
    labels.sort(axis=1)
    counts = keep.sum(axis=1)
    weights = rng.uniform(0.6, 1.4, (count, MAX_LABELS)).astype(np.float32)
    weights[(labels == num_classes) | (rng.random((count, MAX_LABELS)) < HIDDEN_LABEL_RATE)] = 0.0
    distractors = rng.integers(0, num_classes, count)
    return _Videos(ids, labels, counts, weights, distractors)


def _evidence(world: _World, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Sum over label slots of weight * prototype: [N, D], one slot at a time to keep memory at [N, D]."""
    evidence = np.zeros((len(labels), world.offset.size), np.float32)
    for slot in range(labels.shape[1]):
        rows = np.flatnonzero(weights[:, slot])
        evidence[rows] += weights[rows, slot, None] * world.prototypes[labels[rows, slot]]
    return evidence


def _video_features(rng: np.random.Generator, world: _World, videos: _Videos) -> np.ndarray:
    features = rng.standard_normal((len(videos.ids), world.offset.size), np.float32) * NOISE_STD
    features += world.offset + _evidence(world, videos.labels, videos.weights)
    features += DISTRACTOR_WEIGHT * rng.random((len(videos.ids), 1), np.float32) * world.prototypes[videos.distractors]
    return np.clip(features, *VALUE_RANGE)


def quantize(values: np.ndarray) -> np.ndarray:
    """YT8M 8-bit quantization of values in [-2, 2], the inverse of its dequantization."""
    low, high = VALUE_RANGE
    scale = (high - low) / 255.0
    bias = (high - low) / 512.0 + low
    return np.clip(np.rint((values - bias) / scale), 0, 255).astype(np.uint8)


@dataclass
class _FrameVideo:
    frames: np.ndarray  # uint8 [T, D]
    segments: dict[str, list]


def _frame_video(rng: np.random.Generator, world: _World, videos: _Videos, row: int,
                 frame_range: tuple[int, int]) -> _FrameVideo:
    """One video's quantized frames; localized classes get strong evidence in a window of whole segments.

    Its segment ratings mark up to two 5-frame segments inside each window (score 1) and one outside (score 0).
    """
    num_frames = int(rng.integers(frame_range[0], frame_range[1] + 1))
    frames = rng.standard_normal((num_frames, world.offset.size), np.float32) * FRAME_NOISE_STD
    frames += world.offset + rng.standard_normal(world.offset.size, np.float32) * VIDEO_NOISE_STD
    frames += DISTRACTOR_WEIGHT * rng.random() * world.prototypes[videos.distractors[row]]
    units = num_frames // SEGMENT_FRAMES
    segments: dict[str, list] = {"segment_start_times": [], "segment_labels": [], "segment_scores": []}
    for label, weight in zip(videos.labels[row].tolist(), videos.weights[row].tolist()):
        if weight == 0.0:
            continue
        evidence = weight * world.prototypes[label]
        if units < 2 or rng.random() >= LOCALIZED_RATE:
            frames += evidence
            continue
        length = int(rng.integers(1, max(1, units // 4) + 1))
        first = int(rng.integers(0, units - length + 1))
        frames[first * SEGMENT_FRAMES:(first + length) * SEGMENT_FRAMES] += LOCALIZED_GAIN * evidence
        inside = rng.permutation(np.arange(first, first + length))[:2].tolist()
        outside = rng.permutation(np.r_[0:first, first + length:units])[:1].tolist()
        for unit, score in [(u, 1.0) for u in inside] + [(u, 0.0) for u in outside]:
            segments["segment_start_times"].append(unit * SEGMENT_FRAMES)
            segments["segment_labels"].append(label)
            segments["segment_scores"].append(score)
    return _FrameVideo(quantize(frames), segments)


def _split_columns(values: np.ndarray, names: tuple[str, ...], sizes: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The last axis cut into named features of the given sizes."""
    return dict(zip(names, np.split(values, np.cumsum(sizes)[:-1].tolist(), axis=-1)))


def _video_payloads(rng: np.random.Generator, world: _World, videos: _Videos, id_key: str,
                    feature_sizes: tuple[int, ...], labeled: bool) -> Iterator[bytes]:
    columns = _split_columns(_video_features(rng, world, videos), VIDEO_FEATURE_NAMES, feature_sizes)
    for row, video_id in enumerate(videos.ids):
        yield encode_video_example(video_id, videos.label_list(row) if labeled else None,
                                   {name: values[row] for name, values in columns.items()}, id_key=id_key)


def _frame_payloads(rng: np.random.Generator, world: _World, videos: _Videos, id_key: str,
                    feature_sizes: tuple[int, ...], labeled: bool, frame_range: tuple[int, int],
                    ratings: Optional[np.ndarray]) -> Iterator[bytes]:
    """With `ratings` ([classes, 2]: positive and all rated segments), labelled videos carry 2019 segment ratings,
    counted there."""
    for row, video_id in enumerate(videos.ids):
        video = _frame_video(rng, world, videos, row, frame_range)
        segments = video.segments if ratings is not None and labeled else None
        if segments is not None and ratings is not None:  # (segments are only kept where ratings count them)
            classes = np.array(segments["segment_labels"], np.int64)
            np.add.at(ratings[:, 0], classes, np.array(segments["segment_scores"], np.int64))  # views: in place
            np.add.at(ratings[:, 1], classes, 1)
        yield encode_frame_example(video_id, videos.label_list(row) if labeled else None,
                                   _split_columns(video.frames, FRAME_FEATURE_NAMES, feature_sizes),
                                   segments=segments, id_key=id_key)


@dataclass
class _Plan:
    """Everything that shapes one kind's files, fixed before any split is written."""

    folder: str
    kind: str
    world: _World
    seed: int
    shards: int
    feature_sizes: tuple[int, ...]
    frame_range: tuple[int, int]
    id_key: str
    gzip: bool
    total_videos: int
    ratings: Optional[np.ndarray]  # segment kind: [classes, 2] positive and all rated segments, counted as written


def _payloads(plan: _Plan, rng: np.random.Generator, videos: _Videos, labeled: bool) -> Iterator[bytes]:
    if plan.kind == "video":
        return _video_payloads(rng, plan.world, videos, plan.id_key, plan.feature_sizes, labeled)
    return _frame_payloads(rng, plan.world, videos, plan.id_key, plan.feature_sizes, labeled, plan.frame_range,
                           plan.ratings)


Truth = list[tuple[str, list[int]]]  # (video id, its labels) per video


def _write_split(plan: _Plan, split: str, count: int, first_video: int) -> tuple[list[str], Truth]:
    """Write one split's shards; returns their paths and each video's (id, true labels)."""
    num_shards = max(1, min(plan.shards, count))
    bounds = np.linspace(0, count, num_shards + 1).astype(np.int64).tolist()
    suffix = ".tfrecord.gz" if plan.gzip else ".tfrecord"
    paths, truth = [], []
    for shard in range(num_shards):
        rng = np.random.default_rng([plan.seed, KINDS.index(plan.kind), SPLITS.index(split), shard])
        ids = _video_ids(first_video + bounds[shard], bounds[shard + 1] - bounds[shard], plan.total_videos)
        videos = _draw_videos(rng, plan.world, ids)
        truth += [(video_id, videos.label_list(row)) for row, video_id in enumerate(ids)]
        path = posixpath.join(plan.folder, f"{split}-{shard:05d}-of-{num_shards:05d}{suffix}")
        with TFRecordWriter(path, compression="GZIP" if plan.gzip else None) as writer:
            for payload in _payloads(plan, rng, videos, labeled=split in LABELED_SPLITS):
                writer.write(payload)
        paths.append(path)
    return paths, truth


def _write_truth(path: str, truth: Truth) -> None:
    """The official ground-truth format: `VideoId,Labels`, labels space-separated (empty when none)."""
    lines = ["VideoId,Labels"] + [f"{video_id},{' '.join(map(str, labels))}" for video_id, labels in truth]
    with fsspec.open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


def synthetic_vertical(class_id: int) -> str:
    """The Vertical1 of a synthetic class: classes dealt round the verticals in turn."""
    return f"Vertical {class_id % SYNTHETIC_VERTICALS:02d}"


def _write_vocabulary(path: str, train_counts: np.ndarray) -> None:
    """The 2018 vocabulary.csv's columns for the synthetic classes, rows ordered as the real file's (by
    TrainVideoCount, most first), so that a reader must look rows up by Index, as the real file needs."""
    order = sorted(range(len(train_counts)), key=lambda index: (-train_counts[index], index))
    with fsspec.open(path, "w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(VOCABULARY_COLUMNS)
        for index in order:
            vertical = synthetic_vertical(index)
            writer.writerow([index, int(train_counts[index]), f"/m/synthetic{index}", f"Class {index}", "", vertical,
                             "", "", f"Synthetic class {index}, of {vertical}."])


def _write_segment_vocabulary(path: str, ratings: np.ndarray) -> None:
    """The 2019 segment_vocabulary.csv's columns: the classes with rated segments, ascending, and their counts."""
    with fsspec.open(path, "w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(SEGMENT_VOCABULARY_COLUMNS)
        for index in np.flatnonzero(ratings[:, 1]).tolist():
            writer.writerow([index, f"/m/synthetic{index}", f"Class {index}", int(ratings[index, 0]),
                             int(ratings[index, 1])])


def _check_arguments(kind: str, num_classes: int, shards: int, feature_sizes: tuple[int, ...],
                     frame_range: tuple[int, int], id_key: str) -> None:
    problems = []
    if kind not in KINDS:
        problems.append(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if num_classes < 1 or shards < 1:
        problems.append(f"num_classes and shards must be positive, got {num_classes} and {shards}")
    if len(feature_sizes) != len(VIDEO_FEATURE_NAMES) or min(feature_sizes) < 1:
        problems.append(f"feature_sizes must be {len(VIDEO_FEATURE_NAMES)} positive sizes, got {feature_sizes}")
    if not 1 <= frame_range[0] <= frame_range[1]:
        problems.append(f"need 1 <= min_frames <= max_frames, got {frame_range[0]} and {frame_range[1]}")
    if id_key not in ("id", "video_id"):
        problems.append(f"id_key must be 'id' or 'video_id', got {id_key!r}")
    if problems:
        raise ValueError("; ".join(problems))


def write_synthetic(output_dir: str, *, kind: str = "video", num_classes: int = 3862, train_videos: int = 2000,
                    validate_videos: int = 500, test_videos: int = 500, shards: int = 4, seed: int = 0,
                    feature_sizes: Sequence[int] = (1024, 128), min_frames: int = 20, max_frames: int = 100,
                    id_key: str = "id", gzip: bool = False) -> dict:
    """Write train/validate/test shards of one kind into `<output_dir>/<kind>/`, plus ground-truth CSVs.

    Returns {"train"/"validate"/"test": [shard paths], "validate_labels"/"test_labels": csv path} for the
    splits with videos, and "vocabulary": the classes in the 2018 vocabulary.csv's columns (synthetic names and
    verticals, TrainVideoCount from the train split); the segment kind adds "segment_vocabulary": the rated classes in
    the 2019 segment_vocabulary.csv's columns, the class list `predict --segment_labels` writes rows for. The files are
    the same, byte for byte, for the same arguments.
    """
    sizes = tuple(feature_sizes)
    _check_arguments(kind, num_classes, shards, sizes, (min_frames, max_frames), id_key)
    counts = {"train": train_videos, "validate": validate_videos, "test": test_videos}
    folder = posixpath.join(output_dir, kind)
    fs, _ = fsspec.core.url_to_fs(folder)
    fs.makedirs(folder, exist_ok=True)
    ratings = np.zeros((num_classes, 2), np.int64) if kind == "segment" else None
    plan = _Plan(folder, kind, _make_world(num_classes, sum(sizes), seed), seed, shards, sizes,
                 (min_frames, max_frames), id_key, gzip, sum(counts.values()), ratings)
    written: dict = {}
    train_counts = np.zeros(num_classes, np.int64)
    first_video = 0
    for split in SPLITS:
        if counts[split] <= 0:
            continue
        written[split], truth = _write_split(plan, split, counts[split], first_video)
        first_video += counts[split]
        if split == "train":
            train_counts = np.bincount([label for _, labels in truth for label in labels], minlength=num_classes)
        else:
            written[f"{split}_labels"] = posixpath.join(folder, f"{split}_labels.csv")
            _write_truth(written[f"{split}_labels"], truth)
    written["vocabulary"] = posixpath.join(folder, "vocabulary.csv")
    _write_vocabulary(written["vocabulary"], train_counts)
    if ratings is not None:
        written["segment_vocabulary"] = posixpath.join(folder, "segment_vocabulary.csv")
        _write_segment_vocabulary(written["segment_vocabulary"], ratings)
    return written

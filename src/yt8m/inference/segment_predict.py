"""2019 segment predictions (`yt8m predict --segment_labels`): every segment of every test video scored by a
frame-level model, each listed class's best segments written as a `Class,Segments` CSV, in bounded memory.
"""
from __future__ import annotations

import importlib.resources
import logging
import os
import re
import time
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TextIO

import numpy as np
import torch
import torch.nn.functional as F

from yt8m.config import ConfigError
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.dataset import YT8MDataset, make_loader
from yt8m.data.reading.inspection import find_video
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.data.reading.spec import FeatureSpec
from yt8m.eval.score import text_lines
from yt8m.fields import quoted
from yt8m.inference.config import PredictConfig
from yt8m.inference.predictions import Predictor, check_finite, unwritable_id
from yt8m.io.files import write_file_atomically
from yt8m.io.spill import KeyedTable, TemporaryDatabase
from yt8m.runtime import reader_workers, resolve_device

log = logging.getLogger("yt8m.inference.predict")

SEGMENT_CSV_HEADER = "Class,Segments\n"
DEFAULT_LABEL_IDS = "segment_label_ids.csv"  # package data of yt8m.data: the 1,000 classes rated in 2019
# Videos per read batch: a batch is zero-padded to its longest video and each DataLoader worker keeps two in flight;
# 16 videos of 300 frames x 1152 features are 22 MB.
READ_VIDEOS = 16
# A class's candidates are cut back to the best `segment_max_pred` once they exceed it by this share (at least
# MIN_SLACK): fewer cuts with more room, more memory with less.
SLACK_SHARE = 8
MIN_SLACK = 2048
SEGMENT_NUMBER_DTYPE = np.uint32  # 4 bytes per kept candidate: up to 4.29 billion segments per run
# Frames no video reaches: the dataset reads every frame (a test video may last longer than 300 s).
EVERY_FRAME = 1 << 40
_INTEGER = re.compile(r"[+-]?[0-9]+")

# (segment numbers) -> lexsort keys, the primary key last: the order in which tied segments are kept and written.
TieKeys = Callable[[np.ndarray], tuple[np.ndarray, ...]]


def read_segment_label_ids(path: str, num_classes: int) -> np.ndarray:
    """The classes to write, ascending: the first comma-separated field of each line of `path` (of the packaged 2019
    list when empty). Line 1 may be a header; blank lines are passed over. ValueError naming the file and line for a
    field that is not a class index, a class outside [0, num_classes) or a class listed twice."""
    if path:
        if not os.path.exists(path):
            raise FileNotFoundError(f"--segment_label_ids_file not found: {path}")
        numbered = text_lines(path)  # bytes that are not UTF-8: an error naming the line
    else:
        path = f"{DEFAULT_LABEL_IDS} (packaged with yt8m)"
        text = importlib.resources.files("yt8m.data").joinpath(DEFAULT_LABEL_IDS).read_text(encoding="utf-8")
        numbered = enumerate(text.splitlines(), start=1)
    lines: dict[int, int] = {}
    for number, line in numbered:
        field = line.split(",", 1)[0].strip()
        if not field or (number == 1 and not _is_integer(field)):
            continue
        if not _is_integer(field):
            raise ValueError(f"{path}:{number}: expected a class index as the first field, found {quoted(field)}")
        class_id = int(field)
        if not 0 <= class_id < num_classes:
            raise ValueError(f"{path}:{number}: class {class_id} is not one of the model's classes [0, {num_classes})")
        if class_id in lines:
            raise ValueError(f"{path}:{number}: class {class_id} is already listed on line {lines[class_id]}")
        lines[class_id] = number
    if not lines:
        raise ValueError(f"{path}: lists no class index")
    return np.array(sorted(lines), np.int64)


def _is_integer(field: str) -> bool:
    return _INTEGER.fullmatch(field) is not None  # ASCII digits: str.isdigit() takes '٣' (Arabic-Indic 3) too


def split_segments(features: torch.Tensor, num_frames: torch.Tensor,
                   segment_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A zero-padded frame batch [B, T, D] cut into its videos' segments: (frames [S, segment_size, D], real frames
    per segment [S], segments per video [B]), video by video, starts ascending. A video of n frames has ceil(n /
    segment_size) segments, the last one zero-padded past frame n (the starter kit's rule); one without frames none."""
    videos, frames, width = features.shape
    per_video = (num_frames + segment_size - 1) // segment_size
    slots = -(-frames // segment_size)
    if slots * segment_size != frames:
        features = F.pad(features, (0, 0, 0, slots * segment_size - frames))
    starts = torch.arange(slots, device=num_frames.device) * segment_size
    present = torch.arange(slots, device=num_frames.device) < per_video[:, None]
    segments = features.reshape(videos, slots, segment_size, width)[present]
    real_frames = (num_frames[:, None] - starts).clamp(max=segment_size)[present]
    return segments, real_frames, per_video


class VideoTable:
    """The videos read so far, in reading order: their ids and first segment numbers (segment numbers count every
    video's segments in reading order). Maps segment numbers to ids `VIDEOID:START`; ids grow the table by their
    characters (4 bytes each) and 8 bytes a video."""

    def __init__(self, segment_size: int):
        self.segment_size = segment_size
        self.count = 0
        self.segments = 0
        self.ids = np.empty(1024, "U4")
        self.first_segments = np.empty(1024, np.int64)
        self._encoded: Optional[tuple[np.ndarray, np.ndarray]] = None

    def add(self, video_ids: Sequence[str], segments_per_video: np.ndarray) -> None:
        end = self.count + len(video_ids)
        width, chars = max(map(len, video_ids), default=0), self.ids.dtype.itemsize // 4
        if end > len(self.ids) or width > chars:  # room for twice the videos, or for the longer ids
            capacity = max(end, 2 * len(self.ids)) if end > len(self.ids) else len(self.ids)
            self.ids = _resized(self.ids[:self.count], capacity, f"U{max(width, chars)}")
            self.first_segments = _resized(self.first_segments[:self.count], capacity, np.int64)
        self.ids[self.count:end] = video_ids
        self.first_segments[self.count:end] = self.segments + np.cumsum(segments_per_video) - segments_per_video
        self.count = end
        self.segments += int(segments_per_video.sum())

    def locate(self, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(video index, start frame) of each segment number."""
        videos = np.searchsorted(self.first_segments[:self.count], numbers, side="right") - 1
        return videos, (numbers - self.first_segments[videos]) * self.segment_size

    def segment_ids(self, numbers: np.ndarray) -> list[str]:
        return self.format_ids(*self.locate(numbers)).split(" ") if len(numbers) else []

    def format_ids(self, videos: np.ndarray, starts: np.ndarray) -> str:
        """`VIDEOID:START` of each segment, space-separated. Built as one byte matrix, a row per segment, whose
        padding is masked out: a Python string per id took most of a run at 1,000 classes x 100,000 segments."""
        id_bytes, id_lengths = self._encoded_ids()
        width = id_bytes.shape[1]
        start_digits, start_shown = _digit_table(int(starts.max(initial=0)), self.segment_size)
        slots = starts // self.segment_size
        rows = np.empty((len(videos), width + start_digits.shape[1] + 2), np.uint8)
        rows[:, :width] = id_bytes[videos]
        rows[:, width] = ord(":")
        rows[:, width + 1:-1] = start_digits[slots]
        rows[:, -1] = ord(" ")
        shown = np.ones(rows.shape, bool)
        shown[:, :width] = np.arange(width) < id_lengths[videos][:, None]
        shown[:, width + 1:-1] = start_shown[slots]
        return rows[shown][:-1].tobytes().decode("utf-8")

    def _encoded_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """UTF-8 ids as a [videos, widest] uint8 matrix and their lengths; made again only after videos were added."""
        if self._encoded is None or len(self._encoded[1]) != self.count:
            encoded = np.char.encode(self.ids[:self.count], "utf-8")
            width = max(encoded.dtype.itemsize, 1)
            self._encoded = encoded.astype(f"S{width}").view(np.uint8).reshape(self.count, width), \
                np.char.str_len(encoded)
        return self._encoded

    def id_order(self, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """TieKeys ordering segments by video id (code points), then start."""
        videos, starts = self.locate(numbers)
        return starts, self.ids[videos]

    def id_ranks(self) -> np.ndarray:
        """Each video's place in id order: id_order as one integer per video, for ordering many segments at once."""
        ranks = np.empty(self.count, np.int64)
        ranks[np.argsort(self.ids[:self.count])] = np.arange(self.count)
        return ranks


def best_first(scores: np.ndarray, tiebreaks: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` best scores, descending; equal scores by ascending `tiebreaks`. Ties are rare, so only the
    tied runs of the score order are sorted again (a lexsort of all took 2.7x the argsort)."""
    order = np.argsort(-scores)
    ranked = scores[order]
    tied = np.flatnonzero(np.r_[False, ranked[1:] == ranked[:-1]] | np.r_[ranked[:-1] == ranked[1:], False])
    if len(tied):
        groups = np.cumsum(np.r_[True, ranked[1:] != ranked[:-1]])[tied]
        order[tied] = order[tied][np.lexsort((tiebreaks[order[tied]], groups))]
    return order[:k]


def class_row_text(top: TopSegments, videos: VideoTable, index: int, ranks: np.ndarray) -> str:
    """The best segment ids of class `index` (its row in the scores), best first, space-separated (VideoTable.
    format_ids); its candidates are released. `ranks`: videos.id_ranks()."""
    scores, numbers = top.take(index)
    video_index, starts = videos.locate(numbers)
    best = best_first(scores, ranks[video_index] << 32 | starts, top.k)
    return videos.format_ids(video_index[best], starts[best])


def _digit_table(last_start: int, segment_size: int) -> tuple[np.ndarray, np.ndarray]:
    """ASCII digits of the starts 0, segment_size, ... last_start, right-aligned, a row each, and which are shown
    (no leading zeros; "0" keeps its one)."""
    powers = 10 ** np.arange(len(str(last_start)) - 1, -1, -1, dtype=np.int64)
    starts = np.arange(0, last_start + 1, segment_size)[:, None]
    return (starts // powers % 10 + ord("0")).astype(np.uint8), (starts >= powers) | (powers == 1)


def _resized(values: np.ndarray, capacity: int, dtype: Any) -> np.ndarray:
    grown = np.empty(capacity, dtype)
    grown[:len(values)] = values
    return grown


class TopSegments:
    """Each class's best `k` segments: scores (float32) and segment numbers in numpy arrays of at most
    `capacity` = k + max(MIN_SLACK, k / SLACK_SHARE) entries (8 bytes each), cut back to the best k with
    np.partition when a batch would overflow them. Once a class holds k, a newcomer must reach its k-th best
    score to enter. Order: score descending, ties by `tie_keys` (the same order when cutting and writing)."""

    def __init__(self, classes: int, k: int, tie_keys: TieKeys):
        self.k = k
        self.capacity = k + max(MIN_SLACK, k // SLACK_SHARE)
        self.tie_keys = tie_keys
        self.scores = [np.empty(0, np.float32) for _ in range(classes)]
        self.numbers = [np.empty(0, SEGMENT_NUMBER_DTYPE) for _ in range(classes)]
        self.counts = np.zeros(classes, np.int64)
        self.thresholds = np.full(classes, -np.inf, np.float32)

    def add(self, scores: np.ndarray, first_number: int) -> None:
        """Offer segments `first_number`, `first_number` + 1, ... with `scores` [classes, segments]."""
        end = first_number + scores.shape[1]
        if end > np.iinfo(SEGMENT_NUMBER_DTYPE).max:
            raise ValueError(f"more than {np.iinfo(SEGMENT_NUMBER_DTYPE).max} segments: too many for one run")
        numbers = np.arange(first_number, end, dtype=SEGMENT_NUMBER_DTYPE)
        entering = scores >= self.thresholds[:, None]
        for index in range(len(scores)):
            taken = np.flatnonzero(entering[index])
            if len(taken):
                self._append(index, scores[index, taken], numbers[taken])

    def _append(self, index: int, scores: np.ndarray, numbers: np.ndarray) -> None:
        count = self.counts[index]
        end = count + len(scores)
        if end > self.capacity:
            kept_scores, kept_numbers = self._best(np.concatenate([self.scores[index][:count], scores]),
                                                   np.concatenate([self.numbers[index][:count], numbers]))
            self.thresholds[index] = kept_scores.min()
            self._store(index, kept_scores, kept_numbers, 0)
            return
        self._store(index, scores, numbers, count)

    def _store(self, index: int, scores: np.ndarray, numbers: np.ndarray, at: int) -> None:
        end = at + len(scores)
        if end > len(self.scores[index]):
            capacity = min(self.capacity, max(end, 2 * len(self.scores[index])))
            self.scores[index] = _resized(self.scores[index][:at], capacity, np.float32)
            self.numbers[index] = _resized(self.numbers[index][:at], capacity, SEGMENT_NUMBER_DTYPE)
        self.scores[index][at:end] = scores
        self.numbers[index][at:end] = numbers
        self.counts[index] = end

    def _best(self, scores: np.ndarray, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The k best of more than k candidates; of those tied at the k-th score, the first by tie_keys."""
        cut = len(scores) - self.k
        kth = np.partition(scores, cut)[cut]
        above = np.flatnonzero(scores > kth)
        tied = np.flatnonzero(scores == kth)
        room = self.k - len(above)
        if len(tied) > room:
            tied = tied[np.lexsort(self.tie_keys(numbers[tied]))[:room]]
        kept = np.concatenate([above, tied])
        return scores[kept], numbers[kept]

    def take(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Class `index`'s candidates (scores, segment numbers): its best k and up to capacity - k more. The class
        holds none afterwards."""
        count = self.counts[index]
        taken = self.scores[index][:count], self.numbers[index][:count]
        self.scores[index] = np.empty(0, np.float32)
        self.numbers[index] = np.empty(0, SEGMENT_NUMBER_DTYPE)
        self.counts[index] = 0
        return taken


def segment_id_problem(video_id: str) -> Optional[str]:
    """Why a video id cannot name segments in the CSV's space-separated Segments field, or None."""
    problem = unwritable_id(video_id, "csv")
    if problem is None and any(char.isspace() or char == "\0" for char in video_id):
        problem = "a segment id in the Segments field cannot hold whitespace or NUL characters"
    return problem


class SegmentScorer:
    """Scores the segments of a stream of frame-level video batches into TopSegments."""

    def __init__(self, predict: Predictor, classes: np.ndarray, segment_size: int,
                 batch_size: int, max_pred: int, output_file: str, locate: Callable[[str], list[str]]):
        self.predict = predict
        self.classes = classes
        self.segment_size = segment_size
        self.batch_size = batch_size
        self.output_file = output_file
        self.locate = locate
        self.videos = VideoTable(segment_size)
        self.top = TopSegments(len(classes), max_pred, self.videos.id_order)
        self.scored = 0

    def run(self, batches: Iterable[Batch]) -> None:
        started = time.perf_counter()
        with TemporaryDatabase() as database:
            seen = KeyedTable(database, "videos")
            for features, num_frames in _rebatched(self._segments(batches, seen), self.batch_size):
                self._score(features, num_frames)
                log.info("scored %d segments of %d videos, %.0f segments/s", self.scored, self.videos.count,
                         self.scored / max(time.perf_counter() - started, 1e-9))

    def _segments(self, batches: Iterable[Batch], seen: KeyedTable) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Each batch's segments, its videos entered in the table (ids checked) before they are scored."""
        for batch in batches:
            video_ids = batch.video_ids
            self._check_ids(video_ids, seen)
            if batch.num_frames is None:
                raise ValueError("segments are cut from frame-level batches, which carry their frame counts")
            segments, real_frames, per_video = split_segments(batch.features, batch.num_frames,
                                                              self.segment_size)
            self.videos.add(video_ids, per_video.numpy())
            yield segments, real_frames

    def _check_ids(self, video_ids: Sequence[str], seen: KeyedTable) -> None:
        for video_id in video_ids:
            problem = segment_id_problem(video_id)
            if problem is not None:
                raise ValueError(f"{self.output_file}: cannot write segments of video {video_id!r}"
                                 f"{self._where(video_id)}: {problem}")
        duplicate = seen.add_many(video_ids, self.videos.count + 1)
        if duplicate is not None:
            raise ValueError(f"{self.output_file}: video {duplicate.key!r} is read twice{self._where(duplicate.key)}: "
                             "each video's segments must be written once")

    def _where(self, video_id: str) -> str:
        places = self.locate(video_id)
        return f" (in {' and '.join(places)})" if places else ""

    def _score(self, features: torch.Tensor, num_frames: torch.Tensor) -> None:
        predictions = self.predict(Batch([], features, None, num_frames))
        scores = predictions.float().numpy().T[self.classes]  # [classes written, segments]
        if not np.isfinite(scores).all():
            numbers = np.arange(self.scored, self.scored + len(predictions))
            check_finite(torch.from_numpy(scores.T), self.videos.segment_ids(numbers), self.output_file,
                         lambda segment_id: self.locate(segment_id.rpartition(":")[0]))
        self.top.add(scores, self.scored)
        self.scored += len(predictions)

    def write(self, out: TextIO) -> None:
        """The CSV: a row per class, ascending, its segment ids best first."""
        out.write(SEGMENT_CSV_HEADER)
        ranks = self.videos.id_ranks()
        for index, class_id in enumerate(self.classes.tolist()):
            out.write(f"{class_id},{class_row_text(self.top, self.videos, index, ranks)}\n")


def _rebatched(pieces: Iterable[tuple[torch.Tensor, torch.Tensor]],
               size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The pieces' rows, in order, in batches of `size` rows (the last one smaller), copied into one buffer that is
    reused: a batch is valid until the next is asked for. Concatenating instead held each batch twice at its peak
    (190 MB each at 8192 segments of 1152 features)."""
    buffer: Optional[tuple[torch.Tensor, torch.Tensor]] = None
    filled = 0
    for features, num_frames in pieces:
        if buffer is None:
            buffer = features.new_empty((size, *features.shape[1:])), num_frames.new_empty(size)
        start = 0
        while start < len(features):
            taken = min(size - filled, len(features) - start)
            buffer[0][filled:filled + taken] = features[start:start + taken]
            buffer[1][filled:filled + taken] = num_frames[start:start + taken]
            filled, start = filled + taken, start + taken
            if filled == size:
                yield buffer
                filled = 0
    if filled and buffer is not None:
        yield buffer[0][:filled], buffer[1][:filled]


def predict_segments(config: PredictConfig, predict: Predictor, spec: FeatureSpec,
                     source: dict[str, Any]) -> dict[str, Any]:
    """`yt8m predict --segment_labels` with a loaded predictor and its FeatureSpec; returns the summary."""
    if not spec.frame_features:
        raise ConfigError("invalid predict config", ["--segment_labels scores segments of frames: the model must "
                                                     "be frame-level (trained with --frame_features)"])
    data, segments, output_file = config.data, config.segments, config.output.output_file
    if config.output.output_format != "csv":
        raise ConfigError("invalid predict config", ["--segment_labels writes a Class,Segments CSV: --output_format "
                                                     f"{config.output.output_format} is for video predictions"])
    classes = read_segment_label_ids(segments.segment_label_ids_file, spec.num_classes)
    every_frame = FeatureSpec(spec.feature_names, spec.feature_sizes, True, EVERY_FRAME, spec.num_classes)
    dataset = YT8MDataset(data.input_data_pattern, every_frame, READ_VIDEOS,
                          ReadOptions(skip_corrupt=data.skip_corrupt))
    pin_memory = not config.source.model and resolve_device(data.device).type == "cuda"
    loader = make_loader(dataset, reader_workers(data.num_readers, True), pin_memory=pin_memory)
    scorer = SegmentScorer(predict, classes, segments.segment_size, data.batch_size, segments.segment_max_pred,
                           output_file, lambda video_id: find_video(dataset.paths, video_id))
    log.info("scoring the %d-frame segments of %s for %d classes with %s", segments.segment_size,
             data.input_data_pattern, len(classes), source)
    started = time.perf_counter()

    def score_then_write(out: TextIO) -> float:
        scorer.run(loader)
        scored = time.perf_counter()
        scorer.write(out)
        return scored

    scored = write_file_atomically(output_file, score_then_write)
    seconds = time.perf_counter() - started
    log.info("wrote the best %d of %d segments (%d videos) for %d classes to %s in %.1f s", segments.segment_max_pred,
             scorer.scored, scorer.videos.count, len(classes), output_file, seconds)
    skipped = {"skipped_files": dataset.skipped_files, "skipped_records": dataset.skipped_records} \
        if data.skip_corrupt else {}
    return {"output_file": output_file, "output_format": "segments", "videos": scorer.videos.count,
            "segments": scorer.scored, "classes": len(classes), "segment_max_pred": segments.segment_max_pred,
            **source, **skipped, "seconds": round(seconds, 3), "scoring_seconds": round(scored - started, 3),
            "segments_per_sec": round(scorer.scored / max(scored - started, 1e-9), 1)}

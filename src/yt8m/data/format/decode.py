"""YouTube-8M records decoded without TensorFlow: video ids, labels, float features, frames and 2019 segment ratings
checked as YT8M defines them, every error naming its field; batches of records go through C first."""

from __future__ import annotations

import itertools
from typing import Callable, NamedTuple, Optional, Sequence, cast

import numpy as np

from yt8m.data.format.batch_decode import FastDecoded, PackedRecords, decode_packed, decode_packed_frames
from yt8m.data.format.example_parse import (
    KIND_NAMES,
    Features,
    describe,
    example_features,
    feature_list,
    parse_features,
    sequence_example,
    top_level,
)
from yt8m.data.format.layout import uniform_frames
from yt8m.data.format.wire import (
    ID_KEYS,
    KIND_BYTES,
    KIND_FLOAT,
    KIND_INT64,
    LABELS_KEY,
    SEGMENT_LABELS_KEY,
    SEGMENT_SCORES_KEY,
    SEGMENT_START_TIMES_KEY,
    SEQUENCE_CONTEXT,
)
from yt8m.data.format.wire_scan import RecordError

CLASSES_2018, CLASSES_2017 = 3862, 4716  # the vocabularies of the 2018 (and 2019) and the 2017 releases


def _video_id(features: Features) -> str:
    found = features.get(ID_KEYS[0]) or features.get(ID_KEYS[1])
    if found is None:
        raise RecordError("no 'id' or 'video_id' feature", "id")
    kind, values = found
    if kind != KIND_BYTES or len(values) != 1:
        raise RecordError(f"feature 'id': expected bytes_list of 1 value, found {describe(kind, values)}", "id")
    try:
        return values[0].decode()
    except UnicodeDecodeError as err:
        raise RecordError(f"feature 'id': expected UTF-8 text, found {values[0][:40]!r}", "id") from err


def _labels(features: Features, num_classes: int) -> list[int]:
    """Labels as stored (order and repeats kept); an absent `labels` feature means none."""
    found = features.get(LABELS_KEY)
    if found is None:
        return []
    kind, values = found
    if kind not in (KIND_INT64, 0):
        raise RecordError(f"feature 'labels': expected int64_list, found {describe(kind, values)}", "labels")
    if values and (min(values) < 0 or max(values) >= num_classes):
        bad = next(v for v in values if not 0 <= v < num_classes)
        hint = ""
        if num_classes == CLASSES_2018 and bad < CLASSES_2017:
            hint = f"; 2017 data has 4,716 classes (--num_classes {CLASSES_2017})"
        raise RecordError(f"feature 'labels': expected label ids in [0, {num_classes}) (num_classes), "
                          f"found {bad}{hint}", "labels")
    return values


def _float_values(features: Features, name: str, size: int) -> np.ndarray:
    """The values of a feature the record holds, checked: a float_list of `size` finite values."""
    kind, values = features[name.encode()]
    if kind != KIND_FLOAT or len(values) != size:
        raise RecordError(f"feature {name!r}: expected float_list of {size} values, found {describe(kind, values)}",
                          name)
    finite = np.isfinite(values)
    if not finite.all():
        index = int(np.argmin(finite))
        raise RecordError(f"feature {name!r}: expected finite values, found {values[index]} at index {index}", name)
    return values


def _decode_video_full(payload: bytes, feature_names: Sequence[str], feature_sizes: Sequence[int],
                       num_classes: int, out: np.ndarray) -> tuple[str, list[int]]:
    """Any valid encoding; every RecordError of video-level decoding comes from here."""
    features = example_features(payload)
    column = 0
    for name, size in zip(feature_names, feature_sizes):
        if name.encode() not in features:
            raise _missing_feature(payload, f"feature {name!r}: expected float_list of {size} values", name, False)
        out[column:column + size] = _float_values(features, name, size)
        column += size
    return _video_id(features), _labels(features, num_classes)


class LabelIds(NamedTuple):
    """The label ids of a batch of videos as stored (order and repeats kept): video i's are
    values[offsets[i]:offsets[i + 1]]. A few kilobytes where a multi-hot batch takes megabytes."""

    values: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_lists(cls, labels_list: Sequence[Sequence[int]]) -> "LabelIds":
        counts = [len(labels) for labels in labels_list]
        values = np.fromiter(itertools.chain.from_iterable(labels_list), dtype=np.int64, count=sum(counts))
        return cls(values, np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64))

    @classmethod
    def concat(cls, pieces: Sequence["LabelIds"]) -> "LabelIds":
        """The videos of `pieces`, one after another."""
        if not pieces:
            return cls(np.zeros(0, np.int64), np.zeros(1, np.int64))
        shifts = np.cumsum([0] + [len(piece.values) for piece in pieces[:-1]])
        offsets = [pieces[0].offsets[:1]] + [piece.offsets[1:] + shift for piece, shift in zip(pieces, shifts)]
        return cls(np.concatenate([piece.values for piece in pieces]), np.concatenate(offsets).astype(np.int64))

    def lists(self) -> list[list[int]]:
        bounds = self.offsets.tolist()
        return [self.values[start:end].tolist() for start, end in zip(bounds, bounds[1:])]

    def multi_hot(self, num_classes: int, out: Optional[np.ndarray] = None) -> np.ndarray:
        """bool [videos, num_classes], True at each label id (repeats count once); `out`, if given, must be
        that array zero-filled, and is filled and returned."""
        if self.values.size and (self.values.min() < 0 or self.values.max() >= num_classes):
            raise ValueError(f"label ids must lie in [0, {num_classes}), "
                             f"found {self.values.min()}..{self.values.max()}")
        counts = np.diff(self.offsets)
        if out is None:
            out = np.zeros((len(counts), num_classes), dtype=bool)
        out[np.repeat(np.arange(len(counts)), counts), self.values] = True
        return out


class VideoBatch(NamedTuple):
    """Decoded video-level records: ids, label ids as stored, float32 features [N, sum of feature sizes]."""

    video_ids: list[str]
    labels: LabelIds
    features: np.ndarray


def decode_video_batch(payloads: Sequence[bytes] | PackedRecords, feature_names: Sequence[str],
                       feature_sizes: Sequence[int], num_classes: int, out: Optional[np.ndarray] = None,
                       on_error: Optional[Callable[[RecordError], None]] = None) -> VideoBatch:
    """decode_video over many records (payloads, or PackedRecords as a reader fills them), the features written
    into `out` when given (a C-contiguous float32 array of shape [N, sum of sizes]).

    The hot path of video-level reading: the native decoder takes every well-formed record (batch_decode.py),
    the rest are decoded (or their errors raised) record by record. A RecordError raised here has
    `batch_index` set to the position of the bad payload, so the caller can name its file and offset
    with `error.at(...)`. With `on_error`, a bad record is passed to it (`batch_index` set) and left out
    instead: the batch then holds fewer videos, its features the first rows of `out`.
    """
    shape = (len(payloads), sum(feature_sizes))
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {shape}")
    packed = payloads if isinstance(payloads, PackedRecords) else PackedRecords.join(payloads)
    fast = decode_packed(packed, _wanted(feature_names, feature_sizes), num_classes, out)

    def decode_row(row: int, payload: bytes) -> tuple[str, list[int]]:
        return _decode_video_full(payload, feature_names, feature_sizes, num_classes, out[row])

    video_ids, labels, kept = _with_leftovers(packed, fast, decode_row, on_error)
    return VideoBatch(video_ids, labels, out if kept is None else _kept_rows(out, kept))


class FrameBatch(NamedTuple):
    """Decoded frame-level records: ids, label ids as stored, uint8 frames [N, frames, sum of sizes] zero-padded
    after each video's `num_frames` (int64 [N])."""

    video_ids: list[str]
    labels: LabelIds
    frames: np.ndarray
    num_frames: np.ndarray


def decode_frame_batch(payloads: PackedRecords, feature_names: Sequence[str], feature_sizes: Sequence[int],
                       num_classes: int, max_frames: int, out: np.ndarray, num_frames: np.ndarray,
                       on_error: Optional[Callable[[RecordError], None]] = None) -> FrameBatch:
    """decode_frame over many records into `out` (C-contiguous uint8 [N, F, sum of sizes], F >= max_frames): each
    video's first max_frames frames, zeros after them, with its frame count in `num_frames` (int64 [N]).

    The native decoder takes every well-formed record (no Python work per frame); the rest go through decode_frame,
    which gives the same bytes or raises the error. Errors and `on_error` as in decode_video_batch.
    """
    if out.dtype != np.uint8 or out.ndim != 3 or len(out) != len(payloads) or out.shape[1] < max_frames or \
            out.shape[2] != sum(feature_sizes) or not out.flags.c_contiguous or num_frames.shape != (len(out),):
        raise ValueError(f"out must be a C-contiguous uint8 array [{len(payloads)}, >= {max_frames}, "
                         f"{sum(feature_sizes)}] and num_frames int64 [{len(payloads)}]")
    fast = decode_packed_frames(payloads, _wanted(feature_names, feature_sizes), num_classes, max_frames, out,
                                num_frames)

    def decode_row(row: int, payload: bytes) -> tuple[str, list[int]]:
        video_id, labels, frames, count = decode_frame(payload, feature_names, feature_sizes, num_classes, max_frames)
        out[row, :count] = frames
        out[row, count:] = 0
        num_frames[row] = count
        return video_id, labels.tolist()

    video_ids, labels, kept = _with_leftovers(payloads, fast, decode_row, on_error)
    if kept is None:
        return FrameBatch(video_ids, labels, out, num_frames)
    return FrameBatch(video_ids, labels, _kept_rows(out, kept), _kept_rows(num_frames, kept))


def _wanted(feature_names: Sequence[str], feature_sizes: Sequence[int]) -> list[tuple[bytes, int, int]]:
    """(key, size, first column) per feature, for the native decoder."""
    if len(set(feature_names)) != len(feature_names):
        raise ValueError(f"feature names repeat: {list(feature_names)}")
    columns = np.cumsum([0, *feature_sizes[:-1]]).tolist()
    return [(name.encode(), size, column) for name, size, column in zip(feature_names, feature_sizes, columns)]


def _with_leftovers(packed: PackedRecords, fast: FastDecoded, decode_row: Callable[[int, bytes], tuple[str, list[int]]],
                    on_error: Optional[Callable[[RecordError], None]]
                    ) -> tuple[list[str], LabelIds, Optional[np.ndarray]]:
    """The batch's ids and labels: the native decoder's, and those of `decode_row(row, payload)` for each record it
    left (which writes the row's features). Returns the rows kept (bool) where on_error took some, else None."""
    video_ids, rows, values = fast.video_ids, fast.label_rows, fast.label_values
    leftover = np.flatnonzero(~fast.done).tolist()
    bad_rows: list[int] = []
    if leftover:
        more_rows: list[int] = []
        more_values: list[int] = []
        for row in leftover:
            try:
                video_ids[row], labels = decode_row(row, packed.payload(row))
            except RecordError as err:
                err.batch_index = row
                if on_error is None:
                    raise
                on_error(err)
                bad_rows.append(row)
                continue
            more_rows.extend([row] * len(labels))
            more_values.extend(labels)
        rows = np.concatenate([rows, np.array(more_rows, np.int64)])
        values = np.concatenate([values, np.array(more_values, np.int64)])
        order = np.argsort(rows, kind="stable")  # stable: each video's labels stay in stored order
        rows, values = rows[order], values[order]
    if not bad_rows:
        offsets = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=len(packed)))]).astype(np.int64)
        # every row has its id: the native decoder's, or decode_row's for each it left
        return cast(list[str], video_ids), LabelIds(values, offsets), None
    keep = np.ones(len(packed), bool)
    keep[bad_rows] = False
    new_rows = (np.cumsum(keep) - 1)[rows]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(new_rows, minlength=int(keep.sum())))]).astype(np.int64)
    # every row kept has its id: the native decoder's, or decode_row's for each it left
    kept_ids = [cast(str, video_id) for video_id, kept in zip(video_ids, keep.tolist()) if kept]
    return kept_ids, LabelIds(values, offsets), keep


def _kept_rows(array: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The rows of `array` where `keep`, moved up in place: the first rows of the same memory."""
    kept = int(keep.sum())
    array[:kept] = array[keep]
    return array[:kept]


def record_id_key(payload: bytes, sequence: bool) -> Optional[str]:
    """The id key a record uses: "id" (2018 and later) or "video_id" (2017), as the decoders look them up; None
    where it has neither or does not parse (its decoding says why)."""
    try:
        features = sequence_example(payload)[0] if sequence else example_features(payload)
    except RecordError:
        return None
    return next((key.decode() for key in ID_KEYS if key in features), None)


def decode_id_and_labels(payload: bytes, num_classes: int) -> tuple[str, list[int]]:
    """A record's video id and labels as stored, without its features: an Example's features and a SequenceExample's
    context are the same field, so either kind of record reads alike. Raises RecordError naming the field."""
    features = sequence_example(payload)[0]
    return _video_id(features), _labels(features, num_classes)


def decode_video(payload: bytes, feature_names: Sequence[str], feature_sizes: Sequence[int],
                 num_classes: int) -> tuple[str, np.ndarray, np.ndarray]:
    """(video id, int64 labels as stored, float32 features concatenated in `feature_names` order).

    The id comes from `id` (2018+) or `video_id` (2017); absent labels mean none. Raises RecordError
    naming the field for a missing feature, a wrong size or type, or a label id outside [0, num_classes).
    One record is parsed on its own, in Python: decode_video_batch's call into C pays off over many.
    """
    features = np.empty(sum(feature_sizes), dtype=np.float32)
    video_id, labels = _decode_video_full(payload, feature_names, feature_sizes, num_classes, features)
    return video_id, np.array(labels, dtype=np.int64), features



def _frame_bytes(name: str, data: bytes, start: int, end: int, size: int) -> np.ndarray:
    """uint8 [frames, size] of a FeatureList that must hold one `size`-byte value per frame."""
    uniform = uniform_frames(data, start, end, size)
    if uniform is not None:
        return uniform
    frames = feature_list(data, start, end)
    out = np.empty((len(frames), size), dtype=np.uint8)
    for index, (kind, values) in enumerate(frames):
        if kind != KIND_BYTES or len(values) != 1 or len(values[0]) != size:
            found = f"{len(values[0])} bytes" if kind == KIND_BYTES and len(values) == 1 else describe(kind, values)
            raise RecordError(f"feature list {name!r}, frame {index}: expected {size} bytes, found {found}", name)
        out[index] = np.frombuffer(values[0], np.uint8)
    return out


def decode_frame(payload: bytes, feature_names: Sequence[str], feature_sizes: Sequence[int], num_classes: int,
                 max_frames: int = 300) -> tuple[str, np.ndarray, np.ndarray, int]:
    """(video id, int64 labels, uint8 [T, sum of sizes], T) with T = min(frames in the video, max_frames).

    Each named feature list is read as one bytes value per frame; the lists are concatenated in order
    along the feature axis. Raises RecordError for a missing list, a frame of the wrong size, lists
    of different lengths, or a label id outside [0, num_classes).
    """
    context, lists = sequence_example(payload)
    video_id = _video_id(context)
    labels = _labels(context, num_classes)
    frames = _frame_matrix(payload, lists, feature_names, feature_sizes, max_frames)
    return video_id, np.array(labels, dtype=np.int64), frames, len(frames)


def _frame_matrix(payload: bytes, lists: dict[bytes, tuple[bytes, int, int]], feature_names: Sequence[str],
                  feature_sizes: Sequence[int], max_frames: Optional[int]) -> np.ndarray:
    """uint8 [T, sum of sizes]: the named feature lists of the record `payload` side by side, T = min(frames,
    max_frames)."""
    per_feature = []
    for name, size in zip(feature_names, feature_sizes):
        region = lists.get(name.encode())
        if region is None:
            raise _missing_feature(payload, f"feature list {name!r}: expected {size} bytes per frame", name, True)
        per_feature.append(_frame_bytes(name, *region, size))
    counts = {name: len(frames) for name, frames in zip(feature_names, per_feature)}
    if len(set(counts.values())) > 1:
        raise RecordError(f"feature lists: expected the same number of frames in each, found {counts}",
                          ",".join(feature_names))
    num_frames = next(iter(counts.values()), 0)
    num_frames = num_frames if max_frames is None else min(num_frames, max_frames)
    out = np.empty((num_frames, sum(feature_sizes)), dtype=np.uint8)
    column = 0
    for frames, size in zip(per_feature, feature_sizes):
        out[:, column:column + size] = frames[:num_frames]
        column += size
    return out


def _missing_feature(payload: bytes, expected: str, name: str, frame_level: bool) -> RecordError:
    """A wanted feature the record lacks: what the record holds, and the flags that read it."""
    context, lists = sequence_example(payload)
    floats = {key.decode(errors="backslashreplace"): len(values) for key, (kind, values) in context.items()
              if kind == KIND_FLOAT}
    frames = {key.decode(errors="backslashreplace"): _first_frame_size(*region) for key, region in lists.items()}
    if frames:
        holds = "the record is frame-level, its feature lists " + ", ".join(
            f"{key} ({size} bytes a frame)" for key, size in frames.items())
        flags = ("with " if frame_level else "with --frame_features ") + _feature_flags(frames)
    elif floats:
        holds = "the record is video-level, its features " + ", ".join(
            f"{key} ({size} floats)" for key, size in floats.items())
        flags = ("without --frame_features, with " if frame_level else "with ") + _feature_flags(floats)
    else:
        return RecordError(f"{expected}, found none (missing); the record holds no float features and no feature "
                           "lists", name)
    return RecordError(f"{expected}, found none (missing): {holds}; read it {flags}", name)


def _first_frame_size(data: bytes, start: int, end: int) -> int:
    frames = feature_list(data, start, end)
    kind, values = frames[0] if frames else (0, [])
    return len(values[0]) if kind == KIND_BYTES and len(values) == 1 else 0


def _feature_flags(sizes: dict[str, int]) -> str:
    return f"--feature_names {','.join(sizes)} --feature_sizes {','.join(map(str, sizes.values()))}"


class SegmentRatings(NamedTuple):
    """A video's 2019 segment ratings as stored, one entry per rated (segment, class) pair: the segment's first
    frame (its start time in seconds), the class rated, and the rating (1.0: the class is present, 0.0: absent)."""

    start_times: np.ndarray  # int64
    labels: np.ndarray  # int64
    scores: np.ndarray  # float32


def _segment_ratings(context: Features, num_classes: int) -> SegmentRatings:
    """The ratings of a SequenceExample's context; none where it has no segment fields. Raises RecordError for
    lists of different lengths, a class outside [0, num_classes), a rating other than 0 or 1, a negative start
    or a (segment, class) pair rated twice."""
    found = {key: context.get(key) for key in (SEGMENT_START_TIMES_KEY, SEGMENT_LABELS_KEY, SEGMENT_SCORES_KEY)}
    expected = {SEGMENT_START_TIMES_KEY: KIND_INT64, SEGMENT_LABELS_KEY: KIND_INT64, SEGMENT_SCORES_KEY: KIND_FLOAT}
    values = {}
    for key, entry in found.items():
        kind, stored = entry if entry is not None else (expected[key], [])
        if kind not in (expected[key], 0):
            raise RecordError(f"feature {key.decode()!r}: expected {KIND_NAMES[expected[key]]}, found "
                              f"{describe(kind, stored)}", key.decode())
        values[key] = stored
    lengths = {key.decode(): len(stored) for key, stored in values.items()}
    if len(set(lengths.values())) > 1:
        raise RecordError(f"segment fields: expected one entry per rated segment in each, found lengths {lengths}",
                          "segment_start_times")
    ratings = SegmentRatings(np.array(values[SEGMENT_START_TIMES_KEY], np.int64).reshape(-1),
                             np.array(values[SEGMENT_LABELS_KEY], np.int64).reshape(-1),
                             np.array(values[SEGMENT_SCORES_KEY], np.float32).reshape(-1))
    _check_ratings(ratings, num_classes)
    return _without_repeats(ratings, num_classes)


def _check_ratings(ratings: SegmentRatings, num_classes: int) -> None:
    starts, labels, scores = ratings
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        index = int(np.flatnonzero((labels < 0) | (labels >= num_classes))[0])
        raise RecordError(f"feature 'segment_labels': expected class ids in [0, {num_classes}) (num_classes), found "
                          f"{labels[index]} (segment {index}, start {starts[index]})", "segment_labels")
    bad_scores = np.flatnonzero((scores != 0) & (scores != 1))
    if len(bad_scores):
        index = int(bad_scores[0])
        raise RecordError(f"feature 'segment_scores': expected ratings 0 or 1, found {scores[index]} (segment {index}, "
                          f"start {starts[index]})", "segment_scores")
    if len(starts) and starts.min() < 0:
        index = int(np.argmin(starts))
        raise RecordError(f"feature 'segment_start_times': expected starts >= 0, found {starts[index]} (segment "
                          f"{index})", "segment_start_times")


def _without_repeats(ratings: SegmentRatings, num_classes: int) -> SegmentRatings:
    """The ratings with each (segment, class) pair once: real 2019 records rate some pairs twice alike (validate
    shards hold repeats), which count once; a pair rated both 0 and 1 is a RecordError."""
    starts, labels, scores = ratings
    pairs = starts * num_classes + labels
    if len(set(pairs.tolist())) == len(pairs):  # the common case, without np.unique's sort (a third of the decode)
        return ratings
    _, first, inverse = np.unique(pairs, return_index=True, return_inverse=True)
    conflicting = np.flatnonzero(scores != scores[first][inverse])
    if len(conflicting):
        index = int(conflicting[0])
        raise RecordError(f"segment fields: segment {index} (start {starts[index]}, class {labels[index]}) is rated "
                          "both 0 and 1", "segment_scores")
    keep = np.sort(first)
    return SegmentRatings(starts[keep], labels[keep], scores[keep])


def decode_segment_ratings(payload: bytes, num_classes: int) -> tuple[str, SegmentRatings]:
    """(video id, its segment ratings) of a 2019 segment-rated SequenceExample, frames not decoded."""
    top = top_level(payload)
    context = parse_features(*top[SEQUENCE_CONTEXT]) if SEQUENCE_CONTEXT in top else {}
    return _video_id(context), _segment_ratings(context, num_classes)


def decode_segment_video(payload: bytes, feature_names: Sequence[str], feature_sizes: Sequence[int],
                         num_classes: int, segment_size: int) -> tuple[str, np.ndarray, SegmentRatings]:
    """(video id, uint8 [T, sum of sizes] with every frame, segment ratings) of a segment-rated SequenceExample.

    Frames are not cut at max_frames: rated segments may start past frame 300. A segment
    [start, start + segment_size) that ends past the video's last frame is a RecordError naming it.
    """
    context, lists = sequence_example(payload)
    video_id = _video_id(context)
    ratings = _segment_ratings(context, num_classes)
    frames = _frame_matrix(payload, lists, feature_names, feature_sizes, None)
    beyond = np.flatnonzero(ratings.start_times + segment_size > len(frames))
    if len(beyond):
        index = int(beyond[0])
        raise RecordError(f"feature 'segment_start_times': segment {index} (start {ratings.start_times[index]}, "
                          f"class {ratings.labels[index]}) ends at frame {ratings.start_times[index] + segment_size}, "
                          f"past the video's {len(frames)} frames (--segment_size {segment_size})",
                          "segment_start_times")
    return video_id, frames, ratings


def dequantize(values: np.ndarray, max_quantized_value: float = 2.0, min_quantized_value: float = -2.0,
               out: Optional[np.ndarray] = None) -> np.ndarray:
    """uint8 quantized features back to float32 as the YT8M starter code does, with its float32 rounding:
    q * (max - min) / 255 + (max - min) / 512 + min. `out` (float32, same shape) saves a copy, e.g.
    straight into a padded batch."""
    scalar, bias = quantization_scale_bias(max_quantized_value, min_quantized_value)
    out = np.multiply(values, scalar, out=out, dtype=np.float32)
    return np.add(out, bias, out=out)


def quantization_scale_bias(max_quantized_value: float = 2.0, min_quantized_value: float = -2.0
                            ) -> tuple[np.float32, np.float32]:
    """dequantize's float32 (scale, bias): a value is q * scale + bias, rounded after each operation."""
    quantized_range = max_quantized_value - min_quantized_value
    return np.float32(quantized_range / 255.0), np.float32(quantized_range / 512.0 + min_quantized_value)

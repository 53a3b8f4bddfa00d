"""What shards hold, read as `yt8m inspect`, `score --labels` and error messages need: records as stored, as JSON or
a summary (`RecordSource`, `record_json`, `Summary`); ids and labels alone (`shard_labels`); a video (`find_video`)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence, TextIO, Union

import numpy as np

from yt8m.data.format.batch_decode import PackedRecords
from yt8m.data.format.decode import RecordError, decode_video_batch
from yt8m.data.format.example_parse import parse_record
from yt8m.data.format.tfrecord import (
    RECORDS_PER_CALL,
    CorruptRecordError,
    expand_pattern,
    read_record_chunks,
    read_records,
)
from yt8m.io.spill import Duplicate, KeyedTable, TemporaryDatabase

ID_KEYS = ("id", "video_id")
LABELS_HEADER = "VideoId,Labels"  # the ground-truth CSV's header (`yt8m score --labels`, `inspect --write_labels_csv`)
# A feature's values as parse_record stores them: a float32 or int64 array, or a list of bytes.
StoredValues = Union[np.ndarray, list[bytes]]


@dataclass
class RecordSource:
    """The records of the files matching a pattern, parsed, with the corrupt files skipped on the way."""

    paths: list[str]
    sequence: Optional[bool]
    skip_corrupt: bool
    limit: Optional[int]
    skipped_files: list[str] = field(default_factory=list)
    where: str = ""  # the file and offset of the record yielded last, for messages

    def _skipped(self, error: CorruptRecordError) -> None:
        self.skipped_files.append(error.path)

    def __iter__(self) -> Iterator[dict]:
        count = 0
        for path in self.paths:
            for offset, payload in read_records(path, self.skip_corrupt, on_corrupt=self._skipped):
                if self.limit is not None and count >= self.limit:
                    return
                self.where = f"{path}: record at byte offset {offset}"
                try:
                    yield parse_record(payload, self.sequence)
                except RecordError as err:
                    raise err.at(path, offset) from err
                count += 1


def _context(record: dict) -> dict:
    return record["features"] if record["message"] == "Example" else record["context"]


def _id_key(features: dict) -> Optional[str]:
    return next((key for key in ID_KEYS if key in features), None)


def _text(value: bytes) -> str:
    return value.decode(errors="backslashreplace")


def _values_json(values: StoredValues) -> list:
    """float32 values become Python floats holding the same number exactly, so their repr round-trips."""
    if isinstance(values, np.ndarray):
        return values.tolist()
    return [_text(value) for value in values]


def _frame_json(values: StoredValues) -> list:
    """A frame of one bytes value (YT8M: quantized uint8 features) as its list of ints."""
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], bytes):
        return list(values[0])
    return _values_json(values)


def record_labels(record: dict) -> tuple[Optional[str], list[int]]:
    """A parsed record's video id (None without one) and labels as stored."""
    context, stored_id = _context(record), _stored_id(record)
    video_id = None if stored_id is None else _text(stored_id)
    return video_id, _values_json(context["labels"]) if "labels" in context else []


def _stored_id(record: dict) -> Optional[bytes]:
    """The record's one id value (`id` or `video_id`), None where it has none or several."""
    context = _context(record)
    ids = context.get(_id_key(context), [])
    return ids[0] if len(ids) == 1 and isinstance(ids[0], bytes) else None


def record_json(record: dict) -> dict:
    """{"id", "labels" (as stored), "features": {name: values}} plus "num_frames" for a SequenceExample."""
    context = _context(record)
    id_key = _id_key(context)
    video_id, labels = record_labels(record)
    features = {name: _values_json(values) for name, values in context.items() if name not in (id_key, "labels")}
    out: dict[str, Any] = {"id": video_id, "labels": labels, "features": features}
    if record["message"] == "SequenceExample":
        lists = record["feature_lists"]
        features.update({name: [_frame_json(frame) for frame in frames] for name, frames in lists.items()})
        out["num_frames"] = max((len(frames) for frames in lists.values()), default=0)
    return out


class LabelsCsv:
    """Writes the ground-truth CSV (`VideoId,Labels`: each record's distinct labels, ascending) of the records added
    from `paths`; a record without an id, an id the CSV cannot hold, or an id in two records is a ValueError naming the
    records. The ids seen wait in a temporary SQLite file: memory does not grow with the records."""

    def __init__(self, out: TextIO, database: TemporaryDatabase, paths: Sequence[str]):
        self._out, self._ids, self._paths = out, KeyedTable(database, "videos"), paths
        self.videos = 0
        out.write(LABELS_HEADER + "\n")

    def add(self, record: dict, where: str) -> None:
        video_id, labels = record_labels(record)
        if not video_id or video_id != video_id.strip() or any(char in video_id for char in ',"\r\n'):
            raise ValueError(f"{where}: a labels CSV needs an id without commas, quotes, line breaks or outer spaces "
                             f"in each record, got {video_id!r}")
        self.videos += 1
        self._check(self._ids.add(video_id, self.videos))
        self._out.write(f"{video_id},{' '.join(map(str, sorted(set(labels))))}\n")

    def close(self) -> None:
        self._check(self._ids.flush())

    def _check(self, duplicate: Optional[Duplicate]) -> None:
        if duplicate is not None:
            found = " and ".join(find_video(self._paths, duplicate.key))
            raise ValueError(f"video {duplicate.key!r} is in two records ({found}): a labels CSV holds each video once")


def _kind(values: object) -> str:
    if isinstance(values, np.ndarray):
        return "float_list" if values.dtype == np.float32 else "int64_list"
    return "bytes_list"


@dataclass
class Summary:
    """Counts gathered over the records for the human summary."""

    records: int = 0
    messages: Counter = field(default_factory=Counter)
    id_keys: Counter = field(default_factory=Counter)
    feature_sizes: dict = field(default_factory=lambda: defaultdict(Counter))  # (name, kind) -> size counts
    frame_sizes: dict = field(default_factory=lambda: defaultdict(Counter))  # (name, kind) -> values per frame
    labels_per_video: Counter = field(default_factory=Counter)
    classes: Counter = field(default_factory=Counter)
    without_labels: int = 0
    frames: list = field(default_factory=list)

    def add(self, record: dict) -> None:
        self.records += 1
        self.messages[record["message"]] += 1
        context = _context(record)
        self.id_keys[_id_key(context) or "(none)"] += 1
        for name, values in context.items():
            self.feature_sizes[(name, _kind(values))][len(values)] += 1
        if "labels" in context:
            self.labels_per_video[len(context["labels"])] += 1
            self.classes.update(context["labels"].tolist())
        else:
            self.without_labels += 1
        if record["message"] == "SequenceExample":
            lists = record["feature_lists"]
            self.frames.append(max((len(frames) for frames in lists.values()), default=0))
            for name, frames in lists.items():
                for frame in frames:
                    size = len(frame[0]) if _kind(frame) == "bytes_list" and len(frame) == 1 else len(frame)
                    self.frame_sizes[(name, _kind(frame))][size] += 1


def _sizes(counts: Counter) -> str:
    if len(counts) == 1:
        size = next(iter(counts))
        return f"{size} value" + ("" if size == 1 else "s")
    return f"{min(counts)}..{max(counts)} values"


def summary_lines(summary: Summary, paths: Sequence[str], skipped: Sequence[str]) -> list[str]:
    lines = [f"files: {len(paths)}", f"records: {summary.records}",
             "messages: " + ", ".join(f"{name} ({count})" for name, count in summary.messages.items()),
             "id key: " + ", ".join(f"{name} ({count})" for name, count in summary.id_keys.items()),
             "features:"]
    for (name, kind), counts in sorted(summary.feature_sizes.items()):
        lines.append(f"  {name}: {kind}, {_sizes(counts)} ({sum(counts.values())} records)")
    for (name, kind), counts in sorted(summary.frame_sizes.items()):
        per_frame = _sizes(counts).replace("value", "byte") if kind == "bytes_list" else _sizes(counts)
        lines.append(f"  {name}: feature list of {kind}, {per_frame} per frame")
    videos = sum(summary.labels_per_video.values())
    total = sum(n * count for n, count in summary.labels_per_video.items())
    if videos:
        lines.append(f"labels: {total} in {videos} videos, {total / videos:.2f} per video "
                     f"(min {min(summary.labels_per_video)}, max {max(summary.labels_per_video)}), "
                     f"{len(summary.classes)} distinct classes"
                     + (f", ids {min(summary.classes)}..{max(summary.classes)}" if summary.classes else ""))
    lines.append(f"videos without a labels feature: {summary.without_labels}")
    if summary.frames:
        lines.append(f"frames per video: min {min(summary.frames)}, mean {np.mean(summary.frames):.1f}, "
                     f"max {max(summary.frames)}")
    if skipped:
        lines.append(f"corrupt files skipped after their last good record: {len(skipped)} ({', '.join(skipped)})")
    return lines


def shard_labels(pattern: str, num_classes: int) -> Iterator[tuple[str, np.ndarray]]:
    """(video id, label ids as stored) of every record of TFRecord shards (comma-separated paths or globs; video- or
    frame-level: an Example's features and a SequenceExample's context are the same field), features not read."""
    for path in expand_pattern(pattern):
        for chunk in read_record_chunks(path, RECORDS_PER_CALL):
            try:
                batch = decode_video_batch(PackedRecords(chunk.data, chunk.ends, chunk.starts), [], [], num_classes)
            except RecordError as err:
                raise err.at(path, int(chunk.offsets[err.batch_index])) from None
            bounds = batch.labels.offsets.tolist()
            for row, video_id in enumerate(batch.video_ids):
                yield video_id, batch.labels.values[bounds[row]:bounds[row + 1]]


def find_video(paths: Sequence[str], video_id: str, limit: int = 2) -> list[str]:
    """Where the records of `video_id` lie in `paths` ("FILE (record at byte N)"), at most `limit`, for error
    messages: a scan of the files, made only once something is wrong; damaged records are passed over."""
    needle, found = video_id.encode(), []
    for path in paths:
        try:
            for offset, payload in read_records(path):
                if needle in payload and _record_id(payload) == needle:
                    found.append(f"{path} (record at byte {offset})")
                    if len(found) == limit:
                        return found
        except CorruptRecordError:
            continue  # the rest of that file cannot be read
    return found


def _record_id(payload: bytes) -> Optional[bytes]:
    try:
        return _stored_id(parse_record(payload))
    except ValueError:
        return None

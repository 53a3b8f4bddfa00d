"""Scoring a 2019 segment submission (`Class,Segments`) against the rated segments of TFRecord shards or of a
label CSV (`segment_id,class,score`) with the competition's mAP@K (`score_segment_files`, `yt8m score --segment_labels`).

Per submitted class, its segment list is cut to the first K ids, ids without a rating for that class are dropped,
and the rated ones keep their order as the ranking; AP and the mean over classes are yt8m.eval.segment_metrics'. The
submission is read row by row (memory does not grow with it); the rated pairs are held in memory.
"""

from __future__ import annotations

import codecs
import itertools
import logging
import re
from typing import BinaryIO, Iterator, NamedTuple, Optional, Sequence, TextIO

import numpy as np

from yt8m.data.decode import RecordError, decode_segment_ratings
from yt8m.data.tfrecord import expand_pattern, read_records
from yt8m.io.files import write_file_atomically
from yt8m.eval.score import CsvFormatError, decoded
from yt8m.eval.segment_metrics import DEFAULT_TOP_N, average_precisions, mean_over_positive_classes
from yt8m.fields import quoted

log = logging.getLogger("yt8m.eval.score")

SUBMISSION_HEADER = "Class,Segments"
LABELS_CSV_HEADER = "segment_id,class,score"
# VIDEOID:START, START a frame number written as `%d` writes it (the starter kit's ids; 05 would never match 5).
_SEGMENT_ID = r"[^\s,:]+:(?:0|[1-9][0-9]*)"
_SEGMENT_ID_RE = re.compile(_SEGMENT_ID)
_CLASS_FIELD = re.compile(r"[ \t]*-?[0-9]+[ \t]*")
# Bytes of a submission row read at a time (a row of a million ids is some 20 MB).
_ROW_CHUNK = 1 << 20
_RATINGS = {"0": 0, "1": 1, "0.0": 0, "1.0": 1}
_EXAMPLES_SHOWN = 5
_SPACE, _COLON, _ZERO = ord(" "), ord(":"), ord("0")
_NOT_RATED = -1


class RatedSegments:
    """The rated (segment id, class) pairs: per class, segment id -> its rating (1: the class is present, 0: absent)."""

    def __init__(self, num_classes: int):
        self.num_classes = num_classes
        self.by_class: dict[int, dict[str, int]] = {}

    def add(self, segment_id: str, class_id: int, positive: int) -> Optional[int]:
        """Record a pair; returns the earlier, different rating where the pair was rated otherwise before."""
        ratings = self.by_class.setdefault(class_id, {})
        earlier = ratings.setdefault(segment_id, positive)
        return earlier if earlier != positive else None

    def num_positives(self) -> np.ndarray:
        """Positive rated pairs per class (int64 [num_classes])."""
        counts = np.zeros(self.num_classes, dtype=np.int64)
        for class_id, ratings in self.by_class.items():
            counts[class_id] = sum(ratings.values())
        return counts

    def __len__(self) -> int:
        return sum(map(len, self.by_class.values()))


def _conflict(where: str, segment_id: str, class_id: int, positive: int, earlier_place: str) -> ValueError:
    return ValueError(f"{where}: segment {segment_id} class {class_id} is rated {int(positive)} here and "
                      f"{int(not positive)} {earlier_place}")


def read_rated_segments_csv(path: str, num_classes: int) -> RatedSegments:
    """A label CSV (`segment_id,class,score`, one rated pair per line, score 0 or 1); a pair repeated alike counts
    once, a pair rated both 0 and 1 is an error naming the line."""
    with open(path, encoding="utf-8-sig") as fh:
        _check_header(fh, path, LABELS_CSV_HEADER)
        lines = fh.read().splitlines()
    return _regular_csv(lines, num_classes) or _csv_line_by_line(path, lines, num_classes)


def _regular_csv(lines: list[str], num_classes: int) -> Optional[RatedSegments]:
    """The pairs of a CSV without blank lines, errors or repeats, read column-wise (fast); None for any other."""
    fields = ",".join(lines).split(",")
    if not lines or len(fields) != 3 * len(lines) or not set(fields[2::3]) <= _RATINGS.keys():
        return None
    segment_ids = fields[0::3]
    if not _well_formed_ids(" ".join(segment_ids).encode(), len(segment_ids)):
        return None
    try:
        classes = np.array(fields[1::3]).astype(np.int64)
    except (ValueError, OverflowError):
        return None
    if classes.min() < 0 or classes.max() >= num_classes:
        return None
    order = np.argsort(classes, kind="stable")
    sorted_classes = classes[order]
    sorted_ids = np.array(segment_ids, dtype=object)[order].tolist()
    sorted_ratings = np.array(list(map(_RATINGS.__getitem__, fields[2::3])), np.int64)[order].tolist()
    bounds = (np.flatnonzero(np.diff(sorted_classes)) + 1).tolist()
    rated = RatedSegments(num_classes)
    for start, end in zip([0, *bounds], [*bounds, len(sorted_ids)]):
        in_class = dict(zip(sorted_ids[start:end], sorted_ratings[start:end]))
        if len(in_class) != end - start:
            return None  # a repeated pair: alike or conflicting, the line-by-line reading tells
        rated.by_class[int(sorted_classes[start])] = in_class
    return rated


def _csv_line_by_line(path: str, lines: list[str], num_classes: int) -> RatedSegments:
    rated = RatedSegments(num_classes)
    for number, line in enumerate(lines, start=2):
        fields = line.strip().split(",")
        if fields == [""]:
            continue
        where = f"{path}:{number}"
        if len(fields) != 3 or not _SEGMENT_ID_RE.fullmatch(fields[0]) or fields[2] not in _RATINGS:
            raise CsvFormatError(f"{where}: expected 'VIDEOID:START,class,score' with score 0 or 1, "
                                 f"got {line.strip()!r}")
        class_id = _class_id(where, fields[1], num_classes)
        positive = _RATINGS[fields[2]]
        if rated.add(fields[0], class_id, positive) is not None:
            raise _conflict(where, fields[0], class_id, positive, "on an earlier line")
    return rated


def read_rated_segments_tfrecords(pattern: str, num_classes: int) -> RatedSegments:
    """The segment ratings of every record of the shards (comma-separated paths or globs), each segment id
    `VIDEOID:START`; a pair rated alike in two records counts once, differently is an error naming the record."""
    rated = RatedSegments(num_classes)
    for path in expand_pattern(pattern):
        for offset, payload in read_records(path):
            try:
                video_id, ratings = decode_segment_ratings(payload, num_classes)
            except RecordError as err:
                raise err.at(path, offset) from None
            for start, class_id, score in zip(ratings.start_times.tolist(), ratings.labels.tolist(),
                                              ratings.scores.tolist()):
                segment_id = f"{video_id}:{start}"
                positive = int(score == 1)
                if rated.add(segment_id, class_id, positive) is not None:
                    raise _conflict(f"{path}: record at byte offset {offset}", segment_id, class_id, positive,
                                    "in an earlier record")
    return rated


def read_rated_segments(labels: str, num_classes: int) -> RatedSegments:
    """A label CSV where `labels` ends with .csv, else TFRecord shards matched by it."""
    if labels.lower().endswith(".csv"):
        return read_rated_segments_csv(labels, num_classes)
    return read_rated_segments_tfrecords(labels, num_classes)


def write_rated_segments_csv(rated: RatedSegments, path: str) -> None:
    """The label CSV `read_rated_segments_csv` reads, classes ascending (written atomically)."""
    def write(out: TextIO) -> None:
        out.write(LABELS_CSV_HEADER + "\n")
        for class_id in sorted(rated.by_class):
            out.writelines(f"{segment_id},{class_id},{int(positive)}\n"
                           for segment_id, positive in rated.by_class[class_id].items())

    write_file_atomically(path, write)


def _check_header(fh: TextIO, path: str, header: str) -> None:
    _check_header_line(fh.readline().rstrip("\r\n"), path, header)


def _check_header_line(first: str, path: str, header: str) -> None:
    if first.strip() != header:
        raise CsvFormatError(f"{path}:1: expected the header {header!r}, got {quoted(first)}")


def _class_id(where: str, field: str, num_classes: int) -> int:
    """A class field: ASCII digits (int() also reads '1_0' as 10 and Arabic-Indic digits), a minus sign allowed
    for the range error to name it."""
    if not _CLASS_FIELD.fullmatch(field):
        raise CsvFormatError(f"{where}: the class must be an integer, got {quoted(field.strip())}")
    class_id = int(field)
    if not 0 <= class_id < num_classes:
        raise CsvFormatError(f"{where}: class {class_id} is outside [0, {num_classes})")
    return class_id


def _well_formed_ids(text: bytes, count: int) -> bool:
    """Whether `text` is `count` ids VIDEOID:START joined by single spaces (the regex's rule, vectorized: a row of
    100,000 ids is checked in milliseconds)."""
    if count == 0:
        return not text
    chars = np.frombuffer(text, np.uint8)
    separators = np.flatnonzero(chars <= _SPACE)
    colons = np.flatnonzero(chars == _COLON)
    if len(separators) != count - 1 or len(colons) != count or (chars[separators] != _SPACE).any():
        return False
    starts = np.concatenate(([0], separators + 1))
    ends = np.concatenate((separators, [len(chars)]))
    if ((colons <= starts) | (colons >= ends - 1)).any():  # one colon per id, an id before it, a START after it
        return False
    start_marks = np.zeros(len(chars) + 1, np.int8)
    start_marks[colons + 1] = 1
    start_marks[ends] -= 1
    in_start = np.cumsum(start_marks[:-1], dtype=np.int8).view(bool)
    if not ((chars[in_start] - _ZERO) < 10).all():
        return False
    return not ((chars[colons + 1] == _ZERO) & (colons + 2 < ends)).any()  # no leading zero


def _check_ids(where: str, tokens: list[str]) -> None:
    """Malformed segment ids are errors naming the first."""
    if not _well_formed_ids(" ".join(tokens).encode(), len(tokens)):
        bad = next(token for token in tokens if not _SEGMENT_ID_RE.fullmatch(token))
        raise CsvFormatError(f"{where}: malformed segment id {quoted(bad)} (expected VIDEOID:START, START a frame "
                             "number without leading zeros)")


def _check_repeats(where: str, tokens: list[str]) -> None:
    if len(set(tokens)) != len(tokens):
        first_seen: dict[str, int] = {}
        for position, token in enumerate(tokens):
            if token in first_seen:
                raise CsvFormatError(f"{where}: segment {token} is listed twice (positions {first_seen[token] + 1} "
                                     f"and {position + 1})")
            first_seen[token] = position


class _Row(NamedTuple):
    """A submission row: its class, its first top_n segment ids (best first) and how many it lists."""

    class_id: int
    segment_ids: list[str]
    listed: int


def _submission_rows(path: str, num_classes: int, top_n: int) -> Iterator[_Row]:
    """The rows of a submission, checked, each read _ROW_CHUNK bytes at a time: memory holds a chunk and top_n ids
    however long a row is (ids past top_n are checked for their form, not for repeats: they are never scored)."""
    seen: dict[int, int] = {}
    with open(path, "rb") as fh:
        _check_header_line(decoded(fh.readline(_ROW_CHUNK), f"{path}:1", "utf-8-sig").rstrip("\r\n"), path,
                           SUBMISSION_HEADER)
        for number in itertools.count(2):
            chunks = _line_chunks(fh, f"{path}:{number}")
            first = next(chunks)
            if first is None:
                return
            row = _read_row(itertools.chain([first], chunks), f"{path}:{number}", num_classes, top_n)
            if row is None:
                continue  # a blank line
            if row.class_id in seen:
                raise CsvFormatError(f"{path}:{number}: class {row.class_id} is already on line {seen[row.class_id]}")
            seen[row.class_id] = number
            yield row


def _line_chunks(fh: BinaryIO, where: str) -> Iterator[Optional[str]]:
    """The next line of `fh` as text, _ROW_CHUNK bytes at a time, without its line break; a single None at the end
    of the file. A UTF-8 character cut between two chunks is decoded whole."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    while True:
        raw = fh.readline(_ROW_CHUNK)
        if not raw and not offset:
            yield None
            return
        last = raw.endswith(b"\n") or len(raw) < _ROW_CHUNK
        try:
            text = decoder.decode(raw, final=last)
        except UnicodeDecodeError as err:
            raise CsvFormatError(f"{where}: not UTF-8 text ({err.reason} near byte {offset + err.start + 1} of "
                                 "the line)") from None
        offset += len(raw)
        yield text.rstrip("\r\n") if last else text
        if last:
            return


def _read_row(chunks: Iterator[str], where: str, num_classes: int, top_n: int) -> Optional[_Row]:
    """The row whose text `chunks` hand out (None for a blank line): `Class,<space-separated VIDEOID:START ids>`."""
    head, comma, rest = "", "", ""
    for chunk in chunks:
        head, comma, rest = (head + chunk).partition(",")
        if comma or len(head) > _ROW_CHUNK:
            break
    if not comma:
        if not head.strip():
            return None
        raise CsvFormatError(f"{where}: expected 'Class,<space-separated VIDEOID:START ids>', got {quoted(head)}")
    class_id = _class_id(where, head, num_classes)
    kept: list[str] = []
    listed = 0
    for tokens in _tokens(itertools.chain([rest], chunks), where, head):
        _check_ids(where, tokens)
        kept.extend(tokens[:top_n - len(kept)])
        listed += len(tokens)
    _check_repeats(where, kept)
    return _Row(class_id, kept, listed)


def _tokens(chunks: Iterator[str], where: str, head: str) -> Iterator[list[str]]:
    """The whitespace-separated tokens of the text `chunks` hand out, a chunk's worth at a time, none cut in two."""
    carry = ""
    for chunk in chunks:
        if "," in chunk:
            raise CsvFormatError(f"{where}: expected 'Class,<space-separated VIDEOID:START ids>', got "
                                 f"{quoted(head + ',' + chunk)}")
        text = carry + chunk
        tokens = text.split()
        carry = tokens.pop() if tokens and not text[-1].isspace() else ""
        yield tokens
    if carry:
        yield [carry]


def _ranked_ratings(segment_ids: Sequence[str], ratings: dict[str, int]) -> np.ndarray:
    """The ratings of the rated ids among `segment_ids`, in their order (bool)."""
    found = np.fromiter(map(ratings.get, segment_ids, itertools.repeat(_NOT_RATED)), np.int8, len(segment_ids))
    return found[found != _NOT_RATED] == 1


def score_segment_submission(path: str, rated: RatedSegments, top_n: int = DEFAULT_TOP_N) -> dict:
    """mAP@top_n of a `Class,Segments` submission over the classes with a positive rated pair; such a class
    without a row scores 0 (with a warning), a row of a class without positives is left out of the mean."""
    if top_n < 1:
        raise ValueError(f"top_n must be positive, got {top_n}")
    num_positives = rated.num_positives()
    class_ap = np.zeros(rated.num_classes)
    submitted = np.zeros(rated.num_classes, dtype=bool)
    num_submitted = 0
    for class_id, segment_ids, listed in _submission_rows(path, rated.num_classes, top_n):
        ranked = _ranked_ratings(segment_ids, rated.by_class.get(class_id, {}))
        class_ap[class_id] = average_precisions(np.zeros(len(ranked), np.int64), ranked,
                                                num_positives[class_id:class_id + 1], top_n)[0]
        submitted[class_id] = True
        num_submitted += listed
    missing = np.flatnonzero((num_positives > 0) & ~submitted)
    if len(missing):
        shown = ", ".join(map(str, missing[:_EXAMPLES_SHOWN])) + (", ..." if len(missing) > _EXAMPLES_SHOWN else "")
        log.warning("%d classes with positive rated segments have no row in %s (%s): each scores 0",
                    len(missing), path, shown)
    return {
        "segment_map": mean_over_positive_classes(class_ap, num_positives),
        "top_n": top_n,
        "num_classes_with_positives": int((num_positives > 0).sum()),
        "num_classes_submitted": int(submitted.sum()),
        "num_classes_missing": len(missing),
        "num_rated_pairs": len(rated),
        "num_positive_pairs": int(num_positives.sum()),
        "num_submitted_segments": num_submitted,
    }


def score_segment_files(predictions_path: str, labels: str, *, top_n: int = DEFAULT_TOP_N, num_classes: int = 3862,
                        write_labels_csv: str = "") -> dict:
    """Read the rated segments (label CSV or TFRecord shards; optionally cached as a label CSV), then score the
    submission (what `yt8m score --segment_labels` prints)."""
    rated = read_rated_segments(labels, num_classes)
    if not len(rated):
        raise ValueError(f"{labels} holds no rated segments")
    if write_labels_csv:
        write_rated_segments_csv(rated, write_labels_csv)
    return score_segment_submission(predictions_path, rated, top_n)

"""Scoring a 2019 segment submission (`Class,Segments`) against the rated segments of TFRecord shards or of a
label CSV (`segment_id,class,score`) with the competition's mAP@K (`score_segment_files`, `yt8m score
--segment_labels`).

Per submitted class, its segment list is cut to the first K ids, ids without a rating for that class are dropped,
and the rated ones keep their order as the ranking; AP and the mean over classes are yt8m.eval.segment_metrics'. The
submission is read row by row (memory does not grow with it); the rated pairs are held in memory.
"""

from __future__ import annotations

import codecs
import itertools
import logging
import re
from typing import BinaryIO, Callable, Iterator, NamedTuple, Optional, Sequence, TextIO, cast

import numpy as np

from yt8m.data.format.batch_decode import PackedRecords, decode_packed_ratings
from yt8m.data.format.decode import RecordError, decode_segment_ratings
from yt8m.data.format.tfrecord import RECORDS_PER_CALL, RecordChunk, expand_pattern, read_record_chunks, read_records
from yt8m.eval.score import CsvFormatError, decoded
from yt8m.eval.segment_metrics import DEFAULT_TOP_N, average_precisions, mean_over_positive_classes
from yt8m.fields import quoted
from yt8m.io.files import write_file_atomically

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
_SPACE, _COLON, _ZERO, _COMMA, _POINT, _NEWLINE = (ord(char) for char in " :0,.\n")
_BOM = "\ufeff".encode()
_MAX_START_DIGITS = 15  # a START of more digits is read by the line-by-line path, which has the errors
_NOT_RATED = -1
# A submission none of whose rows' first ids is of a rated video is of other videos (another split): an error.
_VIDEOS_LOOKED_UP = 1000


class RatedSegments:
    """The rated (segment id, class) pairs in arrays sorted by pair: `videos` the distinct video ids (bytes, sorted),
    and per pair its class, video (index into `videos`), segment start and rating (True: the class is present).

    Arrays, not dicts keyed by id strings: 12 bytes or so a pair where a dict entry took a hundred, built by sorts
    (bench/bench_segment_score.py: the pairs read at over 1M a second, against 374k into dicts)."""

    def __init__(self, num_classes: int, videos: np.ndarray, classes: np.ndarray, video_index: np.ndarray,
                 starts: np.ndarray, ratings: np.ndarray):
        self.num_classes, self.videos = num_classes, videos
        self.classes, self.video_index, self.starts, self.ratings = classes, video_index, starts, ratings
        self._names: Optional[list[str]] = None

    @classmethod
    def from_pairs(cls, num_classes: int, videos: np.ndarray, classes: np.ndarray, starts: np.ndarray,
                   ratings: np.ndarray, conflict: Callable[[int, int], Exception]) -> "RatedSegments":
        """The pairs given in reading order (video ids as bytes, one per pair); a pair given twice alike counts once,
        rated both ways raises `conflict(earlier index, later index)`."""
        distinct, video_index = np.unique(videos, return_inverse=True)
        video_index = video_index.reshape(-1)
        # one int64 per pair, ordered as (class, video, start)
        keys = np.ravel_multi_index((classes, video_index, starts),
                                    (num_classes, max(1, len(distinct)), int(starts.max(initial=0)) + 1))
        order = np.argsort(keys, kind="stable")  # stable: a repeated pair's occurrences stay in reading order
        repeated = keys[order[1:]] == keys[order[:-1]]
        conflicting = np.flatnonzero(repeated & (ratings[order[1:]] != ratings[order[:-1]]))
        if len(conflicting):
            first = conflicting[np.argmin(order[conflicting + 1])]  # the conflict met first in reading order
            raise conflict(int(order[first]), int(order[first + 1]))
        kept = order[np.concatenate([[True], ~repeated])] if len(order) else order
        return cls(num_classes, distinct, classes[kept], video_index[kept], starts[kept], ratings[kept])

    def segment_id(self, pair: int) -> str:
        return f"{self.video_names()[self.video_index[pair]]}:{self.starts[pair]}"

    def num_positives(self) -> np.ndarray:
        """Positive rated pairs per class (int64 [num_classes])."""
        return np.bincount(self.classes[self.ratings], minlength=self.num_classes).astype(np.int64)

    def __len__(self) -> int:
        return len(self.classes)

    def ratings_of(self, class_id: int, segment_ids: Sequence[str]) -> np.ndarray:
        """The rating of each id for `class_id` (int8: 1 present, 0 absent, -1 not rated)."""
        ratings = self.class_ratings(class_id)
        return np.fromiter(map(ratings.get, segment_ids, itertools.repeat(_NOT_RATED)), np.int8, len(segment_ids))

    def class_ratings(self, class_id: int) -> dict[str, bool]:
        """{segment id: rating} of one class, made when asked (the class's pairs lie together: a few hundred, where
        the whole store is a million): ids are looked up by a dict's hashing, 30 ns an id, which numpy searches of
        the parsed ids did not match (220 ns)."""
        first, end = np.searchsorted(self.classes, [class_id, class_id + 1])
        names = self.video_names()
        segment_ids = (f"{names[video]}:{start}" for video, start in
                       zip(self.video_index[first:end].tolist(), self.starts[first:end].tolist()))
        return dict(zip(segment_ids, self.ratings[first:end].tolist()))

    def video_names(self) -> list[str]:
        """The rated videos' ids, as `videos` holds them."""
        if self._names is None:
            self._names = [video.decode(errors="backslashreplace") for video in self.videos.tolist()]
        return self._names


def _fixed_width(chars: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """bytes of chars[starts[i]:starts[i] + sizes[i]] as one fixed-width numpy bytes array (NUL-padded)."""
    width = max(1, int(sizes.max(initial=0)))
    positions = starts[:, None] + np.arange(width)
    inside = np.arange(width) < sizes[:, None]
    gathered = np.where(inside, chars[np.minimum(positions, max(len(chars) - 1, 0))], 0).astype(np.uint8)
    return np.ascontiguousarray(gathered).view(f"S{width}").reshape(-1)


def _segment_id_parts(chars: np.ndarray, starts: np.ndarray, ends: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(video ids as bytes, starts, well-formed) of the ids chars[starts[i]:ends[i]] (back to back, in order),
    vectorized: a million ids in a fraction of a second. Well formed: VIDEOID:START with one colon, a START of
    digits without a leading zero."""
    is_colon = chars == _COLON
    colons_before = np.concatenate(([0], np.cumsum(is_colon)))
    colon_count = colons_before[ends] - colons_before[starts]
    colons = np.flatnonzero(is_colon)
    # an id's first colon: the colons before it counted, as every id's bounds are in order
    colon = colons[np.minimum(colons_before[starts], max(len(colons) - 1, 0))] if len(colons) else starts
    digits = ends - colon - 1
    well_formed = (colon_count == 1) & (colon > starts) & (digits >= 1) & (digits <= _MAX_START_DIGITS)
    last = max(len(chars) - 1, 0)
    well_formed &= ~((digits > 1) & (chars[np.minimum(colon + 1, last)] == _ZERO))
    values = np.zeros(len(starts), np.int64)
    for place in range(int(digits[well_formed].max(initial=0))):
        inside = place < digits
        digit = chars[np.minimum(colon + 1 + place, last)].astype(np.int64) - _ZERO
        well_formed &= ~inside | ((digit >= 0) & (digit <= 9))
        values = np.where(inside, values * 10 + digit, values)
    videos = _fixed_width(chars, starts, np.where(well_formed, colon - starts, 0))
    return videos, np.where(well_formed, values, 0), well_formed


def _conflict(where: str, segment_id: str, class_id: int, positive: int, earlier_place: str) -> ValueError:
    return ValueError(f"{where}: segment {segment_id} class {class_id} is rated {int(positive)} here and "
                      f"{int(not positive)} {earlier_place}")


def read_rated_segments_csv(path: str, num_classes: int) -> RatedSegments:
    """A label CSV (`segment_id,class,score`, one rated pair per line, score 0 or 1); a pair repeated alike counts
    once, a pair rated both 0 and 1 is an error naming the line."""
    with open(path, "rb") as fh:
        data = fh.read()
    data = data[len(_BOM):] if data.startswith(_BOM) else data
    header, _, body = data.partition(b"\n")
    if header.decode("utf-8", "replace").rstrip("\r").strip() != LABELS_CSV_HEADER:
        raise CsvFormatError(f"{path}:1: expected the header {LABELS_CSV_HEADER!r}, got "
                             f"{header.decode('utf-8', 'replace').rstrip(chr(13))!r}")
    rated = _regular_csv(path, body, num_classes)
    return rated if rated is not None else _csv_line_by_line(path, body.decode("utf-8").splitlines(), num_classes)


def _regular_csv(path: str, body: bytes, num_classes: int) -> Optional[RatedSegments]:
    """The pairs of a CSV body of ASCII lines `VIDEOID:START,class,score` (score 0, 1, 0.0 or 1.0), without blank
    lines, read column-wise from its bytes; None for any other (the line-by-line reading tells what is wrong)."""
    chars = np.frombuffer(body, np.uint8)
    # ASCII without spaces, tabs or carriage returns: what the regex's \\s would take apart is left to it
    if not len(chars) or (chars >= 0x80).any() or ((chars <= _SPACE) & (chars != _NEWLINE)).any():
        return None
    line_ends = np.flatnonzero(chars == _NEWLINE)
    if not len(line_ends) or line_ends[-1] != len(chars) - 1:
        line_ends = np.append(line_ends, len(chars))
    line_starts = np.concatenate(([0], line_ends[:-1] + 1))
    commas = np.flatnonzero(chars == _COMMA)
    two_per_line = 2 * np.arange(1, len(line_ends) + 1)
    if len(commas) != 2 * len(line_ends) or (np.searchsorted(commas, line_ends) != two_per_line).any():
        return None
    first, second = commas[0::2], commas[1::2]
    if (first <= line_starts).any() or (second <= first + 1).any():
        return None
    videos, starts, well_formed = _segment_id_parts(chars, line_starts, first)
    if not well_formed.all():
        return None
    classes = _small_ints(chars, first + 1, second)
    ratings = _csv_ratings(chars, second + 1, line_ends)
    if classes is None or ratings is None or (classes >= num_classes).any():
        return None

    def conflict(earlier: int, later: int) -> ValueError:
        segment_id = f"{videos[later].decode()}:{starts[later]}"
        return _conflict(f"{path}:{later + 2}", segment_id, int(classes[later]), int(ratings[later]),
                         "on an earlier line")

    return RatedSegments.from_pairs(num_classes, videos, classes, starts, ratings, conflict)


def _small_ints(chars: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Optional[np.ndarray]:
    """The non-negative decimal integers chars[starts[i]:ends[i]] (at most 9 digits); None if one is not."""
    digits = ends - starts
    if (digits < 1).any() or (digits > 9).any():
        return None
    values = np.zeros(len(starts), np.int64)
    for place in range(int(digits.max(initial=0))):
        inside = place < digits
        digit = chars[np.minimum(starts + place, len(chars) - 1)].astype(np.int64) - _ZERO
        if (inside & ((digit < 0) | (digit > 9))).any():
            return None
        values = np.where(inside, values * 10 + digit, values)
    return values


def _csv_ratings(chars: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Optional[np.ndarray]:
    """The ratings chars[starts[i]:ends[i]] (0, 1, 0.0 or 1.0) as bool; None if one is not a rating."""
    sizes = ends - starts
    first = chars[np.minimum(starts, len(chars) - 1)]
    point = chars[np.minimum(starts + 1, len(chars) - 1)]
    zero = chars[np.minimum(starts + 2, len(chars) - 1)]
    digit = (first == _ZERO) | (first == _ZERO + 1)
    if not (digit & ((sizes == 1) | ((sizes == 3) & (point == _POINT) & (zero == _ZERO)))).all():
        return None
    return first == _ZERO + 1


def _csv_line_by_line(path: str, lines: list[str], num_classes: int) -> RatedSegments:
    segment_ids, classes, ratings, line_numbers = [], [], [], []
    for number, line in enumerate(lines, start=2):
        fields = line.strip().split(",")
        if fields == [""]:
            continue
        where = f"{path}:{number}"
        if len(fields) != 3 or not _SEGMENT_ID_RE.fullmatch(fields[0]) or fields[2] not in _RATINGS:
            raise CsvFormatError(f"{where}: expected 'VIDEOID:START,class,score' with score 0 or 1, "
                                 f"got {line.strip()!r}")
        classes.append(_class_id(where, fields[1], num_classes))
        segment_ids.append(fields[0])
        ratings.append(_RATINGS[fields[2]])
        line_numbers.append(number)
    parts = [segment_id.rpartition(":") for segment_id in segment_ids]
    videos, _, starts = zip(*parts) if parts else ((), (), ())
    classes_array, ratings_array = np.array(classes, np.int64), np.array(ratings, bool)

    def conflict(earlier: int, later: int) -> ValueError:
        return _conflict(f"{path}:{line_numbers[later]}", segment_ids[later], classes[later], ratings[later],
                         "on an earlier line")

    return RatedSegments.from_pairs(num_classes, np.array([video.encode() for video in videos], "S"), classes_array,
                                    np.array(starts, np.int64), ratings_array, conflict)


def read_rated_segments_tfrecords(pattern: str, num_classes: int) -> RatedSegments:
    """The segment ratings of every record of the shards (comma-separated paths or globs), each segment id
    `VIDEOID:START`; a pair rated alike in two records counts once, differently is an error naming the record.
    Records are framed and their ratings decoded in C (frames not read), whole buffers at a time."""
    records = _RatingRecords(num_classes)
    for path in expand_pattern(pattern):
        for chunk in read_record_chunks(path, RECORDS_PER_CALL):
            records.add(path, chunk)
    return records.rated()


def _no_conflict(earlier: int, later: int) -> Exception:
    """The conflict of a set of no pairs, which has none."""
    return AssertionError(f"pairs {earlier} and {later} of an empty set")


class _RatingRecords:
    """The ratings of records read so far, in reading order: per record its file, offset and video id (bytes); per
    pair its record, start, class and rating."""

    def __init__(self, num_classes: int):
        self.num_classes = num_classes
        self.sources: list[tuple[str, int]] = []
        self.videos: list[np.ndarray] = []
        self.pairs: list[tuple[np.ndarray, ...]] = []

    def add(self, path: str, chunk: RecordChunk) -> None:
        packed = PackedRecords(chunk.data, chunk.ends, chunk.starts)
        decoded = decode_packed_ratings(packed, self.num_classes)
        first = len(self.sources)
        offsets = chunk.offsets.tolist()
        self.sources.extend((path, offset) for offset in offsets)
        video_ids = list(decoded.video_ids)
        rows, starts, classes, ratings = [decoded.rows], [decoded.starts], [decoded.classes], [decoded.ratings]
        for row in np.flatnonzero(~decoded.done).tolist():  # anything unusual: the Python decoder, which has the errors
            try:
                video_ids[row], found = decode_segment_ratings(packed.payload(row), self.num_classes)
            except RecordError as err:
                raise err.at(path, offsets[row]) from None
            rows.append(np.full(len(found.labels), row))
            starts.append(found.start_times)
            classes.append(found.labels)
            ratings.append((found.scores == 1).astype(np.int64))
        # every row has its id: the native decoder's, or decode_segment_ratings' for each it left (or it raised)
        self.videos.append(np.array([video_id.encode() for video_id in cast(list[str], video_ids)], "S"))
        self.pairs.append((np.concatenate(rows) + first, *map(np.concatenate, (starts, classes, ratings))))

    def rated(self) -> RatedSegments:
        if not self.pairs:
            return RatedSegments.from_pairs(self.num_classes, np.zeros(0, "S1"), *(np.zeros(0, np.int64),) * 2,
                                            np.zeros(0, bool), _no_conflict)
        records, starts, classes, ratings = (np.concatenate(column) for column in zip(*self.pairs))
        videos = np.concatenate(self.videos)

        def conflict(earlier: int, later: int) -> Exception:
            path, offset = self.sources[records[later]]
            if records[earlier] == records[later]:  # rated both ways in one record: its decoder's error
                return self._record_error(records[later])
            segment_id = f"{videos[records[later]].decode(errors='backslashreplace')}:{starts[later]}"
            return _conflict(f"{path}: record at byte offset {offset}", segment_id, int(classes[later]),
                             int(ratings[later]), "in an earlier record")

        return RatedSegments.from_pairs(self.num_classes, videos[records], classes, starts, ratings.astype(bool),
                                        conflict)

    def _record_error(self, record: int) -> Exception:
        path, offset = self.sources[record]
        for found_offset, payload in read_records(path):
            if found_offset == offset:
                try:
                    decode_segment_ratings(payload, self.num_classes)
                except RecordError as err:
                    return err.at(path, offset)
        raise AssertionError(f"{path}: record at byte offset {offset} decoded without the error it holds")


def read_rated_segments(labels: str, num_classes: int) -> RatedSegments:
    """A label CSV where `labels` ends with .csv, else TFRecord shards matched by it."""
    if labels.lower().endswith(".csv"):
        return read_rated_segments_csv(labels, num_classes)
    return read_rated_segments_tfrecords(labels, num_classes)


def write_rated_segments_csv(rated: RatedSegments, path: str) -> None:
    """The label CSV `read_rated_segments_csv` reads, classes ascending (written atomically)."""
    def write(out: TextIO) -> None:
        out.write(LABELS_CSV_HEADER + "\n")
        out.writelines(f"{rated.segment_id(pair)},{class_id},{int(positive)}\n"
                       for pair, (class_id, positive) in enumerate(zip(rated.classes.tolist(), rated.ratings.tolist())))

    write_file_atomically(path, write)


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
            rest = (chunk for chunk in chunks if chunk is not None)  # a None ends the file, never a line
            row = _read_row(itertools.chain([first], rest), f"{path}:{number}", num_classes, top_n)
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


def _ranked_ratings(found: np.ndarray) -> np.ndarray:
    """The ratings of the rated ids among a row's (int8, -1 where not rated), in their order (bool)."""
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
    rated_videos, seen_rated_video = set(rated.video_names()), False
    for class_id, segment_ids, listed in _submission_rows(path, rated.num_classes, top_n):
        ranked = _ranked_ratings(rated.ratings_of(class_id, segment_ids))
        class_ap[class_id] = average_precisions(np.zeros(len(ranked), np.int64), ranked,
                                                num_positives[class_id:class_id + 1], top_n)[0]
        submitted[class_id] = True
        num_submitted += listed
        seen_rated_video = seen_rated_video or any(segment_id.rpartition(":")[0] in rated_videos
                                                   for segment_id in segment_ids[:_VIDEOS_LOOKED_UP])
    if num_submitted and not seen_rated_video:
        raise ValueError(f"no video of {path} has rated segments in the labels: its segments are of other videos "
                         "(the test split's, while the ratings are the validate split's?) and would score 0; predict "
                         "the rated split's segments to score them")
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

"""A reader's records through its shuffle buffer, and where it stands in them: the buffer's fill, the blocks of
records it drew slots for and the records each share gave so far say which records the buffer holds (replayed from
the seeded random stream, without their bytes), so that a resume reads only those, from the shards they lie in, and
goes on from the next record as the uninterrupted reader would have."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple, Optional, Sequence

import numpy as np

# A shuffle buffer of 10k frame-level records would hold gigabytes per reader; payload bytes cap it too, and the
# block of records read ahead of their random draws is inside the cap: the buffer fills to at most the cap less a
# block's room (a tenth), a block holds RANDOM_BLOCK records or that room's bytes, whichever comes first. Video-level
# buffers (10k records, ~50 MB) never reach either limit: their order is that of a buffer without one.
SHUFFLE_BUFFER_MAX_BYTES = 512 << 20
BLOCK_SHARE = 10
RANDOM_BLOCK = 4096


class Record(NamedTuple):
    """A record read one at a time (shuffled, or a 2019 segment record): its file, byte offset and payload.

    The layout of the plain tuples ShardReader builds, read by unpacking: a Record made per record costs a Python
    frame, 0.35-0.40 us against 0.12 us for the tuple (0.05 us for the (path, (offset, payload)) pair of before), about
    4% of shuffled video-level reading's 8.3 us a record (2-vCPU AMD EPYC)."""

    path: str
    offset: int
    payload: bytes


@dataclass(frozen=True)
class StreamPosition:
    """A shuffling reader after one of its batches: `reader` (rank x workers + worker), the records it `emitted`,
    its buffer's `fill`, the length of each block it drew slots for, and the records each of its shares gave
    (`share_records`: the last share's so far)."""

    reader: int
    emitted: int
    fill: int
    blocks: tuple[int, ...]
    share_records: tuple[int, ...]


class ShuffleBuffer:
    """A bounded shuffle buffer (TensorFlow's `shuffle`): each record leaves for a random one held back, the buffer
    and the block read ahead of its draws within SHUFFLE_BUFFER_MAX_BYTES. It counts what a StreamPosition needs:
    the records emitted, the fill, the blocks."""

    def __init__(self, capacity: int, rng: np.random.Generator):
        self.capacity, self.rng = capacity, rng
        self.emitted, self.fill = 0, 0
        self.blocks: list[int] = []
        self.room = SHUFFLE_BUFFER_MAX_BYTES // BLOCK_SHARE

    def shuffled(self, records: Iterator[Record]) -> Iterator[Record]:
        buffer: list[Record] = []
        held_bytes = 0
        for record in records:
            buffer.append(record)
            held_bytes += len(record[2])
            if len(buffer) >= self.capacity or held_bytes >= SHUFFLE_BUFFER_MAX_BYTES - self.room:
                break
        self.fill = len(buffer)
        yield from self._go_on(buffer, [], [], records)

    def restore(self, position: StreamPosition) -> None:
        """Take up the counts of a position a resume starts from (its random stream replayed to there)."""
        self.emitted, self.fill, self.blocks = position.emitted, position.fill, list(position.blocks)

    def resumed(self, buffer: list[Record], pending: list[Record], slots: list[int], records: Iterator[Record],
                drain: Optional[list[int]]) -> Iterator[Record]:
        """The rest of a buffer a resume rebuilt (from a ResumePoint): the block being drawn for (its records to come
        and their slots), then the blocks still to read; or what is left of the final drain."""
        if drain is not None:
            yield from self._emit(buffer[slot] for slot in drain)
            return
        yield from self._go_on(buffer, pending, slots, records)

    def _go_on(self, buffer: list[Record], pending: list[Record], slots: list[int],
               records: Iterator[Record]) -> Iterator[Record]:
        for record, slot in zip(pending, slots):
            self.emitted += 1
            yield buffer[slot]
            buffer[slot] = record
        for block in iter(lambda: _block(records, self.room), []):
            self.blocks.append(len(block))
            for record, slot in zip(block, self.rng.integers(0, self.fill, len(block)).tolist()):
                self.emitted += 1
                yield buffer[slot]
                buffer[slot] = record
        yield from self._emit(buffer[slot] for slot in self.rng.permutation(self.fill).tolist())

    def _emit(self, records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            self.emitted += 1
            yield record


def _block(records: Iterator[Record], room: int) -> list[Record]:
    """The next records to draw slots for: RANDOM_BLOCK of them, or fewer where their payloads pass `room` bytes
    (one at least)."""
    block: list[Record] = []
    held = 0
    for record in itertools.islice(records, RANDOM_BLOCK):
        block.append(record)
        held += len(record[2])
        if held >= room:
            break
    return block


@dataclass
class ResumePoint:
    """A StreamPosition replayed: which stream records (by index: the reader's g-th record of the epoch) the buffer
    holds slot by slot, the records and slots of the block it was drawing for, or what was left of its drain, and the
    index of the next record to read. The random stream is where the position left it."""

    buffer: list[int]
    pending: list[int]
    slots: list[int]
    drain: Optional[list[int]]
    next_record: int


def replayed(position: StreamPosition, rng: np.random.Generator) -> ResumePoint:
    """Replay a position's draws on `rng` (the reader's fresh random stream of the epoch), without any record."""
    buffer, emitted, read = list(range(position.fill)), 0, position.fill
    for length in position.blocks:
        slots = rng.integers(0, position.fill, length).tolist()
        taken = min(length, position.emitted - emitted)
        for index, slot in enumerate(slots[:taken]):
            buffer[slot] = read + index
        emitted, read = emitted + taken, read + length
        if taken < length:
            return ResumePoint(buffer, list(range(read - length + taken, read)), slots[taken:], None, read)
    if emitted < position.emitted:  # into the final drain
        order = rng.permutation(position.fill).tolist()
        return ResumePoint(buffer, [], [], order[position.emitted - emitted:], read)
    return ResumePoint(buffer, [], [], None, read)


def share_starts(share_records: Sequence[int]) -> list[int]:
    """The stream index of each share's first record."""
    return [0, *itertools.accumulate(share_records)][:len(share_records)]


def share_of(record: int, starts: Sequence[int]) -> tuple[int, int]:
    """(share index, record within the share) of the stream's record `record`, the shares starting at `starts`."""
    share = bisect.bisect_right(starts, record) - 1
    return share, record - starts[share]


ShareRecords = Callable[[int], Iterator[Record]]  # a share's records, by its index, as the reader's stream takes them


class ShuffledStream:
    """The records of a reader's shares through a ShuffleBuffer, counting the records each share gave: from the start
    of the epoch, or from `resume` (a StreamPosition in it), where the records the buffer held and those of the block
    it was drawing for are read from the shares they lie in, and the stream goes on from its next record.
    `read_order` says which shares it reads, in turn (what a reader fetches ahead)."""

    def __init__(self, shares: int, buffer: ShuffleBuffer, resume: Optional[StreamPosition] = None):
        self.buffer, self.shares = buffer, shares
        self.share_records = [0] * shares
        self.resume = resume if resume is not None and resume.share_records else None
        self.point = replayed(self.resume, buffer.rng) if self.resume is not None else None
        self.wanted: dict[int, list[int]] = {}  # share -> its records (within it) the resumed buffer holds
        if self.resume is not None and self.point is not None:
            starts = share_starts(self.resume.share_records)
            for record in set(self.point.buffer) | set(self.point.pending):
                share, index = share_of(record, starts)
                self.wanted.setdefault(share, []).append(index)

    def read_order(self) -> list[int]:
        """The shares' indexes in the order the stream reads them: every one from the start, or a resume's (those its
        buffer's records lie in, then the one it goes on in and the rest)."""
        if self.resume is None:
            return list(range(self.shares))
        last = len(self.resume.share_records) - 1
        return sorted(set(self.wanted) - {last}) + list(range(last, self.shares))

    def position(self, reader: int) -> StreamPosition:
        touched = max((index + 1 for index, count in enumerate(self.share_records) if count), default=0)
        return StreamPosition(reader, self.buffer.emitted, self.buffer.fill, tuple(self.buffer.blocks),
                              tuple(self.share_records[:touched]))

    def records(self, read: ShareRecords) -> Iterator[Record]:
        """The stream's records, `read(index)` giving a share's."""
        if self.resume is None:
            return self.buffer.shuffled(self._from_share(read, 0))
        return self._resumed(read, self.resume)

    def _from_share(self, read: ShareRecords, first: int) -> Iterator[Record]:
        return itertools.chain.from_iterable(self._counting(index, read(index))
                                             for index in range(first, self.shares))

    def _counting(self, index: int, records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            self.share_records[index] += 1
            yield record

    def _resumed(self, read: ShareRecords, position: StreamPosition) -> Iterator[Record]:
        assert self.point is not None  # replayed with the resume
        point, counts = self.point, position.share_records
        starts, last = share_starts(counts), len(counts) - 1
        found: dict[int, Record] = {}
        for share in sorted(set(self.wanted) - {last}):
            found.update(_taken(starts[share], self.wanted[share], read(share)))
        rest = read(last)  # the share the stream goes on in, read up to where it stood
        found.update(_taken(starts[last], self.wanted.get(last, []), rest, counts[last]))
        self.share_records[:last + 1] = counts
        self.buffer.restore(position)
        tail = itertools.chain(self._counting(last, rest), self._from_share(read, last + 1))
        return self.buffer.resumed([found[record] for record in point.buffer],
                                   [found[record] for record in point.pending], point.slots, tail, point.drain)


def _taken(first: int, indexes: list[int], records: Iterator[Record], skip: Optional[int] = None
           ) -> dict[int, Record]:
    """The records at `indexes` of a share (whose first record is the stream's `first`), by stream index, read as far
    as the last of them; with `skip`, exactly `skip` records (the iterator then stands after them)."""
    wanted, found = set(indexes), {}
    end = skip if skip is not None else max(indexes, default=-1) + 1
    for index, record in enumerate(itertools.islice(records, end)):
        if index in wanted:
            found[first + index] = record
    return found

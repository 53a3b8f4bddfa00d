"""A shuffling reader's position and its resumption: from any position, the resumed stream gives exactly the records the
uninterrupted one gives after it, reading only the shares that hold the buffer's records and the one it goes on in;
the buffer and its read-ahead block stay within their byte cap."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from yt8m.data.reading import shuffle_stream
from yt8m.data.reading.shuffle_stream import ShuffleBuffer, ShuffledStream


def shares_of(sizes: list[int], payload: int = 8) -> list[list[tuple]]:
    return [[(f"share{index}", offset, bytes(payload)) for offset in range(size)] for index, size in enumerate(sizes)]


class Stream:
    """A ShuffledStream over in-test shares, noting the shares it opens."""

    def __init__(self, shares: list[list[tuple]], capacity: int, seed: int, resume=None):
        self.shares, self.opened = shares, []
        self.stream = ShuffledStream(len(shares), ShuffleBuffer(capacity, np.random.default_rng(seed)), resume)

    def records(self):
        return self.stream.records(self.read)

    def read(self, index: int):
        self.opened.append(index)
        return iter(self.shares[index])

    def position(self, reader: int):
        return self.stream.position(reader)


@pytest.mark.parametrize("sizes, capacity", [([5, 0, 9, 3, 12, 1, 7], 6), ([40], 100), ([3] * 30, 25),
                                             ([1, 2, 3, 4, 5, 6, 7, 8], 1)])
def test_a_stream_resumed_at_any_position_goes_on_as_the_uninterrupted_one(sizes, capacity, monkeypatch):
    monkeypatch.setattr(shuffle_stream, "RANDOM_BLOCK", 4)  # several blocks, one cut short by the stream's end
    shares = shares_of(sizes)
    whole = Stream(shares, capacity, 7)
    records, positions = [], []
    for record in whole.records():
        records.append(record)
        positions.append(whole.position(reader=0))
    assert sorted(records) == sorted(itertools.chain.from_iterable(shares))  # each record once
    for position in positions[:-1]:
        resumed = Stream(shares, capacity, 7, position)
        assert list(resumed.records()) == records[position.emitted:], position
        # the shares the buffer's records lie in, and the one the stream goes on in, each once, in its read order
        assert resumed.opened == resumed.stream.read_order()


def test_a_resume_late_in_a_long_stream_reads_the_buffers_shares_not_the_epoch():
    shares = shares_of([100] * 200)  # 20,000 records; a buffer of 500
    whole = Stream(shares, 500, 3)
    iterator = whole.records()
    done = list(itertools.islice(iterator, 18_000))  # 90% of the epoch
    position = whole.position(reader=0)
    stream = Stream(shares, 500, 3, position)
    resumed = stream.records()
    first = next(resumed)
    opened = stream.opened
    assert first == next(iterator) and len(done) == position.emitted
    # the shares the buffer's records came from (its window: a record lingers about buffer x ln(buffer) records,
    # ~31 shares here) and the one it goes on in, of the 181 read so far
    window = {share for share, count in enumerate(position.share_records[:-1]) if count} & set(opened)
    assert len(opened) == len(window) + 1 and len(opened) < 181 // 3
    assert list(resumed) == list(iterator)


def test_the_buffer_and_its_block_keep_within_the_byte_cap(monkeypatch):
    monkeypatch.setattr(shuffle_stream, "SHUFFLE_BUFFER_MAX_BYTES", 10_000)
    shares = shares_of([300], payload=100)  # 30 kB of records, 10 kB of cap
    buffer = ShuffleBuffer(10_000, np.random.default_rng(0))
    held: list[int] = []
    records = iter(shares[0])

    def watched():
        for record in records:
            held.append(1)
            yield record

    for emitted, _ in enumerate(buffer.shuffled(watched()), start=1):
        assert (len(held) - emitted) * 100 <= 10_000 + 100  # read and not yet emitted: within the cap
    assert buffer.fill == 90 and buffer.blocks[0] == 10  # 9 kB of buffer, a block of 1 kB

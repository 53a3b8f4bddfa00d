"""One reader's batches from its shares of the shards: in file order decoded chunk by chunk where the reader's buffer
holds them, or record by record through a bounded shuffle buffer (and always so for 2019 segments)."""

from __future__ import annotations

import functools
import inspect
import itertools
from typing import Callable, Generator, Iterator, Optional, cast

import numpy as np

from yt8m.data.format.batch_decode import PackedRecords
from yt8m.data.format.decode import decode_segment_video
from yt8m.data.format.tfrecord import RecordChunk, read_record_chunks, read_records
from yt8m.data.format.wire_scan import RecordError
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.batch_build import (
    RECORD_OVERHEAD_BYTES,
    BatchBuilder,
    DecodedSegment,
    batch_builder,
    segment_batch,
    segment_examples,
)
from yt8m.data.reading.batch_memory import BatchMemory
from yt8m.data.reading.fetch_ahead import ShardFetcher
from yt8m.data.reading.read_plan import ReaderShare, ReadOptions
from yt8m.data.reading.read_stats import ReadCounter
from yt8m.data.reading.shuffle_stream import Record, ShuffleBuffer, ShuffledStream, StreamPosition
from yt8m.data.reading.spec import FeatureSpec


def _record_pieces(records: Iterator[Record]) -> Iterator[tuple[PackedRecords, list]]:
    """Each record as a piece of its own, decoded where its payload lies (frame-level records are large: a call per
    record costs little next to copying them together first)."""
    for path, offset, payload in records:
        yield PackedRecords(np.frombuffer(payload, np.uint8), [len(payload)]), [(path, offset)]


def _packed_chunks(records: Iterator[Record], room: Callable[[], int]) -> Iterator[tuple[PackedRecords, list]]:
    """Pieces of batches of records (shuffled ones), `room()` records each, each payload copied once into one array.

    The array is reused: each batch is valid only until the next is asked for (the caller decodes it first).
    Reuse and sizing matter: growing a bytearray record by record copied it over and over, and a fresh
    array per batch cost a page fault per 4 KB.
    """
    data = np.empty(1 << 20, np.uint8)
    view = data.data  # the array's memoryview (numpy's stubs give an array the buffer protocol from Python 3.12 only)
    while True:
        ends, sources, end = [], [], 0
        for path, offset, payload in itertools.islice(records, room()):
            start, end = end, end + len(payload)
            if end > len(data):
                data = np.concatenate([data[:start], np.empty(max(end, 2 * len(data)) - start, np.uint8)])
                view = data.data
            view[start:end] = payload
            ends.append(end)
            sources.append((path, offset))
        if not ends:
            return
        yield PackedRecords(data[:end], ends), sources


def _record_source(path: str, offsets: np.ndarray, index: int) -> tuple[str, int]:
    """The file and byte offset of record `index` of a chunk's records (at `offsets`), for its errors."""
    return path, int(offsets[index])


def _next_chunk(chunks: Generator[RecordChunk, Optional[int], None], limit: Optional[int]) -> Optional[RecordChunk]:
    """The next chunk of up to `limit` records (the first: as many as the generator was made for), or None."""
    try:
        return next(chunks) if inspect.getgeneratorstate(chunks) == inspect.GEN_CREATED else chunks.send(limit)
    except StopIteration:
        return None


class ShardReader:
    """Batches of `batch_size` examples from a reader's shares, decoded into `memory`'s tensors (labels as LabelIds:
    see finish_batch). What reading meets goes to `counter`: files cut short and records skipped (`options`'
    skip_corrupt; a RecordError names file and offset either way), each file's id key, and the record bytes of
    the batches where `options.record_bytes`. The last batch may be short, unless `options.drop_remainder`."""

    def __init__(self, spec: FeatureSpec, batch_size: int, options: ReadOptions, counter: ReadCounter,
                 memory: BatchMemory):
        self.spec, self.batch_size, self.options = spec, batch_size, options
        self.counter, self.memory = counter, memory

    def batches(self, shares: list[ReaderShare], shuffle: Optional[np.random.Generator], reader: int = 0,
                resume: Optional[StreamPosition] = None) -> Iterator[Batch]:
        """The shares' batches: in file order, or shuffled with the random stream `shuffle`; the files on object
        storage fetched ahead of their turn (ShardFetcher). Shuffled video and frame batches carry where this reader
        (`reader`) stood after them (Batch.position), and `resume`, one of those, goes on from there."""
        stream = None
        if shuffle is not None and not self.spec.segment_labels:
            stream = ShuffledStream(len(shares), ShuffleBuffer(self.options.shuffle_buffer, shuffle), resume)
        fetcher = ShardFetcher([shares[index] for index in stream.read_order()] if stream else shares, self.counter)
        try:
            for batch, record_bytes in self._batches(shares, shuffle, fetcher, reader, stream):
                if len(batch) < self.batch_size and self.options.drop_remainder:
                    return
                if self.options.record_bytes:
                    self.counter.unsent.record_bytes += record_bytes
                yield batch
        finally:
            fetcher.close()

    def _batches(self, shares: list[ReaderShare], shuffle: Optional[np.random.Generator], fetcher: ShardFetcher,
                 reader: int, stream: Optional[ShuffledStream]) -> Iterator[tuple[Batch, int]]:
        if stream is not None:  # shuffled video and frame records
            records = stream.records(lambda index: self._share_records(shares[index], fetcher))
            return self._positioned(self._shuffled_batches(records), stream, reader)
        if not self.spec.segment_labels:
            return self._in_order_batches(shares, fetcher)
        records = self._records(shares, fetcher)  # a record gives several segments: resumed by reading the epoch again
        if shuffle is not None:
            records = ShuffleBuffer(self.options.shuffle_buffer, shuffle).shuffled(records)
        return self._segment_batches(records)

    @staticmethod
    def _positioned(batches: Iterator[tuple[Batch, int]], stream: ShuffledStream, reader: int
                    ) -> Iterator[tuple[Batch, int]]:
        for batch, record_bytes in batches:
            batch.position = stream.position(reader)
            yield batch, record_bytes

    def _new_builder(self) -> BatchBuilder:
        skip = self.counter.skip_record if self.options.skip_corrupt else None
        return batch_builder(self.batch_size, self.spec, skip, self.memory)

    def _in_order_batches(self, shares: list[ReaderShare], fetcher: ShardFetcher) -> Iterator[tuple[Batch, int]]:
        """Batches in file order, each decoded chunk by chunk of the readers' buffers."""
        batch = self._new_builder()
        for share in shares:
            path, stride, phase = share.path, share.stride, share.phase
            limit = batch.room * stride
            chunks = read_record_chunks(path, limit, self.options.skip_corrupt, self.counter.count_corrupt,
                                        fetcher.open(share))
            first = 0  # the file index of the chunk's first record
            while (chunk := _next_chunk(chunks, limit)) is not None:
                if not first:
                    self.counter.note_id_key(path, chunk.data[chunk.starts[0]:chunk.ends[0]].tobytes(),
                                             self.spec.frame_features)
                taken = slice((phase - first) % stride, None, stride)
                first += len(chunk.starts)
                offsets = chunk.offsets[taken]
                # this chunk's path and offsets bound, not the loop's names: a partial costs about what the closure did
                # (0.2 us to make, once per chunk; 0.26 us a call, once per bad record)
                batch.add(PackedRecords(chunk.data, chunk.ends[taken], chunk.starts[taken]),
                          functools.partial(_record_source, path, offsets))
                if not batch.room:
                    yield batch.finish()
                    batch = self._new_builder()
                limit = batch.room * stride
        if batch.count:
            yield batch.finish()

    def _shuffled_batches(self, records: Iterator[Record]) -> Iterator[tuple[Batch, int]]:
        batch = self._new_builder()
        pieces = _record_pieces(records) if self.spec.frame_features else _packed_chunks(records, lambda: batch.room)
        for packed, sources in pieces:
            batch.add(packed, sources.__getitem__)
            if not batch.room:
                yield batch.finish()
                batch = self._new_builder()
        if batch.count:
            yield batch.finish()

    def _segment_batches(self, records: Iterator[Record]) -> Iterator[tuple[Batch, int]]:
        segments = itertools.chain.from_iterable(map(self._decode_segments, records))
        for chunk in iter(lambda: list(itertools.islice(segments, self.batch_size)), []):
            yield segment_batch(chunk, self.spec), sum(segment.record_bytes for segment in chunk)

    def _records(self, shares: list[ReaderShare], fetcher: ShardFetcher) -> Iterator[Record]:
        """The shares' records in order (see _share_records)."""
        return itertools.chain.from_iterable(self._share_records(share, fetcher) for share in shares)

    def _share_records(self, share: ReaderShare, fetcher: ShardFetcher) -> Iterator[Record]:
        """The share's records, each (offset, payload) joined to its file's path in a tuple of Record's layout; built
        at C speed (map, islice: no Python frame per record)."""
        records = itertools.islice(self._read(share, fetcher), share.phase, None, share.stride)
        # (path,) + (offset, payload): Record's layout, which the consumers unpack
        return cast(Iterator[Record], map(tuple.__add__, itertools.repeat((share.path,)), records))

    def _read(self, share: ReaderShare, fetcher: ShardFetcher) -> Iterator[tuple[int, bytes]]:
        """The file's (offset, payload) pairs; opened (and its id key noted) when called, as _records reaches the
        file."""
        path = share.path
        records = read_records(path, skip_corrupt=self.options.skip_corrupt, on_corrupt=self.counter.count_corrupt,
                               source=fetcher.open(share))
        first = next(records, None)
        if first is None:
            return iter(())
        self.counter.note_id_key(path, first[1], self.spec.frame_features)
        return itertools.chain((first,), records)

    def _decode_segments(self, record: Record) -> list[DecodedSegment]:
        """The rated segments of one record (every frame read, none cut at max_frames); none where skip_corrupt
        skips it (a RecordError names the file and offset either way)."""
        spec = self.spec
        path, offset, payload = record
        try:
            decoded = decode_segment_video(payload, spec.feature_names, spec.feature_sizes, spec.num_classes,
                                           spec.segment_size)
        except RecordError as err:
            located = err.at(path, offset)
            if not self.options.skip_corrupt:
                raise located from err
            self.counter.skip_record(located)
            return []
        return segment_examples(*decoded, spec.segment_size, len(payload) + RECORD_OVERHEAD_BYTES)

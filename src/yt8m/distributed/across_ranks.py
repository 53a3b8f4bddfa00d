"""`yt8m eval` and `predict` under torchrun: each process reads a contiguous block of the shards, and rank 0 merges
what they made (the metrics exactly, the prediction rows in shard order), sent to it in pieces of bounded size.

Contiguous blocks, not shards dealt in turn: one process reading the shards in order meets the videos in the same
order as the blocks one after the other, so that equal scores rank alike and the rows come out in the same order.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import logging
import pickle
import tempfile
from typing import Any, BinaryIO, Iterable, Iterator, Mapping, Optional, Sequence

import torch.distributed as dist

from yt8m.distributed.ranks import all_gathered, rank_and_world_size, receive_stream, send_stream

log = logging.getLogger("yt8m.distributed.ranks")


def rank_shards(paths: Sequence[str], rank: int, world_size: int) -> list[str]:
    """Process `rank`'s contiguous block of `paths`: block sizes differ by one at most, and with fewer paths than
    processes some blocks are empty (those processes idle)."""
    return list(paths[rank * len(paths) // world_size:(rank + 1) * len(paths) // world_size])


def this_rank_shards(listed: Mapping[str, Optional[int]], what: str) -> dict[str, Optional[int]]:
    """This process's block of the `listed` shards (each with its size where listed; all of them without a process
    group), once every process has found it listed the same files (agreed_listing); rank 0 warns of idle ones."""
    agreed_listing(listed, what)
    rank, world_size = rank_and_world_size()
    paths = list(listed)
    if rank == 0 and len(paths) < world_size:
        log.warning("%d shards for %d processes: processes %d to %d have no shard to read and stay idle",
                    len(paths), world_size, len(paths), world_size - 1)
    return {path: listed[path] for path in rank_shards(paths, rank, world_size)}


class ListingsDisagree(ValueError):
    """The processes of a torchrun job listed different files for one pattern. Every process raises it with the
    same message; yt8m.cli prints it on rank 0 only (`rank0_reports`)."""

    rank0_reports = True


def agreed_listing(listed: Mapping[str, Optional[int]], what: str) -> None:
    """Every process lists its shards itself (a listing is a request a thousand files, not one a file): they must
    have found the same files, or their splits of them would silently overlap or leave some out. ListingsDisagree
    names each process's count where the names or sizes differ."""
    digest = hashlib.sha256("".join(f"{path}\t{size}\n" for path, size in listed.items()).encode()).hexdigest()
    found = all_gathered((len(listed), digest))
    if len({seen for _, seen in found}) > 1:
        counts = ", ".join(f"process {rank}: {count} files" for rank, (count, _) in enumerate(found))
        raise ListingsDisagree(f"the processes listed different {what} ({counts}): every process must read the same "
                               "files (one shared folder or bucket); nothing was read")


@contextlib.contextmanager
def together() -> Iterator[None]:
    """Run the block on every process, then fail on all if it failed on any: with its own error where it failed, a
    RuntimeError naming the first failed process elsewhere (rather than waiting in a collective for it)."""
    if rank_and_world_size()[1] == 1:
        yield
        return
    error: Optional[Exception] = None
    try:
        yield
    except Exception as raised:
        error = raised
    failures: list[Optional[str]] = [None] * dist.get_world_size()
    dist.all_gather_object(failures, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    for rank, failure in enumerate(failures):
        if failure is not None:
            raise RuntimeError(f"process {rank} failed: {failure}")


def merge_metrics_at_rank0(metrics: Any) -> None:
    """Rank 0: the metrics of every other process added to its own (EvaluationMetrics or SegmentMetrics), in rank
    order, as if one process had accumulated all of them; the others send theirs, a pool block at a time."""
    rank, world_size = rank_and_world_size()
    if rank != 0:
        send_stream(itertools.chain([metrics.totals()], metrics.pooled_blocks()))
        return
    for source in range(1, world_size):
        stream = receive_stream(source)
        metrics.extend(next(stream), stream)
        collections.deque(stream, maxlen=0)  # the end mark, whatever `extend` left unread


def merge_at_rank0(accumulator: Any) -> None:
    """Rank 0: every other process's `accumulator` (picklable, of bounded size, with `merge(other)`) merged into its
    own, in rank order; the others send theirs whole."""
    rank, world_size = rank_and_world_size()
    if rank != 0:
        send_stream([accumulator])
        return
    for source in range(1, world_size):
        for other in receive_stream(source):
            accumulator.merge(other)


class SpilledPieces:
    """Picklable pieces written to a temporary file and read back in order, one at a time (a process's prediction
    rows, held until rank 0 asks for them)."""

    def __init__(self):
        self._file: BinaryIO = tempfile.TemporaryFile(prefix="yt8m-rows-")

    def add(self, piece: Any) -> None:
        pickle.dump(piece, self._file, protocol=pickle.HIGHEST_PROTOCOL)

    def __iter__(self) -> Iterator[Any]:
        self._file.seek(0)
        while True:
            try:
                yield pickle.load(self._file)
            except EOFError:
                return

    def close(self) -> None:
        self._file.close()


def from_every_rank(own: Iterable[Any]) -> Iterator[Any]:
    """Rank 0: its `own` pieces, then those every other process sends (send_stream), in rank order."""
    yield from own
    for source in range(1, rank_and_world_size()[1]):
        yield from receive_stream(source)

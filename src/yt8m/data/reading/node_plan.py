"""How a run's processes read on the machine they share: each process's reader workers (the CPUs divided among the
processes: yt8m.runtime.reader_workers) and their shuffle buffers and batch slots, counted over every process of the
machine against its memory; a plan that does not fit lowers readers, then buffers, each said in a line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from yt8m.data.reading.delivery import SLOTS_PER_WORKER
from yt8m.data.reading.memory_budget import human_bytes
from yt8m.data.reading.shuffle_stream import SHUFFLE_BUFFER_MAX_BYTES

# The fewest records a lowered shuffle buffer keeps: below it, shuffling is not worth the name.
MIN_SHUFFLE_BUFFER = 256


@dataclass(frozen=True)
class ReadingNeeds:
    """What one process's reading holds besides its own memory: a shuffle buffer per reader (records of
    `record_bytes`, at most SHUFFLE_BUFFER_MAX_BYTES each; one in-process, where there are no workers) when
    `streaming`, and SLOTS_PER_WORKER shared-memory batch slots of `slot_bytes` per worker. `own_bytes`: the process
    itself (gradients, optimizer state, batches in flight, slack)."""

    record_bytes: float
    slot_bytes: int
    own_bytes: int
    streaming: bool = True

    def process_bytes(self, readers: int, shuffle_buffer: int) -> int:
        buffer = min(shuffle_buffer * self.record_bytes, SHUFFLE_BUFFER_MAX_BYTES) if self.streaming else 0
        return round(self.own_bytes + max(1, readers) * buffer + readers * SLOTS_PER_WORKER * self.slot_bytes)


@dataclass(frozen=True)
class NodePlan:
    """A process's reading on a machine of `processes` like it: its readers and shuffle buffer (records), what one
    process and all of them hold, against `budget` (the machine's memory left; None: unknown). `notes` say what was
    lowered to fit, each a line to log."""

    readers: int
    shuffle_buffer: int
    process_bytes: int
    processes: int
    budget: Optional[int]
    notes: tuple[str, ...] = ()

    @property
    def node_bytes(self) -> int:
        return self.processes * self.process_bytes

    @property
    def fits(self) -> bool:
        return self.budget is None or self.node_bytes <= self.budget

    def describe(self) -> str:
        every = f"{self.processes} processes x " if self.processes > 1 else ""
        budget = "unknown memory" if self.budget is None else f"{human_bytes(self.budget)} available"
        return (f"{self.readers} reader process(es) and a shuffle buffer of {self.shuffle_buffer:,} records each: "
                f"{every}{human_bytes(self.process_bytes)} = {human_bytes(self.node_bytes)} of {budget}")


def plan_node(readers: int, shuffle_buffer: int, needs: ReadingNeeds, processes: int,
              budget: Optional[int]) -> NodePlan:
    """The readers and shuffle buffer of each of `processes` processes, as asked where the machine's `budget` holds
    them all; else fewer readers (each brings a buffer and its slots), then halved buffers (down to
    MIN_SHUFFLE_BUFFER), until it does or nothing is left to lower (the plan then does not fit)."""
    notes: list[str] = []

    def total(count: int, records: int) -> int:
        return processes * needs.process_bytes(count, records)

    while budget is not None and total(readers, shuffle_buffer) > budget and readers > 0:
        readers -= 1
        notes.append(f"{human_bytes(total(readers + 1, shuffle_buffer))} would not fit the {human_bytes(budget)} "
                     f"available: reading with {readers} worker process(es) each instead")
    while budget is not None and total(readers, shuffle_buffer) > budget and needs.streaming and \
            shuffle_buffer // 2 >= MIN_SHUFFLE_BUFFER:
        shuffle_buffer //= 2
        notes.append(f"still more than the {human_bytes(budget)} available: a shuffle buffer of {shuffle_buffer:,} "
                     "records per reader instead")
    return NodePlan(readers, shuffle_buffer, needs.process_bytes(readers, shuffle_buffer), processes, budget,
                    tuple(notes))

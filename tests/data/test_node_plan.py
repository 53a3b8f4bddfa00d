"""A GPU node's reading, planned for the whole node: reader workers divide its CPUs among the torchrun processes that
share it, and their shuffle buffers and batch slots, summed over every process, are held against its memory; a plan
that does not fit lowers readers, then buffers, each said in a line."""

from __future__ import annotations

import logging

from yt8m import runtime
from yt8m.data.reading.memory_budget import GiB, MiB
from yt8m.data.reading.node_plan import MIN_SHUFFLE_BUFFER, ReadingNeeds, plan_node
from yt8m.data.reading.shuffle_stream import SHUFFLE_BUFFER_MAX_BYTES
from yt8m.runtime import reader_workers

FRAMES, FEATURES, BATCH = 300, 1152, 256
# A real frame-level record (300 frames of 1024 + 128 uint8 features, ~346 kB) and a batch slot of 256 of them; the
# process itself: a NeXtVLAD-sized model's gradients and Adam's state (30M parameters), batches in flight, slack.
FRAME_LEVEL = ReadingNeeds(record_bytes=346e3, slot_bytes=BATCH * FRAMES * FEATURES,
                           own_bytes=30_000_000 * 12 + 4 * BATCH * FRAMES * FEATURES + 128 * MiB)


def test_a_16_cpu_128_gb_node_with_8_local_ranks_reads_within_its_budget(monkeypatch, caplog):
    monkeypatch.setattr(runtime, "available_cpus", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    caplog.set_level(logging.INFO, logger="yt8m")
    readers = reader_workers("auto", frame_features=True, accelerator=True)
    assert readers == 1  # 2 CPUs a rank: one drives the GPU, one decodes (it was 15 a rank: 120 on the node)
    assert caplog.messages[-1] == ("reading with 1 worker processes: 2 of 16 CPUs (8 processes share them), a GPU "
                                   "machine, frame-level data (auto)")
    plan = plan_node(readers, 10_000, FRAME_LEVEL, processes=8, budget=128 * GiB)
    assert plan.fits and plan.notes == () and (plan.readers, plan.shuffle_buffer) == (1, 10_000)
    # each rank: its own memory, one 512 MiB shuffle buffer (10,000 records would be 3.5 GB: the cap holds it), 3 slots
    assert plan.process_bytes == round(FRAME_LEVEL.own_bytes + SHUFFLE_BUFFER_MAX_BYTES + 3 * BATCH * FRAMES * FEATURES)
    assert plan.node_bytes == 8 * plan.process_bytes < 16 * GiB
    assert plan_node(15, 10_000, FRAME_LEVEL, 8, budget=128 * GiB).node_bytes > 6 * plan.node_bytes  # the old count


def test_a_node_that_cannot_hold_the_readers_asked_for_reads_with_fewer_then_smaller_buffers():
    lowered = plan_node(8, 10_000, FRAME_LEVEL, processes=8, budget=24 * GiB)
    assert lowered.fits and lowered.readers < 8 and lowered.shuffle_buffer == 10_000
    assert lowered.notes[0].endswith("available: reading with 7 worker process(es) each instead")
    tight = plan_node(2, 10_000, FRAME_LEVEL, processes=8, budget=9 * GiB)
    assert tight.fits and tight.readers == 0 and tight.shuffle_buffer < 10_000
    assert "a shuffle buffer of" in tight.notes[-1]


def test_a_node_too_small_for_the_least_plan_does_not_fit_and_says_how_much_it_needs():
    plan = plan_node(4, 10_000, FRAME_LEVEL, processes=8, budget=2 * GiB)
    assert not plan.fits and plan.readers == 0 and MIN_SHUFFLE_BUFFER <= plan.shuffle_buffer < 2 * MIN_SHUFFLE_BUFFER
    assert plan.describe().endswith("of 2.0 GiB available")


def test_an_unknown_memory_keeps_the_plan_asked_for():
    plan = plan_node(3, 10_000, FRAME_LEVEL, processes=2, budget=None)
    assert plan.fits and (plan.readers, plan.shuffle_buffer, plan.notes) == (3, 10_000, ())

"""Tests of ReadPlan and ReadOptions: every record with exactly one reader of ranks x workers in every epoch, file
order and shuffle streams seeded by seed and epoch, a RAM cache's batches in the epoch's order."""

from __future__ import annotations

import dataclasses

import pytest

from yt8m.data.reading.read_plan import ReadOptions, ReadPlan

RECORDS_PER_FILE = 30


def owners(files: int, world_size: int, workers: int, shuffle: bool, epoch: int) -> dict[tuple[str, int], list]:
    """(path, record index) -> the (rank, worker) readers reading it this epoch."""
    paths = [f"f{index}" for index in range(files)]
    found: dict[tuple[str, int], list] = {}
    for rank in range(world_size):
        plan = ReadPlan(paths, ReadOptions(shuffle=shuffle, seed=3, rank=rank, world_size=world_size))
        plan.set_epoch(epoch)
        for worker in range(workers):
            for path, stride, phase, _ in plan.shares(rank * workers + worker, world_size * workers):
                for record in range(phase, RECORDS_PER_FILE, stride):
                    found.setdefault((path, record), []).append((rank, worker))
    return found


@pytest.mark.parametrize("files", [1, 3, 8])
@pytest.mark.parametrize("world_size,workers", [(1, 1), (1, 3), (2, 2), (3, 1)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_record_of_every_file_goes_to_exactly_one_reader_in_every_epoch(files, world_size, workers, shuffle):
    for epoch in range(3):
        found = owners(files, world_size, workers, shuffle, epoch)
        assert sorted(found) == [(f"f{file}", record) for file in range(files) for record in range(RECORDS_PER_FILE)]
        assert all(len(readers) == 1 for readers in found.values())


def test_shuffled_file_order_changes_with_epoch_and_seed_and_is_fixed_without_shuffle():
    paths = [f"f{index:02d}" for index in range(12)]

    def first_reader_files(seed: int, epoch: int, shuffle: bool = True) -> list[str]:
        plan = ReadPlan(paths, ReadOptions(shuffle=shuffle, seed=seed, rank=0, world_size=1))
        plan.set_epoch(epoch)
        return [share.path for share in plan.shares(0, 1)]

    assert first_reader_files(1, 0) == first_reader_files(1, 0) != paths
    assert sorted(first_reader_files(1, 0)) == paths
    assert first_reader_files(1, 1) != first_reader_files(1, 0)
    assert first_reader_files(2, 0) != first_reader_files(1, 0)
    assert first_reader_files(1, 0, shuffle=False) == first_reader_files(1, 5, shuffle=False) == paths


def test_shuffle_streams_differ_by_reader_and_epoch_and_are_none_in_file_order():
    plan = ReadPlan(["a"], ReadOptions(shuffle=True, seed=0, rank=0, world_size=1))
    draws = {(reader, epoch): tuple(plan_draw(plan, reader, epoch)) for reader in range(2) for epoch in range(2)}
    assert len(set(draws.values())) == 4
    assert tuple(plan_draw(plan, 0, 0)) == draws[(0, 0)]
    assert ReadPlan(["a"], ReadOptions(rank=0, world_size=1)).shuffle_stream(0, 1) is None


def plan_draw(plan: ReadPlan, reader: int, epoch: int) -> list[int]:
    plan.set_epoch(epoch)
    return plan.shuffle_stream(reader, 2).integers(0, 1 << 30, 4).tolist()


def test_rank_shares_hold_every_record_of_the_rank_in_file_order():
    paths = [f"f{index}" for index in range(5)]
    plan = ReadPlan(paths, ReadOptions(shuffle=True, seed=9, rank=1, world_size=2))
    plan.set_epoch(4)
    assert [share.path for share in plan.rank_shares()] == ["f1", "f3"]


@pytest.mark.parametrize("shuffle", [False, True])
def test_cached_batches_cover_the_cache_once_in_the_epochs_order(shuffle):
    plan = ReadPlan(["a"], ReadOptions(shuffle=shuffle, seed=2, rank=0, world_size=1))
    batches = [indices.tolist() for indices in plan.cached_batches(10, 4)]
    assert [len(indices) for indices in batches] == [4, 4, 2]
    order = [index for indices in batches for index in indices]
    assert sorted(order) == list(range(10)) and (order != list(range(10))) == shuffle
    plan.set_epoch(1)
    assert [indices.tolist() for indices in plan.cached_batches(10, 4)] != batches or not shuffle


def test_read_options_are_frozen_and_checked():
    options = ReadOptions(shuffle=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.shuffle = False  # type: ignore[misc]
    assert dataclasses.replace(options, seed=4) == ReadOptions(shuffle=True, seed=4)
    with pytest.raises(ValueError, match="shuffle_buffer must be positive"):
        ReadOptions(shuffle_buffer=0)


def test_a_rank_outside_the_world_is_an_error():
    with pytest.raises(ValueError, match=r"rank must lie in \[0, world_size\)"):
        ReadPlan(["a"], ReadOptions(rank=2, world_size=2))
    plan = ReadPlan(["a"], ReadOptions())  # no process group: rank 0 of 1
    assert (plan.rank, plan.world_size) == (0, 1)

"""yt8m.io.spill: sorted runs merged back in key order, and keyed SQLite tables that find the first duplicate."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

import yt8m.io.spill as spill
from yt8m.io.spill import Duplicate, KeyedTable, SortedRuns, TemporaryDatabase, add_unique

RECORD = np.dtype([("key", "<u8"), ("value", "<i4")])


def records(keys: np.ndarray) -> np.ndarray:
    out = np.empty(len(keys), RECORD)
    out["key"] = np.sort(keys)
    out["value"] = np.arange(len(keys))
    return out


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 16])
def test_runs_merge_back_in_key_order_with_keys_past_float_precision(monkeypatch, tmp_path, block):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(spill, "MERGE_BLOCK", block)
    rng = np.random.default_rng(0)
    # Keys 1 apart above 2**62: equal once rounded to float64, so only exact uint64 comparisons merge them right.
    keys = (np.uint64(1 << 62) + rng.permutation(3000).astype(np.uint64))
    runs = SortedRuns(RECORD)
    parts = np.array_split(keys, [100, 1100, 1101, 2500])
    for part in parts[:-1]:
        runs.add(records(part))
    merged = np.concatenate(list(runs.merged(records(parts[-1]))))
    assert merged["key"].tolist() == sorted(keys.tolist())
    assert len(runs) == 4 and len(os.listdir(tmp_path)) == 1
    runs.close()
    assert os.listdir(tmp_path) == []


def test_merging_nothing_and_only_memory():
    runs = SortedRuns(RECORD)
    assert list(runs.merged()) == []
    only = records(np.arange(5, dtype=np.uint64))
    assert np.concatenate(list(runs.merged(only)))["key"].tolist() == [0, 1, 2, 3, 4]


def test_keyed_table_reports_the_first_duplicate_in_line_order(monkeypatch):
    monkeypatch.setattr(spill, "_INSERT_BATCH", 4)
    with TemporaryDatabase() as database:
        table = KeyedTable(database, "ids", ("payload",))
        found = [table.add(key, line, line * 10) for line, key in enumerate(["a", "b", "c", "d", "e", "b"], 1)]
        assert found[:4] == [None] * 4  # the 4th fills a batch and inserts it
        assert table.flush() == Duplicate("b", 2, 6)
    with TemporaryDatabase() as database:
        table = KeyedTable(database, "ids")
        assert table.add_many(["x", "y", "z"], first_line=2) is None
        assert table.add_many(["w", "y", "w"], first_line=5) == Duplicate("y", 3, 6)
        assert table.line_of("z") == 4 and table.line_of("nowhere") is None


def test_add_unique_lets_an_earlier_duplicate_win_over_a_later_error(monkeypatch):
    monkeypatch.setattr(spill, "_INSERT_BATCH", 100)

    def items():
        yield from ("a", "b", "a", "c")
        raise ValueError("line 5 is broken")

    with TemporaryDatabase() as database:
        table = KeyedTable(database, "ids")
        passed = []
        with pytest.raises(KeyError, match="'a' on lines 1 and 3"):
            for item in add_unique(table, items(), lambda item: (item, len(passed) + 1),
                                   lambda d: KeyError(f"{d.key!r} on lines {d.first_line} and {d.line}")):
                passed.append(item)


def test_temporary_database_is_removed(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with TemporaryDatabase() as database:
        KeyedTable(database, "ids").add_many(["a"], 1)
        assert len(os.listdir(tmp_path)) == 1
    assert os.listdir(tmp_path) == []

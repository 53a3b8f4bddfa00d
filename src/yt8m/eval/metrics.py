"""The starter kit's evaluation metrics (hit@1, PERR, GAP, per-class mAP), streamed over batches.

Vectorized (NumPy, one torch reduction), exact to the definitions below with a fixed tie order, in memory
bounded whatever the number of videos: the pooled top-k entries are kept in memory up to a budget, then written
as sorted runs to temporary files and merged back in `get()` (the same floats, bit for bit, either way).

Definitions (P scores, Y 0/1 labels, k = top_k, m = number of labels of a video):
  hit_at_one       mean over videos of Y at the video's highest score.
  perr             per video with m > 0: the fraction of its top-m scores that are labels and > 0;
                   a video without labels counts 0; mean over all videos.
  gap              pool every video's top-k (score, label) pairs, rank them by score; AP = sum over
                   ranks r of precision@r at each positive, divided by the number of labels in Y
                   (including labels outside the top-k).
  map              per-class AP over the same pool (divided by the class's label count), averaged
                   over the classes with at least one label.
  map_all_classes  the same averaged over all classes, a class without labels counting 0 (the
                   starter kit's mean of `peek_map_at_n()`).

Tie order (the starter kit leaves it to argpartition and a seeded shuffle): within a video, equal
scores rank by ascending class index (so hit@1 follows np.argmax); in the pooled GAP and per-class
rankings, equal scores keep accumulation order (video order, then the within-video order).
A score of -inf means "not predicted": it never enters a video's top-k and is never a hit.
Scores are compared as float32; NaN scores are an error.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional

import numpy as np
import torch

from yt8m.io.spill import SortedRuns

# Rows handled per step: a chunk of scores and labels stays in cache between its passes.
# Which way is better for each validation metric a task reports (yt8m.tasks): picks the best model, drives early
# stopping and the tuning objective's direction.
HIGHER_IS_BETTER = {"gap": True, "map": True, "map_all_classes": True, "hit_at_one": True, "perr": True,
                    "segment_map": True, "loss": False}
# What each metric says, in one line each, for the reports people read (the demo's, tune-report's).
METRIC_MEANINGS = {
    "gap": "GAP@20: every video's 20 best guesses pooled and ranked by confidence, the average precision of that "
           "ranking (the 2017-2018 Kaggle score; 1 is perfect)",
    "map": "mAP: each class's average precision over the videos, averaged over the classes with labels (rare "
           "classes weigh as much as common ones)",
    "map_all_classes": "mAP over every class, a class without labels counting 0 (the starter kit's number)",
    "hit_at_one": "Hit@1: the share of videos whose best guess is one of their labels",
    "perr": "PERR: the share of each video's m best guesses that are labels, m its number of labels",
    "segment_map": "segment mAP@K: per class, the average precision of its K best-ranked rated segments, averaged "
                   "over the classes with a positive segment (the 2019 Kaggle score)",
    "loss": "loss: the training loss on these videos (lower is better; compare runs of the same loss only)",
}

_CHUNK_ROWS = 128
# About this many interleaved column blocks bound each row's top-k (see _candidates).
_TARGET_BLOCKS = 64
_LOWEST_FLOAT32 = np.finfo(np.float32).min
_LOW_32_BITS = np.uint64(0xFFFFFFFF)
# A batch's sort key packs row | 32-bit score | class into 64 bits, which bounds its rows.
_KEY_BITS = 64
_SCORE_BITS = 32
# Pooled entries (9 bytes each) kept in memory before they are sorted and written out as one run: about 100k videos
# at top-20. Twice that took 80 MB more at 1M videos, for the same speed (bench_metrics.py).
POOL_BUDGET = 1 << 21
# A pooled entry in a run: its rank key (score, then accumulation position) and its class << 1 | label.
_RUN_DTYPE = np.dtype([("key", "<u8"), ("item", "<i4")])
_MAX_POOLED = 2 ** 32 - 1  # positions fill the key's low 32 bits
# NumPy sums up to this many float64 values in one block of eight interleaved sums (see _PairwiseSum).
_PAIRWISE_BLOCK = 128


def descending_key(scores: np.ndarray) -> np.ndarray:
    """uint32 keys whose ascending order is the float32 scores' descending order."""
    bits = (scores + np.float32(0.0)).view(np.int32)  # + 0.0 folds -0.0 into 0.0
    ascending = bits ^ ((bits >> 31) | np.int32(-0x80000000))  # flip negatives, set positives' sign bit
    return ~ascending.view(np.uint32)


def _with_position(key32: np.ndarray, first: int = 0) -> np.ndarray:
    """64-bit sort keys: the 32-bit key above, the entry's position (from `first`) below (ties keep order)."""
    keys = key32.astype(np.uint64)
    keys <<= np.uint64(32)
    keys |= np.arange(first, first + len(key32), dtype=np.uint64)
    return keys


def _low_half(keys: np.ndarray) -> np.ndarray:
    keys &= _LOW_32_BITS
    return keys.view(np.int64)


def _class_bits(num_classes: int) -> int:
    return max(1, int(num_classes - 1).bit_length())


def _batches(predictions: np.ndarray, labels: np.ndarray, top_k: int) -> Iterator["_Batch"]:
    """The input as _Batch pieces small enough for the 64-bit sort key (one piece in practice)."""
    scores, labels = _check_inputs(predictions, labels)
    piece = 2 ** (_KEY_BITS - _SCORE_BITS - _class_bits(scores.shape[1]))
    for start in range(0, len(scores), piece):
        yield _Batch(scores[start:start + piece], labels[start:start + piece], top_k)


def _candidates(scores: np.ndarray, depth: int) -> np.ndarray:
    """Flat indices (row-major) of a superset of each row's top-`depth` entries, -inf excluded.

    Columns are split into interleaved blocks (block b: columns b, b + num_blocks, ...). At least
    `depth` entries reach the depth-th largest block maximum, so every entry of a row's top-depth,
    ties with the last one included, is >= it; typically only a few more than `depth` pass.
    """
    rows, cols = scores.shape
    num_blocks = min(cols, max(depth, _TARGET_BLOCKS))
    block = cols // num_blocks
    # torch's strided max runs about twice as fast as NumPy's on this layout.
    body = torch.from_numpy(scores).as_strided((rows, block, num_blocks), (cols, num_blocks, 1))
    block_max = body.amax(dim=1).numpy()
    if np.isnan(block_max).any() or np.isnan(scores[:, num_blocks * block:]).any():
        raise ValueError("predictions contain NaN")
    bound = np.partition(block_max, num_blocks - depth, axis=1)[:, num_blocks - depth]
    bound = np.maximum(bound, _LOWEST_FLOAT32)  # so that -inf never qualifies
    return np.flatnonzero(scores >= bound[:, None])


def _in_tie_order(scores: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """Flat indices sorted by row, then score descending, then class (the within-video order)."""
    cols = scores.shape[1]
    class_bits = _class_bits(cols)
    flat_rows = flat // cols
    keys = flat_rows.astype(np.uint64) << np.uint64(_SCORE_BITS + class_bits)
    keys |= descending_key(scores.ravel()[flat]).astype(np.uint64) << np.uint64(class_bits)
    keys |= (flat - flat_rows * cols).astype(np.uint64)
    keys.sort()
    ordered_rows = (keys >> np.uint64(_SCORE_BITS + class_bits)).view(np.int64)
    return ordered_rows * cols + (keys & np.uint64((1 << class_bits) - 1)).view(np.int64)


def _rank_in_row(entry_rows: np.ndarray, num_rows: int) -> np.ndarray:
    """Position of each entry within its row, for entries grouped by ascending row."""
    counts = np.bincount(entry_rows, minlength=num_rows)
    return np.arange(len(entry_rows)) - (np.cumsum(counts) - counts)[entry_rows]


def _check_inputs(predictions: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores = np.ascontiguousarray(predictions, dtype=np.float32)
    labels = np.ascontiguousarray(labels, dtype=np.float32)
    if scores.ndim != 2 or labels.shape != scores.shape or scores.shape[1] == 0:
        raise ValueError(f"predictions {scores.shape} and labels {labels.shape} must be equal "
                         "[videos, classes] matrices")
    return scores, labels


class _Batch:
    """One batch's contribution: its pool entries (each video's top-k), hit@1 and PERR sums."""

    def __init__(self, scores: np.ndarray, labels: np.ndarray, top_k: int):
        num_rows, num_classes = scores.shape
        k = min(top_k, num_classes)
        candidates, num_labels = [np.empty(0, np.int64)], [np.empty(0, np.float32)]
        class_positives = np.zeros(num_classes)
        for start in range(0, num_rows, _CHUNK_ROWS):
            chunk_labels = labels[start:start + _CHUNK_ROWS]
            # Sums, not products with a ones vector: NumPy's BLAS threads would spin on the cores that
            # torch's amax in _candidates needs next (7 ms instead of 0.2 ms per chunk on 2 cores).
            chunk_num_labels = chunk_labels.sum(axis=1)
            class_positives += chunk_labels.sum(axis=0)
            depth = max(k, int(chunk_num_labels.max()))  # deep enough for PERR's top-m too
            candidates.append(_candidates(scores[start:start + _CHUNK_ROWS], depth) + start * num_classes)
            num_labels.append(chunk_num_labels)
        self.num_videos = num_rows
        self.class_positives = np.rint(class_positives).astype(np.int64)
        self._summarize(scores, labels, _in_tie_order(scores, np.concatenate(candidates)),
                        np.rint(np.concatenate(num_labels)).astype(np.int64), top_k)

    def _summarize(self, scores: np.ndarray, labels: np.ndarray, flat: np.ndarray,
                   num_labels: np.ndarray, top_k: int) -> None:
        """From each row's candidates in tie order: PERR's top-m, hit@1 and the pooled top-k."""
        num_rows, num_classes = scores.shape
        rows = flat // num_classes
        rank = _rank_in_row(rows, num_rows)
        entry_scores = scores.ravel()[flat]
        entry_labels = labels.ravel()[flat] > 0
        counted = entry_labels & (entry_scores > 0) & (rank < num_labels[rows])
        hits_in_top_m = np.bincount(rows[counted], minlength=num_rows)
        labelled = num_labels > 0
        self.perr_sum = float((hits_in_top_m[labelled] / num_labels[labelled]).sum())
        self.hit_sum = float(entry_labels[rank == 0].sum())
        in_pool = rank < top_k
        self.scores = entry_scores[in_pool]
        self.labels = entry_labels[in_pool]
        self.classes = (flat[in_pool] - rows[in_pool] * num_classes).astype(np.int32)


def _pairwise_plan(count: int) -> Iterator[Optional[int]]:
    """NumPy's pairwise summation of `count` values in order: a block's length, or None to add the last two sums."""
    if count <= _PAIRWISE_BLOCK:
        yield count
        return
    half = count // 2
    half -= half % 8
    yield from _pairwise_plan(half)
    yield from _pairwise_plan(count - half)
    yield None


class _PairwiseSum:
    """`np.add.reduce` of a float64 array of a known length, bit for bit, from pieces given in order.

    NumPy sums a contiguous float64 array pairwise: up to 128 values as one block (eight interleaved sums), more by
    splitting at the half rounded down to a multiple of 8 and adding the two halves' sums. Summing each block with
    NumPy and adding the sums in the same tree gives the same float without holding the array.
    """

    _END = -1

    def __init__(self, count: int):
        self._plan = _pairwise_plan(count)
        self._sums: list[np.float64] = []
        self._step = self._next_block()
        self._waiting = np.empty(0)
        self.add(self._waiting)  # a sum of nothing is a block of length 0

    def _next_block(self) -> int:
        """The next block's length (or _END), adding up the sums the plan merges on the way (its Nones)."""
        step = next(self._plan, self._END)
        while step is None:
            right = self._sums.pop()
            self._sums[-1] = self._sums[-1] + right
            step = next(self._plan, self._END)
        return step

    def add(self, values: np.ndarray) -> None:
        values = np.concatenate([self._waiting, values]) if len(self._waiting) else values
        start = 0
        while self._step != self._END and len(values) - start >= self._step:
            self._sums.append(np.add.reduce(values[start:start + self._step]))
            start += self._step
            self._step = self._next_block()
        self._waiting = values[start:]

    def total(self) -> float:
        if self._step != self._END or len(self._sums) != 1:
            raise ValueError("fewer values were added than the sum was made for")
        return float(self._sums[0])


def _occurrence(values: np.ndarray, num_values: int) -> np.ndarray:
    """For each entry, how many equal entries come before it."""
    order = np.argsort(values, kind="stable")
    counts = np.bincount(values, minlength=num_values)
    occurrence = np.empty(len(values), np.int64)
    occurrence[order] = np.arange(len(values)) - (np.cumsum(counts) - counts)[values[order]]
    return occurrence


class _RankedPool:
    """GAP and per-class AP from the pool's entries given in rank order, a block at a time.

    The floats are those of the whole-pool computation: GAP's terms are summed as `np.sum` sums them (_PairwiseSum),
    each class's terms one by one in rank order, as `np.bincount` adds them.
    """

    def __init__(self, num_classes: int, pooled_positives: int):
        self.num_classes = num_classes
        self.class_sums = np.zeros(num_classes)
        self._class_entries = np.zeros(num_classes, np.int64)
        self._class_hits = np.zeros(num_classes, np.int64)
        self._gap_sum = _PairwiseSum(pooled_positives)
        self._ranked = self._found = 0

    def add(self, labels: np.ndarray, classes: np.ndarray) -> None:
        """The next entries in rank order: labels bool, classes int."""
        positives = np.flatnonzero(labels)
        found = self._found + np.arange(1, len(positives) + 1)
        self._gap_sum.add(found / (self._ranked + positives + 1))
        positive_classes = classes[positives]
        rank_in_class = self._class_entries[positive_classes] + _occurrence(classes, self.num_classes)[positives] + 1
        hits_in_class = self._class_hits[positive_classes] + _occurrence(positive_classes, self.num_classes) + 1
        np.add.at(self.class_sums, positive_classes, hits_in_class / rank_in_class)
        self._class_entries += np.bincount(classes, minlength=self.num_classes)
        self._class_hits += np.bincount(positive_classes, minlength=self.num_classes)
        self._ranked += len(labels)
        self._found += len(positives)

    def gap_sum(self) -> float:
        """Sum of precision@r at each positive rank."""
        return self._gap_sum.total()


class EvaluationMetrics:
    """Streams batches of predictions and labels; `get()` returns the starter kit's metrics.

    The pooled top-k entries beyond `pool_budget` (default POOL_BUDGET) go to temporary files, removed by `close()`
    or `clear()` (or when the object is garbage collected); `with EvaluationMetrics(...) as metrics:` closes it.
    """

    def __init__(self, num_classes: int, top_k: int = 20, pool_budget: Optional[int] = None):
        pool_budget = POOL_BUDGET if pool_budget is None else pool_budget
        if int(num_classes) < 1 or int(top_k) < 1 or int(pool_budget) < 1:
            raise ValueError(f"num_classes ({num_classes}), top_k ({top_k}) and pool_budget ({pool_budget}) "
                             "must be positive")
        self.num_classes = int(num_classes)
        self.top_k = int(top_k)
        self.pool_budget = int(pool_budget)
        self._runs = SortedRuns(_RUN_DTYPE, prefix="yt8m-metrics-")
        self.clear()

    def clear(self) -> None:
        """Forget everything accumulated."""
        self._runs.close()
        self._scores: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._classes: list[np.ndarray] = []
        self._in_memory = self._pooled = self._pooled_positives = 0
        self._class_positives = np.zeros(self.num_classes, dtype=np.int64)
        self._sum_hit = 0.0
        self._sum_perr = 0.0
        self._sum_loss = 0.0
        self._num_videos = 0

    def close(self) -> None:
        """Remove the temporary files; what was accumulated stays readable only if nothing was written out."""
        self._runs.close()

    def __enter__(self) -> "EvaluationMetrics":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def num_labels(self) -> int:
        """Labels (positive entries of the label matrices) accumulated so far."""
        return int(self._class_positives.sum())

    def accumulate(self, predictions: np.ndarray, labels: np.ndarray, loss: float = 0.0) -> None:
        """Add a batch: scores and 0/1 labels, both [videos, num_classes]; loss is the batch mean."""
        if np.ndim(predictions) != 2 or np.shape(predictions)[1] != self.num_classes:
            raise ValueError(f"predictions have shape {np.shape(predictions)}, "
                             f"expected [videos, {self.num_classes}]")
        for batch in _batches(predictions, labels, self.top_k):
            self._pool(batch)
            self._class_positives += batch.class_positives
            self._sum_hit += batch.hit_sum
            self._sum_perr += batch.perr_sum
            self._sum_loss += float(loss) * batch.num_videos
            self._num_videos += batch.num_videos

    def _pool(self, batch: "_Batch") -> None:
        if self._pooled + len(batch.scores) > _MAX_POOLED:
            raise ValueError(f"{self._pooled + len(batch.scores)} pooled predictions: "
                             f"at most {_MAX_POOLED} are supported")
        self._scores.append(batch.scores)
        self._labels.append(batch.labels)
        self._classes.append(batch.classes)
        self._in_memory += len(batch.scores)
        self._pooled += len(batch.scores)
        self._pooled_positives += int(batch.labels.sum())
        if self._in_memory >= self.pool_budget:
            self._runs.add(self._sorted_in_memory())
            self._scores, self._labels, self._classes = [], [], []
            self._in_memory = 0

    def _sorted_in_memory(self) -> np.ndarray:
        """The pool entries held in memory as run records, in rank order."""
        records = np.empty(self._in_memory, _RUN_DTYPE)
        if not self._in_memory:
            return records
        first = self._pooled - self._in_memory
        keys = _with_position(descending_key(np.concatenate(self._scores)), first)
        keys.sort()
        records["key"] = keys
        order = _low_half(keys) - first
        items = np.concatenate(self._classes)[order] << 1
        items |= np.concatenate(self._labels)[order]
        records["item"] = items
        return records

    def totals(self) -> dict:
        """What was accumulated besides the pooled entries: counts and sums (for `extend`)."""
        return {"class_positives": self._class_positives.copy(), "sum_hit": self._sum_hit, "sum_perr": self._sum_perr,
                "sum_loss": self._sum_loss, "num_videos": self._num_videos, "pooled": self._pooled,
                "pooled_positives": self._pooled_positives}

    def pooled_blocks(self) -> Iterator[np.ndarray]:
        """The pooled entries as run records in rank order, a block at a time (for `extend`)."""
        return self._runs.merged(self._sorted_in_memory())

    def extend(self, totals: dict, pooled_blocks: Iterable[np.ndarray]) -> None:
        """Add another accumulator's videos (its `totals()` and `pooled_blocks()`) as if its batches were accumulated
        now: its entries rank after this one's among equal scores, and `get()` gives what one accumulator fed both
        inputs in turn gives (the same floats, bar the order in which hit@1, PERR and loss sums are added)."""
        if self._pooled + totals["pooled"] > _MAX_POOLED:
            raise ValueError(f"{self._pooled + totals['pooled']} pooled predictions: "
                             f"at most {_MAX_POOLED} are supported")
        if self._in_memory:  # its positions are counted back from _pooled, which grows below
            self._runs.add(self._sorted_in_memory())
            self._scores, self._labels, self._classes = [], [], []
            self._in_memory = 0
        offset = np.uint64(self._pooled)
        if totals["pooled"]:
            self._runs.add_blocks(_shifted(block, offset) for block in pooled_blocks)
        self._pooled += totals["pooled"]
        self._pooled_positives += totals["pooled_positives"]
        self._class_positives += totals["class_positives"]
        self._sum_hit += totals["sum_hit"]
        self._sum_perr += totals["sum_perr"]
        self._sum_loss += totals["sum_loss"]
        self._num_videos += totals["num_videos"]

    def per_class(self) -> dict[str, np.ndarray]:
        """After `get()`: each class's average precision ("ap", float64; 0 for a class without labels) and its labelled
        videos ("positives", int64), the terms of its mAP."""
        return {"ap": self._class_ap.copy(), "positives": self._class_positives.copy()}

    def get(self) -> dict:
        """gap, map, map_all_classes, hit_at_one, perr, loss (means over videos) and num_videos."""
        if self._num_videos == 0:
            raise ValueError("no videos were accumulated")
        ranked = _RankedPool(self.num_classes, self._pooled_positives)
        for block in self._runs.merged(self._sorted_in_memory()):
            items = block["item"]
            ranked.add((items & 1).astype(bool), items >> 1)
        class_ap = self._class_ap = np.divide(ranked.class_sums, self._class_positives, out=np.zeros(self.num_classes),
                                              where=self._class_positives > 0)
        num_positives = int(self._class_positives.sum())
        labelled = self._class_positives > 0
        return {
            "gap": ranked.gap_sum() / num_positives if num_positives else 0.0,
            "map": float(class_ap[labelled].mean()) if labelled.any() else 0.0,
            "map_all_classes": float(class_ap.mean()),
            "hit_at_one": self._sum_hit / self._num_videos,
            "perr": self._sum_perr / self._num_videos,
            "loss": self._sum_loss / self._num_videos,
            "num_videos": self._num_videos,
        }


def _shifted(block: np.ndarray, offset: np.uint64) -> np.ndarray:
    """Run records with their positions (the key's low 32 bits) moved `offset` later."""
    block = block.copy()
    block["key"] += offset
    return block


def _one_batch(predictions: np.ndarray, labels: np.ndarray, top_k: int) -> dict:
    metrics = EvaluationMetrics(np.shape(predictions)[-1], top_k)
    metrics.accumulate(predictions, labels)
    return metrics.get()


def calculate_hit_at_one(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Mean over the batch's videos of the label at the highest score."""
    return _one_batch(predictions, labels, 1)["hit_at_one"]


def calculate_perr(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Mean over the batch's videos of the precision at equal recall rate."""
    return _one_batch(predictions, labels, 1)["perr"]


def calculate_gap(predictions: np.ndarray, labels: np.ndarray, top_k: int = 20) -> float:
    """Global average precision of one batch, over each video's top_k predictions."""
    return _one_batch(predictions, labels, top_k)["gap"]

"""Input-pipeline throughput: how fast `YT8MDataset` + `make_loader` turn shards into batched tensors, workers'
start included (what `yt8m bench read` and bench/bench_read.py print)."""

from __future__ import annotations

import time
from typing import Optional

from yt8m.data.reading.dataset import YT8MDataset, make_loader
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.data.reading.spec import FeatureSpec

MEGABYTE = 1_000_000


def read_throughput(pattern: str, spec: FeatureSpec, batch_size: int, num_workers: int,
                    max_batches: Optional[int] = None) -> dict:
    """Read `pattern` once (or `max_batches` batches) through YT8MDataset and make_loader, timing it all.

    The time includes starting the workers (also given apart: the seconds to the first batch, and the examples/s
    after it); MB are 10^6 bytes of TFRecord records (framing included).
    """
    dataset = YT8MDataset(pattern, spec, batch_size, ReadOptions(record_bytes=True))
    examples = batches = first_examples = 0
    start = first_batch = time.perf_counter()
    for batch in make_loader(dataset, num_workers):
        examples += len(batch)
        batches += 1
        if batches == 1:
            first_batch, first_examples = time.perf_counter(), examples
        if max_batches is not None and batches >= max_batches:
            break
    end = time.perf_counter()
    seconds = end - start
    record_bytes = dataset.read_stats.record_bytes
    after_first = (examples - first_examples) / (end - first_batch) if batches > 1 else 0.0
    return {"examples": examples, "batches": batches, "seconds": round(seconds, 6),
            "examples_per_sec": round(examples / seconds, 1), "mb_per_sec": round(record_bytes / MEGABYTE / seconds, 3),
            "first_batch_seconds": round(first_batch - start, 6), "after_first_examples_per_sec": round(after_first, 1),
            "num_workers": num_workers, "batch_size": batch_size, "frame_features": spec.frame_features}

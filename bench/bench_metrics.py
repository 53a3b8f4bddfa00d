"""Metrics throughput on one core: EvaluationMetrics.accumulate + get with 3862 classes (get's seconds and the
process's peak RSS apart), next to a straightforward port of the starter kit's per-video Python loop on a subset.

Run on demand: `.venv/bin/python bench/bench_metrics.py [--videos 100000] [--baseline_videos 2000]`
(`--videos 1000000 --repeats 1 --baseline_videos 0` for the full-scale figure; `--pool_budget N` spills sooner).
The two agree up to tied float32 scores, which the starter kit orders arbitrarily (max_abs_difference).
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_name] = "1"  # before NumPy and torch load their thread pools

import argparse
import json
import resource
import time

import numpy as np
import torch

from yt8m.eval.metrics import EvaluationMetrics

BATCH = 1024
DISTINCT_BATCHES = 8  # cycled, so batches are not all served from cache


def make_batch(rng: np.random.Generator, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Sigmoid scores mostly near 0, about 3 labels per video, labelled classes scored higher."""
    labels = (rng.random((BATCH, num_classes)) < 3 / num_classes).astype(np.float32)
    logits = rng.normal(-6.0, 2.0, (BATCH, num_classes)) + 5.0 * labels
    return (1 / (1 + np.exp(-logits))).astype(np.float32), labels


def time_fast(batches: list, videos: int, num_classes: int, top_k: int,
              budget: dict) -> tuple[dict, float, float, float]:
    """The metrics, wall and CPU seconds of accumulate + get, and get's wall seconds alone."""
    metrics = EvaluationMetrics(num_classes, top_k, **budget)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(videos // BATCH):
        predictions, labels = batches[i % len(batches)]
        metrics.accumulate(predictions, labels, 0.0)
    get_started = time.perf_counter()
    result = metrics.get()
    end = time.perf_counter()
    return result, end - wall, time.process_time() - cpu, end - get_started


def starter_loop(predictions: np.ndarray, labels: np.ndarray, top_k: int) -> dict:
    """The starter kit's eval_util algorithms as plain Python loops (argpartition top-k per video,
    per-class lists, AP by sorting), the way it computes them."""
    labels = labels.astype(np.float64)
    num_classes = predictions.shape[1]
    per_class: list[list] = [[] for _ in range(num_classes)]
    hits = perr = 0.0
    for scores, truth in zip(predictions, labels):
        hits += truth[np.argmax(scores)]
        m = int(truth.sum())
        top = np.argpartition(scores, -m)[-m:] if m else np.arange(num_classes)
        perr += sum(truth[c] for c in top if scores[c] > 0) / top.size
        for c in np.argpartition(scores, -top_k)[-top_k:]:
            per_class[c].append((scores[c], truth[c]))

    def average_precision(pairs: list, num_positives: float) -> float:
        found, total = 0, 0.0
        for rank, (_, actual) in enumerate(sorted(pairs, key=lambda p: p[0], reverse=True), start=1):
            if actual > 0:
                found += 1
                total += found / rank
        return total / num_positives if num_positives else 0.0

    positives = labels.sum(axis=0).astype(np.float64)
    aps = [average_precision(per_class[c], positives[c]) for c in range(num_classes)]
    return {"gap": average_precision([p for pairs in per_class for p in pairs], positives.sum()),
            "map_all_classes": float(np.mean(aps)), "hit_at_one": hits / len(labels),
            "perr": perr / len(labels)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=100_000)
    parser.add_argument("--baseline_videos", type=int, default=2_000)
    parser.add_argument("--num_classes", type=int, default=3862)
    parser.add_argument("--top_k", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="Best of this many runs is reported.")
    parser.add_argument("--pool_budget", type=int, help="EvaluationMetrics' pool_budget (default: its own).")
    args = parser.parse_args()
    budget = {} if args.pool_budget is None else {"pool_budget": args.pool_budget}
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    batches = [make_batch(rng, args.num_classes) for _ in range(DISTINCT_BATCHES)]

    runs = [time_fast(batches, args.videos, args.num_classes, args.top_k, budget) for _ in range(args.repeats)]
    result, wall, cpu, get_seconds = min(runs, key=lambda run: run[1])
    videos = result["num_videos"]
    print(json.dumps({"what": "EvaluationMetrics accumulate+get", "videos": videos,
                      "classes": args.num_classes, "seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
                      "get_seconds": round(get_seconds, 3), "videos_per_sec": round(videos / wall),
                      "videos_per_cpu_sec": round(videos / cpu),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "gap": result["gap"], "map": result["map"]}))
    if not args.baseline_videos:
        return

    subset = np.concatenate([batches[0][0], batches[1][0]])[:args.baseline_videos]
    subset_labels = np.concatenate([batches[0][1], batches[1][1]])[:args.baseline_videos]
    start = time.perf_counter()
    baseline = starter_loop(subset, subset_labels, args.top_k)
    seconds = time.perf_counter() - start
    metrics = EvaluationMetrics(args.num_classes, args.top_k)
    metrics.accumulate(subset, subset_labels)
    fast = metrics.get()
    print(json.dumps({"what": "starter-kit-style Python loop", "videos": len(subset), "seconds": round(seconds, 3),
                      "videos_per_sec": round(len(subset) / seconds),
                      "max_abs_difference": float(max(abs(fast[name] - baseline[name]) for name in baseline))}))


if __name__ == "__main__":
    main()

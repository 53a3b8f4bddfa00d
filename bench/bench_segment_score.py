"""Segment scoring throughput (`yt8m score --segment_labels`): reading the rated pairs (label CSV and TFRecord
shards) and scoring a Class,Segments submission streamed row by row, on synthetic files in a temp dir; prints JSON.

Run on demand: `.venv/bin/python bench/bench_segment_score.py [--rated_pairs 500000] [--classes 1000]
[--per_class 10000]` (`--per_class 100000` is a full Kaggle-size submission, about 1.5 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

import numpy as np

from yt8m.data.format.encode import encode_frame_example
from yt8m.data.format.tfrecord import TFRecordWriter
from yt8m.eval.segment_score import (
    LABELS_CSV_HEADER,
    SUBMISSION_HEADER,
    read_rated_segments_csv,
    read_rated_segments_tfrecords,
    score_segment_submission,
)

NUM_CLASSES = 3862
SEGMENTS_PER_VIDEO = 5
POSITIVE_RATE = 0.3


def make_pairs(rng: np.random.Generator, rated_pairs: int, classes: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Distinct segment ids VIDEOID:START, each rated for one class (of `classes` spread over the vocabulary)."""
    videos = rated_pairs // SEGMENTS_PER_VIDEO + 1
    pair = np.arange(rated_pairs)
    segment_ids = [f"v{video:07d}:{start}" for video, start in
                   zip((pair % videos).tolist(), (SEGMENTS_PER_VIDEO * (pair // videos)).tolist())]
    vocabulary = np.sort(rng.choice(NUM_CLASSES, size=classes, replace=False))
    return segment_ids, vocabulary[rng.integers(0, classes, rated_pairs)], rng.random(rated_pairs) < POSITIVE_RATE


def write_labels_csv(path: str, segment_ids: list[str], labels: np.ndarray, positive: np.ndarray) -> None:
    with open(path, "w") as out:
        out.write(LABELS_CSV_HEADER + "\n")
        out.writelines(f"{s},{c},{int(p)}\n" for s, c, p in zip(segment_ids, labels.tolist(), positive.tolist()))


def write_shard(path: str, segment_ids: list[str], labels: np.ndarray, positive: np.ndarray) -> None:
    """One record per video with its rated segments (one zero byte per frame: frames are not decoded)."""
    by_video: dict[str, list] = {}
    for segment_id, label, rating in zip(segment_ids, labels.tolist(), positive.tolist()):
        video, start = segment_id.split(":")
        by_video.setdefault(video, []).append((int(start), label, float(rating)))
    with TFRecordWriter(path) as writer:
        for video, rated in by_video.items():
            starts, classes, scores = zip(*rated)
            frames = {"rgb": np.zeros((max(starts) + SEGMENTS_PER_VIDEO, 1), np.uint8)}
            writer.write(encode_frame_example(video, tuple(sorted(set(classes))), frames,
                                              {"segment_start_times": starts, "segment_labels": classes,
                                               "segment_scores": scores}))


def write_submission(path: str, rng: np.random.Generator, segment_ids: list[str], labels: np.ndarray,
                     per_class: int) -> int:
    """Per class, its rated segments among a random window of other segment ids, `per_class` ids in all."""
    total = len(segment_ids)
    submitted = 0
    with open(path, "w") as out:
        out.write(SUBMISSION_HEADER + "\n")
        for class_id in np.unique(labels).tolist():
            own = np.flatnonzero(labels == class_id)
            window = (int(rng.integers(total)) + np.arange(min(per_class, total))) % total
            row = np.concatenate([own, window[~np.isin(window, own)]])[:per_class]
            rng.shuffle(row)
            out.write(f"{class_id}," + " ".join(map(segment_ids.__getitem__, row.tolist())) + "\n")
            submitted += len(row)
    return submitted


def timed(function, *args, repeats: int = 1):
    """(the result, the best time of `repeats` calls)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        result = function(*args)
        best = min(best, time.perf_counter() - started)
    return result, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rated_pairs", type=int, default=500_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--per_class", type=int, default=10_000, help="Segment ids per submission row.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="Reads of the rated pairs timed; the best is kept.")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    segment_ids, labels, positive = make_pairs(rng, args.rated_pairs, args.classes)
    with tempfile.TemporaryDirectory(prefix="yt8m-bench-segment-score-") as folder:
        labels_csv, shard, submission = (os.path.join(folder, name) for name in
                                         ("labels.csv", "labels.tfrecord", "submission.csv"))
        write_labels_csv(labels_csv, segment_ids, labels, positive)
        write_shard(shard, segment_ids, labels, positive)
        submitted = write_submission(submission, rng, segment_ids, labels, args.per_class)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rated, csv_seconds = timed(read_rated_segments_csv, labels_csv, NUM_CLASSES, repeats=args.repeats)
        from_shard, shard_seconds = timed(read_rated_segments_tfrecords, shard, NUM_CLASSES, repeats=args.repeats)
        assert all((getattr(from_shard, name) == getattr(rated, name)).all()
                   for name in ("videos", "classes", "video_index", "starts", "ratings"))
        del from_shard
        rss_rated = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        result, score_seconds = timed(score_segment_submission, submission, rated, 100_000)
        rss_scored = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        submission_mb = os.path.getsize(submission) / 1e6
    print(json.dumps({
        "rated_pairs": args.rated_pairs,
        "label_csv_read_s": round(csv_seconds, 3),
        "label_csv_rated_pairs_per_s": round(args.rated_pairs / csv_seconds),
        "tfrecord_read_s": round(shard_seconds, 3),
        "tfrecord_rated_pairs_per_s": round(args.rated_pairs / shard_seconds),
        "submission_rows": result["num_classes_submitted"],
        "submitted_segments": submitted,
        "submission_mb": round(submission_mb, 1),
        "score_s": round(score_seconds, 3),
        "submitted_segments_per_s": round(submitted / score_seconds),
        "submission_mb_per_s": round(submission_mb / score_seconds, 1),
        "csv_read_plus_score_rated_pairs_per_s": round(args.rated_pairs / (csv_seconds + score_seconds)),
        "peak_rss_mb": {"after_generating": rss_before // 1024, "after_reading_labels": rss_rated // 1024,
                        "after_scoring": rss_scored // 1024},
        "segment_map": result["segment_map"],
    }))


if __name__ == "__main__":
    main()

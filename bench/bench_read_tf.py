"""TensorFlow's tf.data on the same shards, for the side-by-side figures of bench_read.py (reference only).

Needs TensorFlow in its own environment (yt8m never imports it), e.g.
`python -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu`, then
`/tmp/tfvenv/bin/python bench/bench_read_tf.py --data_dir DIR` on the DIR bench_read.py wrote.
Video level: TFRecordDataset -> batch(1024) -> parse_example (the starter kit's reader); frame level:
parse_single_sequence_example per video, bytes decoded to uint8 and dequantized to float, batch(64).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import tensorflow as tf

FEATURES = {"video": ["mean_rgb", "mean_audio"], "frame": ["rgb", "audio"]}
SIZES = [1024, 128]


def _video_dataset(files: list[str], batch_size: int, readers: int) -> tf.data.Dataset:
    spec = {"id": tf.io.FixedLenFeature([], tf.string), "labels": tf.io.VarLenFeature(tf.int64)}
    spec.update({name: tf.io.FixedLenFeature([size], tf.float32) for name, size in zip(FEATURES["video"], SIZES)})
    records = tf.data.TFRecordDataset(files, num_parallel_reads=readers)
    return records.batch(batch_size).map(lambda serialized: tf.io.parse_example(serialized, spec),
                                         num_parallel_calls=tf.data.AUTOTUNE)


def _frame_video(serialized: tf.Tensor) -> dict:
    context = {"id": tf.io.FixedLenFeature([], tf.string), "labels": tf.io.VarLenFeature(tf.int64)}
    lists = {name: tf.io.FixedLenSequenceFeature([], tf.string) for name in FEATURES["frame"]}
    parsed_context, parsed_lists = tf.io.parse_single_sequence_example(serialized, context, lists)
    frames = [tf.io.decode_raw(parsed_lists[name], tf.uint8) for name in FEATURES["frame"]]
    features = tf.cast(tf.concat(frames, axis=1)[:300], tf.float32) * (4.0 / 255.0) + (4.0 / 512.0) - 2.0
    return {"id": parsed_context["id"], "features": features, "num_frames": tf.shape(features)[0]}


def _frame_dataset(files: list[str], batch_size: int, readers: int) -> tf.data.Dataset:
    records = tf.data.TFRecordDataset(files, num_parallel_reads=readers)
    videos = records.map(_frame_video, num_parallel_calls=tf.data.AUTOTUNE)
    return videos.padded_batch(batch_size, padded_shapes={"id": [], "features": [None, sum(SIZES)],
                                                          "num_frames": []})


def _time(dataset: tf.data.Dataset, files: list[str]) -> dict:
    examples = 0
    start = time.perf_counter()
    for batch in dataset:
        examples += int(tf.shape(batch["id"])[0])
    seconds = time.perf_counter() - start
    megabytes = sum(os.path.getsize(path) for path in files) / 1e6
    return {"examples": examples, "seconds": round(seconds, 3), "examples_per_sec": round(examples / seconds, 1),
            "mb_per_sec": round(megabytes / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", required=True, help="The folder bench_read.py wrote (video/, frame/).")
    parser.add_argument("--repeats", type=int, default=2, help="Timed passes per setting; the best is kept.")
    parser.add_argument("--readers", default="1,2", help="Comma-separated num_parallel_reads values.")
    parser.add_argument("--kinds", default="video,frame", help="Which of video, frame to time.")
    args = parser.parse_args()
    builders = {"video": (_video_dataset, 1024), "frame": (_frame_dataset, 64)}
    for kind in args.kinds.split(","):
        build, batch_size = builders[kind]
        files = sorted(glob.glob(os.path.join(args.data_dir, kind, "train-*")))
        for readers in [int(r) for r in args.readers.split(",")]:
            best = max((_time(build(files, batch_size, readers), files) for _ in range(args.repeats)),
                       key=lambda result: result["examples_per_sec"])
            print(json.dumps({"kind": kind, "tensorflow": tf.__version__, "num_parallel_reads": readers,
                              "batch_size": batch_size, **best}), flush=True)


if __name__ == "__main__":
    main()

"""Decode-speed benchmark of the data layer: TFRecord reading and Example/SequenceExample decoding.

Run on demand: `.venv/bin/python bench/bench_decode.py [--video_records N] [--frame_records N] [--processes P]`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Sequence

import numpy as np
import torch

from yt8m.data.format.decode import LabelIds, decode_frame, decode_video, decode_video_batch, dequantize
from yt8m.data.format.encode import encode_frame_example, encode_video_example
from yt8m.data.format.tfrecord import TFRecordWriter, read_records

VIDEO_NAMES, VIDEO_SIZES = ["mean_rgb", "mean_audio"], [1024, 128]
FRAME_NAMES, FRAME_SIZES = ["rgb", "audio"], [1024, 128]
NUM_CLASSES = 3862
BATCH = 1024


def video_payloads(count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    features = rng.uniform(-2, 2, (count, 1152)).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, (count, 3))
    return [encode_video_example(f"{seed:02x}{i:06x}", labels[i].tolist(),
                                 {"mean_rgb": features[i, :1024], "mean_audio": features[i, 1024:]})
            for i in range(count)]


def frame_payloads(count: int, seed: int, num_frames: int = 300) -> list[bytes]:
    rng = np.random.default_rng(seed)
    distinct = [rng.integers(0, 256, (num_frames, 1152), dtype=np.uint8) for _ in range(8)]
    return [encode_frame_example(f"{seed:02x}{i:06x}", [i % NUM_CLASSES],
                                 {"rgb": distinct[i % 8][:, :1024], "audio": distinct[i % 8][:, 1024:]})
            for i in range(count)]


def write(path: str, payloads: Sequence[bytes]) -> None:
    with TFRecordWriter(path) as writer:
        for payload in payloads:
            writer.write(payload)


def batches(payloads: Sequence[bytes]) -> list[Sequence[bytes]]:
    return [payloads[i:i + BATCH] for i in range(0, len(payloads), BATCH)]


def decode_video_batches(chunks: Sequence[Sequence[bytes]]) -> list[LabelIds]:
    return [decode_video_batch(chunk, VIDEO_NAMES, VIDEO_SIZES, NUM_CLASSES).labels for chunk in chunks]


def multi_hot(label_batches: Sequence[LabelIds]) -> None:
    for labels in label_batches:
        labels.multi_hot(NUM_CLASSES)


def decode_video_each(payloads: Sequence[bytes]) -> None:
    for payload in payloads:
        decode_video(payload, VIDEO_NAMES, VIDEO_SIZES, NUM_CLASSES)


def decode_frames(payloads: Sequence[bytes]) -> None:
    for payload in payloads:
        dequantize(decode_frame(payload, FRAME_NAMES, FRAME_SIZES, NUM_CLASSES)[2])


def protobuf_example_class() -> type:
    """tf.train.Example built at run time for the `protobuf` package (TensorFlow's .proto, no TensorFlow)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="yt8m_bench_example.proto", package="bench", syntax="proto3")

    def message(name: str, fields: list, container=proto.message_type) -> descriptor_pb2.DescriptorProto:
        built = container.add(name=name)
        for number, (field_name, kind, type_name) in enumerate(fields, start=1):
            repeated = field_name == "feature" or (field_name == "value" and name.endswith("List"))
            label = field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL
            built.field.add(name=field_name, number=number, type=kind, label=label, type_name=type_name)
        return built

    message("BytesList", [("value", field.TYPE_BYTES, None)])
    message("FloatList", [("value", field.TYPE_FLOAT, None)])
    message("Int64List", [("value", field.TYPE_INT64, None)])
    feature = message("Feature", [(f"{kind}_list", field.TYPE_MESSAGE, f".bench.{kind.capitalize()}List")
                                  for kind in ("bytes", "float", "int64")])
    feature.oneof_decl.add(name="kind")
    for member in feature.field:
        member.oneof_index = 0
    features = message("Features", [("feature", field.TYPE_MESSAGE, ".bench.Features.FeatureEntry")])
    entry = message("FeatureEntry", [("key", field.TYPE_STRING, None), ("value", field.TYPE_MESSAGE, ".bench.Feature")],
                    container=features.nested_type)
    entry.options.map_entry = True
    message("Example", [("features", field.TYPE_MESSAGE, ".bench.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Example"))


def decode_with_protobuf(example_class: type, payloads: Sequence[bytes]) -> None:
    for payload in payloads:
        feature = example_class.FromString(payload).features.feature
        feature["id"].bytes_list.value[0].decode()
        np.array(feature["labels"].int64_list.value, dtype=np.int64)
        np.concatenate([np.array(feature[name].float_list.value, dtype=np.float32) for name in VIDEO_NAMES])


def read_only(path: str) -> int:
    return sum(1 for _ in read_records(path))


def read_decode_video(path: str) -> int:
    records = (payload for _, payload in read_records(path))
    count = 0
    while chunk := list(itertools.islice(records, BATCH)):
        decode_video_batches([chunk])
        count += len(chunk)
    return count


def read_decode_frames(path: str) -> int:
    count = 0
    for _, payload in read_records(path):
        decode_frames([payload])
        count += 1
    return count


def cpu_seconds() -> float:
    """CPU time of this process and its finished children: on a shared machine, wall time overstates cost."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def report(label: str, records: int, nbytes: int, run: Callable[[], object]) -> None:
    wall, cpu = time.perf_counter(), cpu_seconds()
    run()
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    print(f"{label:<44} {records:>8} rec {wall:7.2f} s  {records / wall:>10,.0f} rec/s  "
          f"{nbytes / wall / 1e6:>7,.0f} MB/s  | per core-second of CPU: {records / max(cpu, 1e-9):>9,.0f} rec, "
          f"{nbytes / max(cpu, 1e-9) / 1e6:>6,.0f} MB", flush=True)


def _one_thread() -> None:
    # As DataLoader workers do: a child forked after torch ran parallel ops hangs in its first one otherwise.
    torch.set_num_threads(1)


def run_parallel(function: Callable[[str], int], paths: Sequence[str]) -> None:
    with ProcessPoolExecutor(len(paths), initializer=_one_thread) as pool:
        assert sum(pool.map(function, paths)) > 0


def bench_kind(kind: str, payloads: list[bytes], folder: str, processes: int) -> None:
    nbytes = sum(map(len, payloads))
    shard_paths = [os.path.join(folder, f"{kind}-{i}.tfrecord") for i in range(processes)]
    for index, path in enumerate(shard_paths):
        write(path, payloads[index::processes])
    file_bytes = sum(os.path.getsize(p) for p in shard_paths)
    n = len(payloads)
    report(f"{kind}: read_records (page cache)", n, file_bytes, lambda: sum(map(read_only, shard_paths)))
    if kind == "video":
        report("video: decode_video, one record at a time", n, nbytes, lambda: decode_video_each(payloads))
        chunks = batches(payloads)
        report(f"video: decode_video_batch({BATCH})", n, nbytes, lambda: decode_video_batches(chunks))
        example_class = protobuf_example_class()
        sample = payloads[:20_000]
        report("video: protobuf (upb) parse only", len(sample), sum(map(len, sample)),
               lambda: [example_class.FromString(p) for p in sample])
        report("video: protobuf (upb) parse + numpy", len(sample), sum(map(len, sample)),
               lambda: decode_with_protobuf(example_class, sample))
        label_batches = decode_video_batches(chunks)
        report(f"video: LabelIds.multi_hot({BATCH} x {NUM_CLASSES})", n, 0, lambda: multi_hot(label_batches))
        pipeline = read_decode_video
    else:
        report("frame: decode_frame + dequantize", n, nbytes, lambda: decode_frames(payloads))
        pipeline = read_decode_frames
    report(f"{kind}: read + decode, 1 process", n, file_bytes, lambda: sum(map(pipeline, shard_paths)))
    if processes > 1:
        report(f"{kind}: read + decode, {processes} processes", n, file_bytes,
               lambda: run_parallel(pipeline, shard_paths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--video_records", type=int, default=100_000)
    parser.add_argument("--frame_records", type=int, default=2_000)
    parser.add_argument("--processes", type=int, default=2, help="also run read + decode on this many cores")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="yt8m_bench_decode_") as folder:
        print(f"generating {args.video_records} video-level records ...", flush=True)
        bench_kind("video", video_payloads(args.video_records, seed=1), folder, args.processes)
        print(f"generating {args.frame_records} frame-level records of 300 frames ...", flush=True)
        bench_kind("frame", frame_payloads(args.frame_records, seed=2), folder, args.processes)


if __name__ == "__main__":
    main()

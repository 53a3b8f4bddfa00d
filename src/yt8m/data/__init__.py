"""Reading and writing YouTube-8M data: TFRecord framing, Example wire format, datasets, synthetic data.

Modules: tfrecord (framing, globs); wire_scan, layout, example_parse, decode, encode, batch_decode (the wire format);
dataset (PyTorch) over read_plan, shard_reader, batch_build, cache, delivery, batch_memory, read_stats; synthetic.
"""

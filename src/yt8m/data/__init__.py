"""YouTube-8M data, in three rooms: `format` (TFRecord framing, Example and SequenceExample parsing and encoding, the
native decoder), `reading` (the read plan, shard reader, batches, delivery, RAM cache, memory budget: what a dataset
does with shards), and `making` (shards downloaded, synthesized, or written from one's own videos).

The format imports neither of the others (import-linter's contract in pyproject.toml): reading and making build on it.
The 2019 segment task's rated classes (segment_label_ids.csv) are this package's data.
"""

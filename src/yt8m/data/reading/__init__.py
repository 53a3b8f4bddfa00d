"""Shards read into batches: which records each reader takes (read_plan), one reader's batches (shard_reader,
batch_build, batch_memory), how they reach the consumer (delivery, device_prefetch), the RAM cache (cache,
cache_estimate), what the machine can hold (memory_budget), what reading met (read_stats), the PyTorch dataset over
them (dataset), the feature and reading settings (spec), and what shards hold for inspection (inspection)."""

"""Reading and writing files: local paths and object storage, atomic durable writes, spilled temporary
data, the train-dir lock and checkpoint files."""

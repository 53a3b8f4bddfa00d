"""Shards made: downloaded by the dataset's own protocol (download), synthesized to be learnable (synthetic), or
written from one's own videos and features (videos)."""

"""read_videos: the videos of YouTube-8M shards, or of one's own (yt8m.write_videos), as batches, the features
named as `yt8m train`'s flags name them."""

from __future__ import annotations

from typing import Any, Optional

from yt8m.config import config_from_dict
from yt8m.data.reading.dataset import YT8MDataset
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.data.reading.spec import FeatureSpec


def read_videos(pattern: str, batch_size: int = 1024, shuffle: bool = False, features: Optional[FeatureSpec] = None,
                **feature_values: Any) -> YT8MDataset:
    """The videos of YouTube-8M shards (or of one's own, write_videos'), as batches, one pass per `iter()`: each a
    yt8m.data.reading.batch.Batch with video_ids, features (float32 [videos, size]; frame level: uint8 [videos, frames,
    size] as stored, with num_frames; yt8m.dequantize makes them float) and labels (bool [videos, classes]).

    Args:
        pattern: file glob(s), comma-separated; local paths or fsspec URLs.
        batch_size: videos per batch.
        shuffle: shuffle the file order and the records (seeded).
        features: the features to decode (a FeatureSpec); or give them as `yt8m train`'s flags: feature_names,
            feature_sizes, frame_features, max_frames, num_classes, segment_labels.

    Raises:
        ValueError: the features given have problems (every one named), or a shard cannot be read.

    Examples:
        >>> import os, tempfile, numpy as np, yt8m
        >>> path = os.path.join(tempfile.mkdtemp(), "train-0.tfrecord")
        >>> _ = yt8m.write_videos(path, [{"id": "v1", "labels": [3], "features": {"clip": np.ones(4, np.float32)}}])
        >>> batch = next(iter(yt8m.read_videos(path, feature_names="clip", feature_sizes="4", num_classes=5)))
        >>> batch.video_ids, tuple(batch.features.shape), batch.labels.nonzero().tolist()
        (['v1'], (1, 4), [[0, 3]])
    """
    spec = features if features is not None else config_from_dict(FeatureSpec, feature_values, "read_videos()")
    return YT8MDataset(pattern, spec.checked(), batch_size, ReadOptions(shuffle=shuffle))

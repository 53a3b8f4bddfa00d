"""Videos of one's own as YouTube-8M data: `write_videos` writes them as the TFRecords the reader takes (one's own
features beside or instead of YouTube-8M's); `quantize` and `dequantize_frames` convert frames between float and the
uint8 the format stores."""

from __future__ import annotations

import gzip
from typing import Any, Iterable, Mapping, Optional

import numpy as np
import torch

from yt8m.data.format.decode import dequantize, quantization_scale_bias
from yt8m.data.format.encode import encode_frame_example, encode_video_example
from yt8m.data.format.tfrecord import framed_record
from yt8m.io.files import atomic_writer

VIDEO_FIELDS = ("id", "labels", "features", "frames", "segments")
# The range YouTube-8M quantizes into 256 levels (dequantize's defaults).
QUANTIZED_RANGE = (-2.0, 2.0)


def write_videos(path: str, videos: Iterable[Mapping[str, Any]], compression: Optional[str] = None,
                 id_key: str = "id") -> int:
    """Write videos as one TFRecord shard of YouTube-8M records; returns how many were written.

    Each video is a mapping: "id" (str), "labels" (class indices; None for test data, as YouTube-8M's test shards),
    and either "features" (video level: name -> float32 vector, e.g. {"clip_embedding": v} with v of shape [512]) or
    "frames" (frame level: name -> uint8 array [frames, size], quantize() makes it from floats in [-2, 2]), with
    optional 2019 "segments". Every video of a shard has the same features and sizes; read them back with
    `--feature_names clip_embedding --feature_sizes 512` (or read_videos). The file appears whole or not at all; a
    bad video is a ValueError naming the file, the video and the field.

    Args:
        path: the shard to write (local, or an fsspec URL such as s3://bucket/x.tfrecord).
        videos: the videos, as above.
        compression: None, or "GZIP" (TensorFlow's compressed TFRecord).
        id_key: "id" (YouTube-8M 2018 and later) or "video_id" (2017).

    Examples:
        >>> import numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "train-0.tfrecord")
        >>> write_videos(path, [{"id": "v1", "labels": [3], "features": {"clip": np.ones(4, np.float32)}}])
        1
    """
    if (compression or "NONE").upper() not in ("NONE", "GZIP"):
        raise ValueError(f"compression must be None or 'GZIP', got {compression!r}")
    count, layout = 0, None
    with atomic_writer(path, binary=True) as out:
        stream = gzip.GzipFile(fileobj=out, mode="wb") if compression else out
        for index, video in enumerate(videos):
            payload, shape = _encoded(video, id_key, f"{path}: video {index}")
            if layout is not None and shape != layout:
                raise ValueError(f"{path}: video {index} ({video.get('id')}): its features {shape} differ from the "
                                 f"first video's {layout}: every video of a shard has the same features and sizes")
            layout = shape
            stream.write(framed_record(payload))
            count += 1
        if stream is not out:
            stream.close()
    return count


def _encoded(video: Mapping[str, Any], id_key: str, where: str) -> tuple[bytes, dict[str, Any]]:
    """A video's record, and its layout (level, feature names and sizes) that every video of the shard shares."""
    if not isinstance(video, Mapping):
        raise ValueError(f"{where}: expected a mapping with id, labels and features (or frames), got "
                         f"{type(video).__name__}")
    where = f"{where} ({video.get('id')})"
    unknown = sorted(set(video) - set(VIDEO_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (fields: {', '.join(VIDEO_FIELDS)})")
    if not isinstance(video.get("id"), str) or not video["id"]:
        raise ValueError(f"{where}: field 'id' must be a non-empty string, got {video.get('id')!r}")
    if ("features" in video) == ("frames" in video):
        raise ValueError(f"{where}: give 'features' (video level) or 'frames' (frame level), one of them")
    labels = _labels(video.get("labels"), where)
    try:
        if "features" in video:
            vectors = {name: _vector(values, f"{where}: field 'features.{name}'")
                       for name, values in _named(video["features"], where, "features").items()}
            return (encode_video_example(video["id"], labels, vectors, id_key),
                    {"level": "video", **{name: len(v) for name, v in vectors.items()}})
        frames = {name: _frames(values, f"{where}: field 'frames.{name}'")
                  for name, values in _named(video["frames"], where, "frames").items()}
        return (encode_frame_example(video["id"], labels, frames, video.get("segments"), id_key),
                {"level": "frame", **{name: f.shape[1] for name, f in frames.items()}})
    except ValueError as err:
        message = str(err)
        raise ValueError(message if message.startswith(where) else f"{where}: {message}") from err


def _named(values: Any, where: str, field: str) -> Mapping[str, Any]:
    if not isinstance(values, Mapping) or not values:
        raise ValueError(f"{where}: field '{field}' must map feature names to arrays, got {type(values).__name__}")
    return values


def _labels(labels: Any, where: str) -> Optional[list[int]]:
    if labels is None:
        return None
    array = np.asarray(labels)
    if array.ndim != 1 or (array.size and (not np.issubdtype(array.dtype, np.integer) or array.min() < 0)):
        raise ValueError(f"{where}: field 'labels' must be a list of class indices (integers >= 0), got {labels!r}")
    return [int(label) for label in array]


def _vector(values: Any, where: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float32)
    if array.ndim != 1 or not array.size or not np.isfinite(array).all():
        raise ValueError(f"{where}: must be a non-empty vector of finite floats, got shape {array.shape}")
    return array


def _frames(values: Any, where: str) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype != np.uint8:
        raise ValueError(f"{where}: frames are stored as uint8 (YouTube-8M's quantization): pass quantize(values), "
                         f"got {array.dtype}")
    if array.ndim != 2 or not array.shape[1]:
        raise ValueError(f"{where}: must be an array [frames, size], got shape {array.shape}")
    return array


def quantize(values: Any) -> np.ndarray:
    """Float features in [-2, 2] as YouTube-8M's uint8 levels (values beyond are clipped), the inverse of dequantize:
    dequantize(quantize(x)) is within 4 / 255 / 2 of x."""
    scale, bias = map(float, quantization_scale_bias(*reversed(QUANTIZED_RANGE)))
    array = np.asarray(values, dtype=np.float64)
    return np.clip(np.rint((array - bias) / scale), 0, 255).astype(np.uint8)


def dequantize_frames(frames: np.ndarray | torch.Tensor, num_frames: Any = None) -> np.ndarray | torch.Tensor:
    """uint8 frames (a batch's [videos, frames, size], or one video's [frames, size]) as float32, bit for bit what
    the models see: q * scale + bias rounded as YouTube-8M's starter code, padding frames (at and after each video's
    `num_frames`) zero. A torch tensor stays on its device.

    Examples:
        >>> dequantize_frames(np.array([[0, 255]], np.uint8))
        array([[-1.9921875,  2.0078125]], dtype=float32)
    """
    if isinstance(frames, torch.Tensor):
        scale, bias = map(float, quantization_scale_bias())
        values = frames.float().mul_(scale).add_(bias)
        if num_frames is not None:
            positions = torch.arange(values.shape[-2], device=values.device)
            values[positions >= torch.as_tensor(num_frames, device=values.device).reshape(*values.shape[:-2], 1)] = 0
        return values
    array = dequantize(np.asarray(frames))
    if num_frames is not None:  # padding: [videos, frames], or [frames] for one video
        array[np.arange(array.shape[-2]) >= np.asarray(num_frames).reshape(*array.shape[:-2], 1)] = 0
    return array

"""What a record holds and how shards are read: the `features` section of the train and eval configs (FeatureSpec),
the train config's `data` section, and the reading settings (reader processes, damaged records) every command that
reads shards shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from yt8m.fields import setting

READERS_HELP = ("DataLoader worker processes reading the shards, or 'auto': in-process where that is fastest "
                "(video-level data; frame-level data below 4 CPUs), else workers; the choice is logged.")
SKIP_CORRUPT_HELP = ("Skip what is damaged instead of failing, with a warning and a count in the summary: a record "
                     "that does not decode (wrong size, NaN, bad label), or the rest of a shard after a CRC error or "
                     "truncation.")
SEGMENT_LABELS_HELP = ("The 2019 segment task: each rated segment of frame-level data is an example (--segment_size "
                       "frames from its start time, id VIDEOID:START), labelled by its ratings; only rated (segment, "
                       "class) pairs count in the loss and the metrics.")
SEGMENT_SIZE_HELP = "Frames (one per second) per 2019 segment."


def reader_count_problem(value: Any) -> Optional[str]:
    """The check of --num_readers: 'auto' or a count."""
    if str(value) == "auto" or str(value).isdigit():
        return None
    return f"must be 'auto' or a number of processes >= 0, got {value!r}"


def num_readers_setting() -> Any:
    return setting("auto", READERS_HELP, check=reader_count_problem)


def skip_corrupt_setting() -> Any:
    return setting(False, SKIP_CORRUPT_HELP)


@dataclass(frozen=True)
class FeatureSpec:
    """Which features to decode and how: names and sizes concatenated in order, frame or video level, the label
    space; with `segment_labels`, every rated 2019 segment of `segment_size` frames is an example."""

    feature_names: list[str] = setting(["mean_rgb"], "Feature names, concatenated in this order (comma-separated).")
    feature_sizes: list[int] = setting([1024], "Sizes of the features in --feature_names (comma-separated).")
    frame_features: bool = setting(False, "Read frame-level SequenceExamples instead of video-level Examples.")
    max_frames: int = setting(300, "Frame-level: keep at most this many frames per video.", at_least=1)
    num_classes: int = setting(3862, "Number of classes (3862 for 2018+ data, 4716 for 2017 data).", at_least=1)
    segment_labels: bool = setting(False, SEGMENT_LABELS_HELP)
    segment_size: int = setting(5, SEGMENT_SIZE_HELP, at_least=1)

    @property
    def feature_size(self) -> int:
        return sum(self.feature_sizes)

    def problems(self) -> list[str]:
        names, sizes = self.feature_names, self.feature_sizes
        if len(names) != len(sizes) or not names:
            return [f"--feature_names ({','.join(names)}) and --feature_sizes ({','.join(map(str, sizes))}) must "
                    "list the same number of entries"]
        if min(sizes) < 1:
            return [f"--feature_sizes must be positive, got {','.join(map(str, sizes))}"]
        if min(self.max_frames, self.num_classes, self.segment_size) < 1:
            return [f"--max_frames, --num_classes and --segment_size must be positive: {self}"]
        if self.segment_labels and not self.frame_features:
            return ["--segment_labels reads the segments of frame-level data: set --frame_features"]
        return []

    def checked(self) -> "FeatureSpec":
        """The spec itself where it is valid; a ValueError naming its problems where not (a reader's precondition)."""
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self


@dataclass(frozen=True)
class DataConfig:
    """The `data` section of the train config: the training shards and how they are read."""

    train_data_pattern: str = setting("", "File glob(s) of training shards; comma-separated for several.",
                                      required=True)
    num_readers: str = num_readers_setting()
    skip_corrupt: bool = skip_corrupt_setting()
    shuffle_buffer: int = setting(10000, "Records held in the shuffle buffer of each reader.", at_least=1)
    cache_in_memory: bool = setting(False, "Hold the decoded training set in RAM after the first epoch (frame level: "
                                           "uint8 frames as stored, a quarter of float32's bytes), where its "
                                           "estimate fits the memory available; else the run streams, with a warning.")
    cache_in_memory_required: bool = setting(False, "With --cache_in_memory: refuse to start where the cache's "
                                                    "estimate exceeds the memory available, instead of streaming.")

"""Input-pipeline benchmark: `yt8m bench read PATTERN` times reading shards into batched torch tensors.

Prints one JSON line (examples, seconds, examples_per_sec, mb_per_sec, batches, num_workers) to compare setups.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Sequence

from yt8m.commands.command_line import read_subcommand
from yt8m.config import config_from_dict
from yt8m.data.reading.spec import FeatureSpec, reader_count_problem
from yt8m.data.reading.throughput import read_throughput
from yt8m.fields import setting
from yt8m.runtime import reader_workers, setup_logging

DEFAULT_FEATURES = {False: ("mean_rgb,mean_audio", "1024,128"), True: ("rgb,audio", "1024,128")}


@dataclass(frozen=True)
class BenchReadConfig:
    """What `yt8m bench read` reads, and how."""

    pattern: str = setting("", "File glob(s) of TFRecord shards; comma-separated for several.", required=True,
                           positional=True)
    frame_features: bool = setting(False, "Frame-level SequenceExamples.")
    feature_names: str = setting("", "Features to decode (default: mean_rgb,mean_audio; frame level: rgb,audio).")
    feature_sizes: str = setting("", "Their sizes (default: 1024,128).")
    max_frames: int = setting(FeatureSpec.max_frames, "Frame level: frames kept.", at_least=1)
    num_classes: int = setting(FeatureSpec.num_classes, "Number of classes.", at_least=1)
    batch_size: int = setting(1024, "Examples per batch.", at_least=1)
    num_workers: str = setting("auto", "DataLoader worker processes, 0 to read in-process, or auto: the rule of "
                                       "`--num_readers auto` in train, eval and predict, for these CPUs and this data "
                                       "kind.", check=reader_count_problem)
    max_batches: Optional[int] = setting(None, "Stop after this many batches.", at_least=1)


BENCHMARKS = {"read": (BenchReadConfig, "Time reading and decoding shards into batched tensors.")}


def main(argv: Sequence[str]) -> int:
    _, config = read_subcommand(BENCHMARKS, argv, "yt8m bench", __doc__)
    setup_logging()
    names, sizes = DEFAULT_FEATURES[config.frame_features]
    spec = config_from_dict(FeatureSpec, {
        "feature_names": config.feature_names or names, "feature_sizes": config.feature_sizes or sizes,
        "frame_features": config.frame_features, "max_frames": config.max_frames,
        "num_classes": config.num_classes}, "flags")
    workers = reader_workers(config.num_workers, config.frame_features)
    print(json.dumps(read_throughput(config.pattern, spec, config.batch_size, workers, config.max_batches)))
    return 0

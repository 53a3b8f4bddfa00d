"""`yt8m synth`: write learnable synthetic YouTube-8M shards (video, frame, segment; see yt8m.data.making.synthetic)
and print one JSON line naming what was written (with --kind all, each kind's under its name)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Sequence

from yt8m.commands.command_line import read_command
from yt8m.data.making.synthetic import KINDS, write_synthetic
from yt8m.fields import setting


@dataclass(frozen=True)
class SynthOutput:
    """Where `yt8m synth` writes, and which kind of data."""

    output_dir: str = setting("", "Folder (or fsspec URL) to write <kind>/ folders into.", required=True)
    kind: str = setting("video", "video: Examples; frame: SequenceExamples; segment: frame level with 2019 ratings; "
                                 "all: each.", choices=lambda: (*KINDS, "all"))
    gzip: bool = setting(False, "GZIP-compress the shards (.tfrecord.gz).")


@dataclass(frozen=True)
class SynthSplits:
    """How many videos each split holds, in how many files, from which seed."""

    train_videos: int = setting(2000, "Videos in the train split.", at_least=0)
    validate_videos: int = setting(500, "Videos in the validate split.", at_least=0)
    test_videos: int = setting(500, "Videos in the unlabeled test split.", at_least=0)
    shards: int = setting(4, "Files per split.", at_least=1)
    seed: int = setting(0, "Seed; the same seed writes the same files.", at_least=0)


@dataclass(frozen=True)
class SynthRecords:
    """What each video's record holds."""

    num_classes: int = setting(3862, "Number of classes.", at_least=1)
    feature_sizes: list[int] = setting([1024, 128], "Sizes of the rgb and audio features (comma-separated).")
    min_frames: int = setting(20, "Frame level: fewest frames per video.", at_least=1)
    max_frames: int = setting(100, "Frame level: most frames per video.", at_least=1)
    id_key: str = setting("id", "Name of the id feature: id (2018+) or video_id (2017).",
                          choices=lambda: ("id", "video_id"))

    def problems(self) -> list[str]:
        if self.min_frames > self.max_frames:
            return [f"--min_frames {self.min_frames} is above --max_frames {self.max_frames}"]
        if not self.feature_sizes or min(self.feature_sizes) < 1:
            return [f"--feature_sizes must be positive integers, got {self.feature_sizes}"]
        return []


@dataclass(frozen=True)
class SynthConfig:
    """What `yt8m synth` writes."""

    output: SynthOutput = field(default_factory=SynthOutput)
    splits: SynthSplits = field(default_factory=SynthSplits)
    records: SynthRecords = field(default_factory=SynthRecords)


def main(argv: Sequence[str]) -> int:
    config = read_command(SynthConfig, argv, "yt8m synth", __doc__)
    output, splits, records = config.output, config.splits, config.records
    kinds = KINDS if output.kind == "all" else (output.kind,)
    written = {kind: write_synthetic(output.output_dir, kind=kind, num_classes=records.num_classes,
                                     train_videos=splits.train_videos, validate_videos=splits.validate_videos,
                                     test_videos=splits.test_videos, shards=splits.shards, seed=splits.seed,
                                     feature_sizes=tuple(records.feature_sizes), min_frames=records.min_frames,
                                     max_frames=records.max_frames, id_key=records.id_key, gzip=output.gzip)
               for kind in kinds}
    print(json.dumps({"kind": output.kind, **(written if output.kind == "all" else written[output.kind])}))
    return 0

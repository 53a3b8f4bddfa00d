"""`yt8m convert-predictions`: `yt8m predict --output_format jsonl` output into the Kaggle CSV (each video's top-k
classes, duplicates refused); prints one JSON line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from yt8m.commands.command_line import read_command
from yt8m.fields import setting
from yt8m.inference.predictions import convert_predictions
from yt8m.runtime import setup_logging


@dataclass(frozen=True)
class ConvertConfig:
    """What `yt8m convert-predictions` reads and writes."""

    input: str = setting("", "JSON lines: video_id, class_indexes, predictions.", required=True)
    output: str = setting("", "The Kaggle CSV to write (VideoId,LabelConfidencePairs).", required=True)
    top_k: int = setting(20, "Classes kept per video.", at_least=1)


def main(argv: Sequence[str]) -> int:
    config = read_command(ConvertConfig, argv, "yt8m convert-predictions", __doc__)
    setup_logging()
    videos = convert_predictions(config.input, config.output, config.top_k)
    print(json.dumps({"output_file": config.output, "videos": videos}), flush=True)
    return 0

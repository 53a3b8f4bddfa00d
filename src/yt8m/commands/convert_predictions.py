"""`yt8m convert-predictions`: `yt8m predict --output_format jsonl` output into the Kaggle CSV (each video's top-k
classes, duplicates refused); prints one JSON line."""

from __future__ import annotations

import json
from typing import Sequence

from yt8m.config import FlagParser
from yt8m.inference.predictions import convert_predictions
from yt8m.runtime import setup_logging


def main(argv: Sequence[str]) -> int:
    parser = FlagParser(prog="yt8m convert-predictions",
                        description="Turn `yt8m predict --output_format jsonl` output into the Kaggle CSV.")
    parser.add_argument("--input", required=True, help="JSON lines: video_id, class_indexes, predictions.")
    parser.add_argument("--output", required=True, help="The Kaggle CSV to write (VideoId,LabelConfidencePairs).")
    parser.add_argument("--top_k", type=int, default=20, help="Classes kept per video (default: 20).")
    args = parser.parse_args(argv)
    setup_logging()
    videos = convert_predictions(args.input, args.output, args.top_k)
    print(json.dumps({"output_file": args.output, "videos": videos}), flush=True)
    return 0

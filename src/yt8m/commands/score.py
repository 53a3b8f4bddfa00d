"""`yt8m score`: a Kaggle-format submission (`VideoId,LabelConfidencePairs`) scored against a ground-truth file
(`VideoId,Labels`) with the starter kit's metrics; prints one JSON object."""

from __future__ import annotations

import argparse
import json
from typing import Sequence

from yt8m.runtime import setup_logging
from yt8m.score import score_files


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="yt8m score", description=__doc__.splitlines()[0])
    parser.add_argument("--predictions", required=True, help="Kaggle CSV: VideoId,LabelConfidencePairs.")
    parser.add_argument("--labels", required=True, help="Ground truth CSV: VideoId,Labels (space-separated).")
    parser.add_argument("--top_k", type=int, default=20, help="Predictions per video that count (default: 20).")
    parser.add_argument("--num_classes", type=int, default=3862, help="Number of classes (default: 3862).")
    parser.add_argument("--allow_missing", action="store_true",
                        help="Score labelled videos without predictions as predicting nothing and ignore "
                             "predictions for unknown videos (with a warning) instead of failing.")
    args = parser.parse_args(argv)
    setup_logging()
    result = score_files(args.predictions, args.labels, top_k=args.top_k, num_classes=args.num_classes,
                         allow_missing=args.allow_missing)
    print(json.dumps(result))
    return 0

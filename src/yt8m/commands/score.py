"""`yt8m score`: a Kaggle-format submission (`VideoId,LabelConfidencePairs`) scored against a ground-truth file
(`VideoId,Labels`) or labelled shards with the starter kit's metrics, or with --segment_labels a 2019 segment submission
(`Class,Segments`) scored against rated segments with mAP@K; prints one JSON object."""

from __future__ import annotations

import json
from typing import Sequence

from yt8m.config import FlagParser
from yt8m.eval.score import score_files
from yt8m.eval.segment_metrics import DEFAULT_TOP_N
from yt8m.eval.segment_score import score_segment_files
from yt8m.runtime import setup_logging


def main(argv: Sequence[str]) -> int:
    parser = FlagParser(prog="yt8m score", description=__doc__.splitlines()[0])
    parser.add_argument("--predictions", required=True,
                        help="Kaggle CSV: VideoId,LabelConfidencePairs (with --segment_labels: Class,Segments).")
    parser.add_argument("--labels", required=True,
                        help="The ground truth: a CSV (.csv: VideoId,Labels, space-separated; `yt8m inspect "
                             "--write_labels_csv` writes it) or the labelled TFRecord shards themselves "
                             "(comma-separated paths or globs). With --segment_labels: shards or a label CSV "
                             "(segment_id,class,score).")
    parser.add_argument("--top_k", type=int, default=20, help="Predictions per video that count (default: 20).")
    parser.add_argument("--num_classes", type=int, default=3862, help="Number of classes (default: 3862).")
    parser.add_argument("--allow_missing", action="store_true",
                        help="Score labelled videos without predictions as predicting nothing and ignore "
                             "predictions for unknown videos (with a warning) instead of failing.")
    parser.add_argument("--segment_labels", action="store_true",
                        help="The 2019 segment task: score a Class,Segments submission with mAP@K over classes.")
    parser.add_argument("--top_n", type=int, default=DEFAULT_TOP_N,
                        help=f"With --segment_labels: segments per class that count, K (default: {DEFAULT_TOP_N}).")
    parser.add_argument("--write_labels_csv", default="",
                        help="With --segment_labels: also write the rated segments read as a label CSV, faster "
                             "to read next time.")
    args = parser.parse_args(argv)
    setup_logging()
    if args.segment_labels:
        result = score_segment_files(args.predictions, args.labels, top_n=args.top_n, num_classes=args.num_classes,
                                     write_labels_csv=args.write_labels_csv)
    else:
        result = score_files(args.predictions, args.labels, top_k=args.top_k, num_classes=args.num_classes,
                             allow_missing=args.allow_missing)
    print(json.dumps(result))
    return 0

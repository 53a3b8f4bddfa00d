"""`yt8m synth`: write learnable synthetic YouTube-8M shards (video, frame, segment; see yt8m.data.making.synthetic) and
print one JSON line naming what was written (with --kind all, each kind's under its name)."""

from __future__ import annotations

import argparse
import json
from typing import Optional

from yt8m.config import FlagParser
from yt8m.data.making.synthetic import KINDS, write_synthetic
from yt8m.fields import parse_list


def _parser() -> FlagParser:
    parser = FlagParser(prog="yt8m synth",
                        description="Write learnable synthetic YouTube-8M data (video, frame, segment).",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="Folder (or fsspec URL) to write <kind>/ folders into.")
    parser.add_argument("--kind", choices=KINDS + ("all",), default="video",
                        help="video: Examples; frame: SequenceExamples; segment: frame level with 2019 ratings.")
    parser.add_argument("--num_classes", type=int, default=3862, help="Number of classes.")
    parser.add_argument("--train_videos", type=int, default=2000, help="Videos in the train split.")
    parser.add_argument("--validate_videos", type=int, default=500, help="Videos in the validate split.")
    parser.add_argument("--test_videos", type=int, default=500, help="Videos in the unlabeled test split.")
    parser.add_argument("--shards", type=int, default=4, help="Files per split.")
    parser.add_argument("--min_frames", type=int, default=20, help="Frame level: fewest frames per video.")
    parser.add_argument("--max_frames", type=int, default=100, help="Frame level: most frames per video.")
    parser.add_argument("--feature_sizes", default="1024,128",
                        help="Sizes of the rgb and audio features.")
    parser.add_argument("--seed", type=int, default=0, help="Seed; the same seed writes the same files.")
    parser.add_argument("--id_key", choices=("id", "video_id"), default="id",
                        help="Name of the id feature: id (2018+) or video_id (2017).")
    parser.add_argument("--gzip", action="store_true", help="GZIP-compress the shards (.tfrecord.gz).")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        sizes = tuple(parse_list(args.feature_sizes, int))
    except ValueError as err:
        raise ValueError(f"--feature_sizes must be comma-separated integers, got {args.feature_sizes!r}") from err
    kinds = KINDS if args.kind == "all" else (args.kind,)
    written = {kind: write_synthetic(args.output_dir, kind=kind, num_classes=args.num_classes,
                                     train_videos=args.train_videos, validate_videos=args.validate_videos,
                                     test_videos=args.test_videos, shards=args.shards, seed=args.seed,
                                     feature_sizes=sizes, min_frames=args.min_frames, max_frames=args.max_frames,
                                     id_key=args.id_key, gzip=args.gzip)
               for kind in kinds}
    print(json.dumps({"kind": args.kind, **(written if args.kind == "all" else written[args.kind])}))
    return 0

"""Input-pipeline benchmark: `yt8m bench read PATTERN` times reading shards into batched torch tensors.

Prints one JSON line (examples, seconds, examples_per_sec, mb_per_sec, batches, num_workers) to compare setups.
"""

from __future__ import annotations

import json
from typing import Optional

from yt8m.config import FlagParser, config_from_dict
from yt8m.data.reading.spec import FeatureSpec
from yt8m.data.reading.throughput import read_throughput
from yt8m.runtime import reader_workers, setup_logging

DEFAULT_FEATURES = {False: ("mean_rgb,mean_audio", "1024,128"), True: ("rgb,audio", "1024,128")}
def _parser() -> FlagParser:
    parser = FlagParser(prog="yt8m bench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    read = commands.add_parser("read", help="Time reading and decoding shards into batched tensors.")
    read.add_argument("pattern", help="File glob(s) of TFRecord shards; comma-separated for several.")
    read.add_argument("--frame_features", action="store_true", help="Frame-level SequenceExamples.")
    read.add_argument("--feature_names", default=None,
                      help="Features to decode (default: mean_rgb,mean_audio; frame level: rgb,audio).")
    read.add_argument("--feature_sizes", default=None, help="Their sizes (default: 1024,128).")
    read.add_argument("--max_frames", type=int, default=FeatureSpec.max_frames, help="Frame level: frames kept.")
    read.add_argument("--num_classes", type=int, default=FeatureSpec.num_classes, help="Number of classes.")
    read.add_argument("--batch_size", type=int, default=1024, help="Examples per batch (default: 1024).")
    read.add_argument("--num_workers", default="auto",
                      help="DataLoader worker processes, 0 to read in-process, or auto (default): the rule of "
                           "`--num_readers auto` in train, eval and predict, for these CPUs and this data kind.")
    read.add_argument("--max_batches", type=int, default=None, help="Stop after this many batches.")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging()
    names, sizes = DEFAULT_FEATURES[args.frame_features]
    spec = config_from_dict(FeatureSpec, {
        "feature_names": args.feature_names or names, "feature_sizes": args.feature_sizes or sizes,
        "frame_features": args.frame_features, "max_frames": args.max_frames, "num_classes": args.num_classes}, "flags")
    workers = reader_workers(args.num_workers, args.frame_features)
    result = read_throughput(args.pattern, spec, args.batch_size, workers,
                             args.max_batches)
    print(json.dumps(result))
    return 0

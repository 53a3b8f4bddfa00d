"""`yt8m inspect PATTERN`: summarize YouTube-8M TFRecord shards, or dump every record as one JSON line.

Reads whatever the data layer reads (local, gs://, s3://, GZIP; Example or SequenceExample), values as stored.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from typing import Optional, Sequence, TextIO, cast

from yt8m.config import FlagParser
from yt8m.data.format.tfrecord import expand_pattern
from yt8m.data.reading.inspection import LabelsCsv, RecordSource, Summary, record_json, summary_lines
from yt8m.fields import parse_bool
from yt8m.io.files import atomic_writer
from yt8m.io.spill import TemporaryDatabase


def build_parser() -> FlagParser:
    parser = FlagParser(prog="yt8m inspect", description=__doc__.splitlines()[0])
    parser.add_argument("pattern", help="File path or glob; comma-separated for several (gs://, s3:// too).")
    parser.add_argument("--frame_features", nargs="?", const=True, default=None, type=parse_bool, metavar="BOOL",
                        help="Read records as SequenceExamples (true) or Examples (false). Default: a record "
                             "with a feature_lists field is a SequenceExample.")
    parser.add_argument("--json", action="store_true",
                        help='One JSON object per record and line: {"id", "labels", "features", "num_frames"}.')
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="Stop after N records in all.")
    parser.add_argument("--write_labels_csv", default="", metavar="FILE",
                        help="Also write the ground truth CSV `yt8m score --labels` reads (VideoId,Labels: each "
                             "record's id and distinct labels).")
    parser.add_argument("--skip_corrupt", nargs="?", const=True, default=False, type=parse_bool, metavar="BOOL",
                        help="Skip the rest of a file after a corrupt record (with a warning) instead of failing.")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.limit is not None and args.limit < 0:
        raise ValueError(f"--limit must be >= 0, got {args.limit}")
    logging.basicConfig(format="%(levelname)s: %(message)s")
    paths = expand_pattern(args.pattern)
    source = RecordSource(paths, args.frame_features, args.skip_corrupt, args.limit)
    summary = Summary()
    with contextlib.ExitStack() as stack:
        labels = _labels_csv(stack, args.write_labels_csv, paths)
        for record in source:
            if args.json:
                sys.stdout.write(json.dumps(record_json(record)) + "\n")
            else:
                summary.add(record)
            if labels:
                labels.add(record, source.where)
        if labels:
            labels.close()
    if args.json:
        if source.skipped_files:
            print(f"yt8m inspect: skipped the rest of {len(source.skipped_files)} corrupt file(s)", file=sys.stderr)
    else:
        print("\n".join(summary_lines(summary, paths, source.skipped_files)))
    if labels:
        print(f"yt8m inspect: wrote the labels of {labels.videos} videos to {args.write_labels_csv}", file=sys.stderr)
    return 0


def _labels_csv(stack: contextlib.ExitStack, path: str, paths: Sequence[str]) -> Optional[LabelsCsv]:
    """The --write_labels_csv writer, its file written atomically as the stack closes (none left on an error)."""
    if not path:
        return None
    out = cast(TextIO, stack.enter_context(atomic_writer(path)))  # a writer in text mode
    return LabelsCsv(out, stack.enter_context(TemporaryDatabase()), paths)

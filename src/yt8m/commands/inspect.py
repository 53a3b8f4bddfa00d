"""`yt8m inspect PATTERN`: summarize YouTube-8M TFRecord shards, or dump every record as one JSON line.

Reads whatever the data layer reads (local, gs://, s3://, GZIP; Example or SequenceExample), values as stored.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from dataclasses import dataclass
from typing import Optional, Sequence, TextIO, cast

from yt8m.commands.command_line import read_command
from yt8m.data.format.tfrecord import expand_pattern
from yt8m.data.reading.inspection import LabelsCsv, RecordSource, Summary, record_json, summary_lines
from yt8m.fields import setting
from yt8m.io.files import atomic_writer
from yt8m.io.spill import TemporaryDatabase


@dataclass(frozen=True)
class InspectConfig:
    """What `yt8m inspect` reads, and what it writes of it."""

    pattern: str = setting("", "File path or glob; comma-separated for several (gs://, s3:// too).", required=True,
                           positional=True)
    frame_features: Optional[bool] = setting(None, "Read records as SequenceExamples (true) or Examples (false).",
                                             shown_default="a record with a feature_lists field is a SequenceExample")
    json: bool = setting(False, 'One JSON object per record and line: {"id", "labels", "features", "num_frames"}.')
    limit: Optional[int] = setting(None, "Stop after N records in all.", at_least=0)
    write_labels_csv: str = setting("", "Also write the ground truth CSV `yt8m score --labels` reads (VideoId,Labels: "
                                        "each record's id and distinct labels).")
    skip_corrupt: bool = setting(False, "Skip the rest of a file after a corrupt record (with a warning) instead of "
                                        "failing.")


def main(argv: Sequence[str]) -> int:
    config = read_command(InspectConfig, argv, "yt8m inspect", __doc__)
    logging.basicConfig(format="%(levelname)s: %(message)s")
    paths = expand_pattern(config.pattern)
    source = RecordSource(paths, config.frame_features, config.skip_corrupt, config.limit)
    summary = Summary()
    with contextlib.ExitStack() as stack:
        labels = _labels_csv(stack, config.write_labels_csv, paths)
        for record in source:
            if config.json:
                sys.stdout.write(json.dumps(record_json(record)) + "\n")
            else:
                summary.add(record)
            if labels:
                labels.add(record, source.where)
        if labels:
            labels.close()
    if config.json:
        if source.skipped_files:
            print(f"yt8m inspect: skipped the rest of {len(source.skipped_files)} corrupt file(s)", file=sys.stderr)
    else:
        print("\n".join(summary_lines(summary, paths, source.skipped_files)))
    if labels:
        print(f"yt8m inspect: wrote the labels of {labels.videos} videos to {config.write_labels_csv}",
              file=sys.stderr)
    return 0


def _labels_csv(stack: contextlib.ExitStack, path: str, paths: Sequence[str]) -> Optional[LabelsCsv]:
    """The --write_labels_csv writer, its file written atomically as the stack closes (none left on an error)."""
    if not path:
        return None
    out = cast(TextIO, stack.enter_context(atomic_writer(path)))  # a writer in text mode
    return LabelsCsv(out, stack.enter_context(TemporaryDatabase()), paths)

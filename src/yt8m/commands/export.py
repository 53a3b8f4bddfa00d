"""`yt8m export`: a train dir's newest readable checkpoint (or a given one) as an ONNX model with its metadata JSON,
for serving and `yt8m predict --model`; prints one JSON line."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Optional, Sequence

from yt8m.config import FlagParser
from yt8m.inference.onnx_export import GRAPH_NOTES, export_checkpoint
from yt8m.io import storage
from yt8m.io.checkpoints import load_latest_checkpoint
from yt8m.runtime import setup_logging

log = logging.getLogger("yt8m.export")


def resolve_checkpoint(train_dir: Optional[str], checkpoint: Optional[str]) -> str:
    if checkpoint:
        if not storage.exists(checkpoint):
            raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
        return checkpoint
    if not train_dir:
        raise ValueError("give --train_dir (its latest checkpoint is exported) or --checkpoint")
    found = load_latest_checkpoint(train_dir)  # past unreadable ones, with a warning
    if found is None:
        raise FileNotFoundError(f"no checkpoint in {train_dir}/checkpoints: train a model there first")
    return found[0]


def main(argv: Sequence[str]) -> int:
    parser = FlagParser(prog="yt8m export", description=__doc__.splitlines()[0], epilog=GRAPH_NOTES,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train_dir", default="", help="Export this train dir's latest checkpoint.")
    parser.add_argument("--checkpoint", default="", help="Export this checkpoint file instead of the latest.")
    parser.add_argument("--output", required=True,
                        help="FILE.onnx (metadata in FILE.onnx.json), or a directory (DIR/model.onnx, "
                             "DIR/metadata.json); local or a URL (s3://, gs://).")
    parser.add_argument("--task", default="", help="A multi-task run: export this task's head (default: the first).")
    args = parser.parse_args(argv)
    setup_logging()
    for chatty in ("onnxscript", "onnx_ir"):  # their INFO lines narrate every optimizer pass
        logging.getLogger(chatty).setLevel(logging.WARNING)
    checkpoint = resolve_checkpoint(args.train_dir, args.checkpoint)
    log.info("exporting %s to %s", checkpoint, args.output)
    print(json.dumps(export_checkpoint(checkpoint, args.output, args.task)), flush=True)
    return 0

"""`yt8m export`: a train dir's newest readable checkpoint (or a given one) as an ONNX model with its metadata JSON,
for serving and `yt8m predict --model`; prints one JSON line."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Sequence

from yt8m.commands.command_line import read_command
from yt8m.fields import setting
from yt8m.inference.onnx_export import GRAPH_NOTES, export_checkpoint
from yt8m.io import storage
from yt8m.io.checkpoints import load_latest_checkpoint
from yt8m.runtime import setup_logging

log = logging.getLogger("yt8m.export")


@dataclass(frozen=True)
class ExportConfig:
    """What `yt8m export` exports, and where to."""

    train_dir: str = setting("", "Export this train dir's latest checkpoint.")
    checkpoint: str = setting("", "Export this checkpoint file instead of the latest.")
    output: str = setting("", "FILE.onnx (metadata in FILE.onnx.json), or a directory (DIR/model.onnx, "
                              "DIR/metadata.json); local or a URL (s3://, gs://).", required=True)
    task: str = setting("", "A multi-task run: export this task's head (default: the first).")

    def problems(self) -> list[str]:
        if not (self.train_dir or self.checkpoint):
            return ["give --train_dir (its latest checkpoint is exported) or --checkpoint"]
        return []


def resolve_checkpoint(config: ExportConfig) -> str:
    if config.checkpoint:
        if not storage.exists(config.checkpoint):
            raise FileNotFoundError(f"checkpoint not found: {config.checkpoint}")
        return config.checkpoint
    found = load_latest_checkpoint(config.train_dir)  # past unreadable ones, with a warning
    if found is None:
        raise FileNotFoundError(f"no checkpoint in {config.train_dir}/checkpoints: train a model there first")
    return found[0]


def main(argv: Sequence[str]) -> int:
    config = read_command(ExportConfig, argv, "yt8m export", __doc__, epilog=GRAPH_NOTES)
    setup_logging()
    for chatty in ("onnxscript", "onnx_ir"):  # their INFO lines narrate every optimizer pass
        logging.getLogger(chatty).setLevel(logging.WARNING)
    checkpoint = resolve_checkpoint(config)
    log.info("exporting %s to %s", checkpoint, config.output)
    print(json.dumps(export_checkpoint(checkpoint, config.output, config.task)), flush=True)
    return 0

"""What `yt8m export` exports and where to (ExportConfig), and the export itself: a train dir's newest readable
checkpoint (or a given one) as an ONNX model with its metadata JSON; the command and the Python API run this."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from yt8m.fields import setting
from yt8m.inference.onnx_export import export_checkpoint
from yt8m.io import storage
from yt8m.io.checkpoints import load_latest_checkpoint

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


def run_export(config: ExportConfig) -> dict[str, Any]:
    """Export the checkpoint `config` names; returns what `yt8m export` prints (the files written, the model)."""
    checkpoint = resolve_checkpoint(config)
    log.info("exporting %s to %s", checkpoint, config.output)
    return export_checkpoint(checkpoint, config.output, config.task)

"""Model exports of a train-and-evaluate run: <train_dir>/export/best/<step>/, export/latest/<step>/, export/final/.

Each export is a small train dir (checkpoints/ckpt-<step>.pt, config.yaml, metrics.json), so `yt8m eval`,
`yt8m predict --train_dir` and `yt8m export --train_dir` read it as they read the run itself.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Any, Optional

from yt8m.checkpoint import checkpoint_path

EXPORT_DIR = "export"
METRICS_FILE = "metrics.json"


def export_root(train_dir: str, kind: str) -> str:
    return os.path.join(train_dir, EXPORT_DIR, kind)


def export_path(train_dir: str, kind: str, step: int) -> str:
    """The export of `step` under `kind` ("best" or "latest"); "final" has one export, with no step folder."""
    root = export_root(train_dir, kind)
    return root if kind == "final" else os.path.join(root, f"{step:08d}")


def exported_checkpoint(train_dir: str, kind: str, step: int) -> str:
    return checkpoint_path(export_path(train_dir, kind, step), step)


def list_exports(train_dir: str, kind: str) -> list[tuple[int, str]]:
    """(step, folder) of the exports of one kind, oldest first."""
    root = export_root(train_dir, kind)
    if not os.path.isdir(root):
        return []
    return sorted((int(name), os.path.join(root, name)) for name in os.listdir(root) if name.isdigit())


def write_export(train_dir: str, kind: str, checkpoint: str, result: dict[str, Any]) -> str:
    """Export `checkpoint` (of step result["global_step"]) with its metrics; readers never see half of it."""
    step = int(result["global_step"])
    target = export_path(train_dir, kind, step)
    staging = f"{target}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(os.path.dirname(checkpoint_path(staging, step)))
    link_or_copy(checkpoint, checkpoint_path(staging, step))
    shutil.copyfile(os.path.join(train_dir, "config.yaml"), os.path.join(staging, "config.yaml"))
    with open(os.path.join(staging, METRICS_FILE), "w") as fh:
        json.dump(result, fh, indent=1)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target


def link_or_copy(source: str, destination: str) -> None:
    """A hard link costs no space (the trainer replaces checkpoint files, never rewrites them in place)."""
    try:
        os.link(source, destination)
    except OSError:  # another filesystem, or one without hard links
        shutil.copyfile(source, destination)


def read_export_metrics(folder: str) -> dict[str, Any]:
    with open(os.path.join(folder, METRICS_FILE)) as fh:
        return json.load(fh)


@dataclass
class Exporters:
    """The best exporter (on each improvement, newest N kept), the latest (each evaluation, newest N kept)
    and the final one (the run's last checkpoint)."""

    train_dir: str
    keep_best: int
    keep_latest: int

    def export_best(self, checkpoint: str, result: dict[str, Any]) -> Optional[str]:
        return self._export_and_prune("best", checkpoint, result, self.keep_best)

    def export_latest(self, checkpoint: str, result: dict[str, Any]) -> Optional[str]:
        return self._export_and_prune("latest", checkpoint, result, self.keep_latest)

    def export_final(self, checkpoint: str, result: dict[str, Any]) -> str:
        return write_export(self.train_dir, "final", checkpoint, result)

    def _export_and_prune(self, kind: str, checkpoint: str, result: dict[str, Any], keep: int) -> Optional[str]:
        if keep < 1:
            return None
        folder = write_export(self.train_dir, kind, checkpoint, result)
        for _, old in list_exports(self.train_dir, kind)[:-keep]:
            shutil.rmtree(old)
        return folder

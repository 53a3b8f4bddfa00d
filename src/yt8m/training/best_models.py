"""Model exports of a train-and-evaluate run: <train_dir>/export/best/<step>/, export/latest/<step>/, export/final/.

Each export is a small train dir (checkpoints/ckpt-<step>.pt, config.yaml, model_size.json, metrics.json), so
`yt8m eval`, `yt8m predict --train_dir` and `yt8m export --train_dir` read it as they read the run itself. An
export is listed once its metrics.json, written last, is there.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Any, Optional

from yt8m.io import storage
from yt8m.io.checkpoints import METRICS_FILE, RUN_FILES, checkpoint_dir, checkpoint_path, export_path, list_exports
from yt8m.io.files import copy_file_atomically, sync_directory, temporary_path, write_file_atomically


def write_export(train_dir: str, kind: str, checkpoint: str, result: dict[str, Any]) -> str:
    """Export `checkpoint` (of step result["global_step"]) with its metrics; readers never see half of it.

    The export is staged in a folder of its own beside the target, every file fsynced, then renamed into
    place. A failure (a full disk) raises WriteError naming the file, and removes the staging folder.
    On object storage, which cannot rename a folder, see `_write_objects`.
    """
    step = int(result["global_step"])
    target = export_path(train_dir, kind, step)
    if not storage.is_local(target):
        _write_objects(target, train_dir, checkpoint, step, result)
        return target
    staging = temporary_path(target)
    try:
        _stage_export(staging, train_dir, checkpoint, step, result)
        _replace_folder(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _stage_export(staging: str, train_dir: str, checkpoint: str, step: int, result: dict[str, Any]) -> None:
    staged_checkpoint = checkpoint_path(staging, step)
    os.makedirs(os.path.dirname(staged_checkpoint))
    link_or_copy(checkpoint, staged_checkpoint)
    for name in RUN_FILES:
        copy_file_atomically(os.path.join(train_dir, name), os.path.join(staging, name))
    write_file_atomically(os.path.join(staging, METRICS_FILE), lambda out: json.dump(result, out, indent=1))
    sync_directory(os.path.dirname(staged_checkpoint))


def _write_objects(target: str, train_dir: str, checkpoint: str, step: int, result: dict[str, Any]) -> None:
    """An export on object storage, each file uploaded whole, in the order that keeps it readable: the run files
    (so a reader finding the checkpoint finds its config), the checkpoint, then metrics.json, which makes the
    export complete (`list_exports`); then the checkpoints of the export it replaced (final/) go."""
    for name in RUN_FILES:
        copy_file_atomically(os.path.join(train_dir, name), os.path.join(target, name))
    copy_file_atomically(checkpoint, checkpoint_path(target, step))
    write_file_atomically(os.path.join(target, METRICS_FILE), lambda out: json.dump(result, out, indent=1))
    kept = os.path.basename(checkpoint_path(target, step))
    for name in storage.listdir(checkpoint_dir(target)):
        if name != kept:
            storage.remove(os.path.join(checkpoint_dir(target), name))


def _replace_folder(staging: str, target: str) -> None:
    """Rename `staging` to `target`; an existing `target` is moved aside first and removed only once
    `staging` took its place."""
    if not os.path.exists(target):
        os.replace(staging, target)
    else:
        previous = temporary_path(target)
        os.replace(target, previous)
        try:
            os.replace(staging, target)
        except BaseException:
            os.replace(previous, target)
            raise
        shutil.rmtree(previous, ignore_errors=True)
    sync_directory(os.path.dirname(target))


def link_or_copy(source: str, destination: str) -> None:
    """A hard link costs no space (the trainer replaces checkpoint files, never rewrites them in place)."""
    try:
        os.link(source, destination)
    except OSError:  # another filesystem, or one without hard links
        copy_file_atomically(source, destination)


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
            storage.remove_tree(old)
        return folder

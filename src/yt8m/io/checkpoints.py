"""A train dir's files: checkpoints (atomic writes, the newest N kept, a marker for the final one, safe loading) and
the exports of train-and-evaluate (export/best, latest, final), read by eval, predict, export and teachers.

Everything stored is loadable with `torch.load(weights_only=True)`: tensors, numbers, strings, lists, dicts.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from yt8m.io import storage
from yt8m.io.files import atomic_writer, write_file_atomically

CHECKPOINT_FORMAT = "yt8m-checkpoint-1"
FINAL_MARKER = "final"
_NAME = re.compile(r"^ckpt-(\d{8,})\.pt$")

EXPORT_DIR = "export"
METRICS_FILE = "metrics.json"
MODEL_SIZE_FILE = "model_size.json"  # the model's parameters and MB (yt8m.models.model_size), written by `yt8m train`
CONFIG_FILE = "config.yaml"  # the run's whole TrainConfig, by section, written by `yt8m train`
RUN_FILES = (CONFIG_FILE, MODEL_SIZE_FILE)  # what a run writes beside its checkpoints, and an export or archive copies

log = logging.getLogger(__name__)


@dataclass
class Checkpoint:
    """What a checkpoint holds, written and read by this one record: the model's weights (the moving average of
    the weights where the run keeps one, and then the trained weights beside it), the optimizer's and the loss
    scaler's state, the run's config (by section; flat in runs written before sections), training's progress and
    random state, the evaluator's state, a multi-task run's tasks (what each head was built for), and where each
    process's reading stood (its readers' positions, so that a resume reads none of the epoch again)."""

    model: dict[str, Any]
    optimizer: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    progress: dict[str, Any] = field(default_factory=dict)
    scaler: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)
    trained_weights: Optional[dict[str, Any]] = None
    validation: Optional[dict[str, Any]] = None
    tasks: list[dict[str, Any]] = field(default_factory=list)
    reading: Optional[list[dict[str, Any]]] = None  # each process's readers' positions: a resume starts there

    @property
    def step(self) -> int:
        return int(self.progress.get("step", 0))

    def payload(self) -> dict[str, Any]:
        """The dict torch.save writes: the format's name and every field that is set."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # the tensors themselves, no copy
        return {"format": CHECKPOINT_FORMAT, **{key: value for key, value in values.items() if value is not None}}

    @classmethod
    def from_payload(cls, payload: Any, path: str) -> "Checkpoint":
        if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: not a yt8m checkpoint (expected format {CHECKPOINT_FORMAT!r})")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted({"model", "progress"} - set(payload))
        if missing:
            raise ValueError(f"{path}: not a complete yt8m checkpoint (it has no {', '.join(missing)})")
        return cls(**{key: value for key, value in payload.items() if key in names})


def checkpoint_dir(train_dir: str) -> str:
    return os.path.join(train_dir, "checkpoints")


def checkpoint_path(train_dir: str, step: int) -> str:
    return os.path.join(checkpoint_dir(train_dir), f"ckpt-{step:08d}.pt")


def list_checkpoints(train_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every checkpoint in the train dir, oldest first."""
    directory = checkpoint_dir(train_dir)
    found = []
    for name in storage.listdir(directory):
        match = _NAME.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return sorted(found)


def latest_checkpoint(train_dir: str) -> Optional[str]:
    checkpoints = list_checkpoints(train_dir)
    return checkpoints[-1][1] if checkpoints else None


def final_checkpoint(train_dir: str) -> Optional[str]:
    """The checkpoint a finished run marked as its last, or None while training goes on."""
    marker = os.path.join(checkpoint_dir(train_dir), FINAL_MARKER)
    if not storage.exists(marker):
        return None
    with storage.open_file(marker, "r") as fh:
        return os.path.join(checkpoint_dir(train_dir), fh.read().strip())


def clear_final_marker(train_dir: str) -> None:
    storage.remove(os.path.join(checkpoint_dir(train_dir), FINAL_MARKER))


def save_checkpoint(train_dir: str, checkpoint: Checkpoint, keep: int, final: bool = False) -> str:
    """Write ckpt-<step>.pt atomically and durably, mark it final when asked, then keep the newest `keep`.

    Readers (a watching `yt8m eval`) never see a half-written file: it is written under a temporary name
    in the same directory, fsynced and renamed into place (on object storage: uploaded whole). A failure (a full
    disk) raises WriteError naming the checkpoint, removes the temporary file and leaves every earlier checkpoint as
    it was.
    """
    path = checkpoint_path(train_dir, checkpoint.step)
    with atomic_writer(path, binary=True) as out:
        torch.save(checkpoint.payload(), out)
    if final:
        write_file_atomically(os.path.join(checkpoint_dir(train_dir), FINAL_MARKER),
                              lambda out: out.write(os.path.basename(path)))
    prune_checkpoints(train_dir, checkpoint.step, keep)
    return path


def prune_checkpoints(train_dir: str, step: int, keep: int) -> None:
    """Remove the checkpoints older than `step` beyond the newest `keep` (counting `step`'s own).

    Newer ones are left alone: they can only be unreadable ones a resume passed over.
    """
    older = [path for saved, path in list_checkpoints(train_dir) if saved < step]
    for path in older[:max(len(older) - (max(keep, 1) - 1), 0)]:
        storage.remove(path)


def load_checkpoint(path: str, map_location: str | torch.device = "cpu") -> Checkpoint:
    if not storage.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        source = path if storage.is_local(path) else io.BytesIO(storage.read_bytes(path))
        payload = torch.load(source, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint not found: {path}") from None
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise ValueError(f"{path}: not a readable yt8m checkpoint ({err})") from err
    return Checkpoint.from_payload(payload, path)


def load_latest_checkpoint(train_dir: str, map_location: str | torch.device = "cpu"
                           ) -> Optional[tuple[str, Checkpoint]]:
    """(path, checkpoint) of the newest checkpoint of the train dir that loads, or None when it has none.

    An unreadable newer one (truncated or empty after a power loss) is passed over with a warning naming it;
    one removed meanwhile (pruned by the trainer) silently. Raises ValueError naming each checkpoint and
    why it failed when checkpoints exist but none loads.
    """
    unreadable = []
    for _, path in reversed(list_checkpoints(train_dir)):
        try:
            checkpoint = load_checkpoint(path, map_location)
        except FileNotFoundError:
            continue
        except ValueError as err:
            log.warning("passing over an unreadable checkpoint: %s", err)
            unreadable.append(str(err))
            continue
        return path, checkpoint
    if unreadable:
        raise ValueError(f"no readable checkpoint in {checkpoint_dir(train_dir)}: " + "; ".join(unreadable))
    return None


# Exports of a train-and-evaluate run (written by yt8m.training.best_models): each a small train dir, complete once its
# metrics.json is there.

def export_root(train_dir: str, kind: str) -> str:
    return os.path.join(train_dir, EXPORT_DIR, kind)


def export_path(train_dir: str, kind: str, step: int) -> str:
    """The export of `step` under `kind` ("best" or "latest"); "final" has one export, with no step folder."""
    root = export_root(train_dir, kind)
    return root if kind == "final" else os.path.join(root, f"{step:08d}")


def exported_checkpoint(train_dir: str, kind: str, step: int) -> str:
    return checkpoint_path(export_path(train_dir, kind, step), step)


def list_exports(train_dir: str, kind: str) -> list[tuple[int, str]]:
    """(step, folder) of the complete exports of one kind, oldest first."""
    root = export_root(train_dir, kind)
    return sorted((int(name), os.path.join(root, name)) for name in storage.listdir(root)
                  if name.isdigit() and storage.exists(os.path.join(root, name, METRICS_FILE)))


def read_export_metrics(folder: str) -> dict[str, Any]:
    with storage.open_file(os.path.join(folder, METRICS_FILE), "r") as fh:
        return json.load(fh)

"""Training checkpoints: atomic writes, the newest N kept, a marker for the final one, safe loading.

Everything stored is loadable with `torch.load(weights_only=True)`: tensors, numbers, strings, lists, dicts.
"""

from __future__ import annotations

import io
import logging
import os
import random
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from yt8m.io import storage
from yt8m.config import TrainConfig, config_from_dict
from yt8m.io.files import atomic_writer, write_file_atomically
from yt8m.models import create_model_from_config

CHECKPOINT_FORMAT = "yt8m-checkpoint-1"
FINAL_MARKER = "final"
_NAME = re.compile(r"^ckpt-(\d{8,})\.pt$")

log = logging.getLogger(__name__)


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


def save_checkpoint(train_dir: str, payload: dict[str, Any], step: int, keep: int, final: bool = False) -> str:
    """Write ckpt-<step>.pt atomically and durably, mark it final when asked, then keep the newest `keep`.

    Readers (a watching `yt8m eval`) never see a half-written file: it is written under a temporary name
    in the same directory, fsynced and renamed into place (on object storage: uploaded whole). A failure (a full disk) raises WriteError naming
    the checkpoint, removes the temporary file and leaves every earlier checkpoint as it was.
    """
    path = checkpoint_path(train_dir, step)
    with atomic_writer(path, binary=True) as out:
        torch.save({"format": CHECKPOINT_FORMAT, **payload}, out)
    if final:
        write_file_atomically(os.path.join(checkpoint_dir(train_dir), FINAL_MARKER),
                              lambda out: out.write(os.path.basename(path)))
    prune_checkpoints(train_dir, step, keep)
    return path


def prune_checkpoints(train_dir: str, step: int, keep: int) -> None:
    """Remove the checkpoints older than `step` beyond the newest `keep` (counting `step`'s own).

    Newer ones are left alone: they can only be unreadable ones a resume passed over.
    """
    older = [path for saved, path in list_checkpoints(train_dir) if saved < step]
    for path in older[:max(len(older) - (max(keep, 1) - 1), 0)]:
        storage.remove(path)


def load_checkpoint(path: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    if not storage.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        source = path if storage.is_local(path) else io.BytesIO(storage.read_bytes(path))
        payload = torch.load(source, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint not found: {path}") from None
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise ValueError(f"{path}: not a readable yt8m checkpoint ({err})") from err
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a yt8m checkpoint (expected format {CHECKPOINT_FORMAT!r})")
    return payload


def load_latest_checkpoint(train_dir: str, map_location: str | torch.device = "cpu"
                           ) -> Optional[tuple[str, dict[str, Any]]]:
    """(path, payload) of the newest checkpoint of the train dir that loads, or None when it has none.

    An unreadable newer one (truncated or empty after a power loss) is passed over with a warning naming it;
    one removed meanwhile (pruned by the trainer) silently. Raises ValueError naming each checkpoint and
    why it failed when checkpoints exist but none loads.
    """
    unreadable = []
    for _, path in reversed(list_checkpoints(train_dir)):
        try:
            payload = load_checkpoint(path, map_location)
        except FileNotFoundError:
            continue
        except ValueError as err:
            log.warning("passing over an unreadable checkpoint: %s", err)
            unreadable.append(str(err))
            continue
        return path, payload
    if unreadable:
        raise ValueError(f"no readable checkpoint in {checkpoint_dir(train_dir)}: " + "; ".join(unreadable))
    return None


def checkpoint_config(payload: dict[str, Any], path: str) -> TrainConfig:
    return config_from_dict(TrainConfig, payload["config"], source=f"{path} (config)", check_values=False)


def build_model_from_checkpoint(path: str, device: str | torch.device = "cpu", task: str = ""
                                ) -> tuple[torch.nn.Module, TrainConfig, int]:
    """The checkpoint's model with its weights, in eval mode, plus its training config and step; of a multi-task
    checkpoint the head of `task` (default: its first), the config that task's."""
    return build_model_from_payload(load_checkpoint(path, map_location=device), path, device, task)


def build_model_from_payload(payload: dict[str, Any], path: str, device: str | torch.device = "cpu", task: str = ""
                             ) -> tuple[torch.nn.Module, TrainConfig, int]:
    """`build_model_from_checkpoint` for a checkpoint already loaded (by `load_latest_checkpoint`) from `path`."""
    config = checkpoint_config(payload, path)
    if payload.get("tasks"):
        from yt8m.models.multihead import task_head_model

        model, config, _ = task_head_model(payload, config, task, path)
    elif task:
        raise ValueError(f"--task {task}: {path} was trained on a single task (no tasks)")
    else:
        model = create_model_from_config(config)
        model.load_state_dict(payload["model"])
    model.to(device).eval()
    return model, config, int(payload["progress"]["step"])


@dataclass
class InitReport:
    """What `init_from_checkpoint` loaded: the model's tensors taken, those left as initialized (and why),
    and the checkpoint's tensors no model tensor matched."""

    source: str
    loaded: list[str]
    not_loaded: dict[str, str]
    unused: list[str]

    def log(self, logger: logging.Logger) -> None:
        total = len(self.loaded) + len(self.not_loaded)
        logger.info("--init_from %s: loaded %d of %d tensors: %s", self.source, len(self.loaded), total,
                    ", ".join(self.loaded) or "none")
        if self.not_loaded:
            logger.warning("--init_from %s: not loaded (kept their initialization): %s", self.source,
                           "; ".join(f"{name} ({why})" for name, why in self.not_loaded.items()))
        if self.unused:
            logger.info("--init_from %s: checkpoint tensors the model has no place for: %s", self.source,
                        ", ".join(self.unused))


def init_from_checkpoint(model: torch.nn.Module, source: str) -> InitReport:
    """Copy into `model` the checkpoint tensors whose names and shapes match; `source` is a checkpoint file
    or a train dir (its latest checkpoint)."""
    found = load_latest_checkpoint(source) if storage.isdir(source) else (source, load_checkpoint(source))
    if found is None:
        raise FileNotFoundError(f"--init_from {source}: no checkpoint in {checkpoint_dir(source)}")
    path, saved = found[0], found[1]["model"]
    own = model.state_dict()
    loaded, not_loaded = [], {}
    for name, tensor in own.items():
        if name not in saved:
            not_loaded[name] = "not in the checkpoint"
        elif saved[name].shape != tensor.shape:
            not_loaded[name] = f"shape {list(saved[name].shape)} in the checkpoint, {list(tensor.shape)} here"
        else:
            loaded.append(name)
    model.load_state_dict({name: saved[name] for name in loaded}, strict=False)
    return InitReport(path, loaded, not_loaded, [name for name in saved if name not in own])


def differing_fields(old: Any, new: Any, names: Sequence[str]) -> list[tuple[str, Any, Any]]:
    """(name, old value, new value) of each named config field that differs."""
    return [(name, getattr(old, name), getattr(new, name)) for name in names if getattr(old, name) != getattr(new, name)]


def capture_rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from, as tensors and plain lists."""
    version, internal, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
        "numpy": [np_name, torch.from_numpy(np_keys.astype(np.int64)), int(np_pos), int(np_has_gauss), float(np_gauss)],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_name, np_keys.numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

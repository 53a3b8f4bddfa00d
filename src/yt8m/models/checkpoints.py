"""Models from checkpoints (yt8m.io.checkpoints): a checkpoint's model built with its weights, for eval, predict,
export and teachers; and a new run's start from another run's matching tensors (--init_from)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from yt8m.config import read_section
from yt8m.data.reading.spec import FeatureSpec
from yt8m.io import storage
from yt8m.io.checkpoints import Checkpoint, checkpoint_dir, load_checkpoint, load_latest_checkpoint
from yt8m.models.config import ModelConfig, build_model
from yt8m.models.multihead import Network, task_head_model


@dataclass(frozen=True)
class TrainedModel:
    """A checkpoint's model ready to run: the network (weights loaded, eval mode), what it reads and predicts (of a
    multi-task checkpoint, its task's classes and labels), its model section, and the step it was saved at."""

    network: Network
    features: FeatureSpec
    model: ModelConfig
    step: int


def stored_model(checkpoint: Checkpoint, path: str) -> tuple[ModelConfig, FeatureSpec]:
    """The model and features sections of the run a checkpoint stores (whichever form its config has)."""
    source = f"{path} (config)"
    return (read_section(checkpoint.config, "model", ModelConfig, source),
            read_section(checkpoint.config, "features", FeatureSpec, source))


def build_model_from_checkpoint(path: str, device: str | torch.device = "cpu", task: str = "") -> TrainedModel:
    """The checkpoint's model with its weights, in eval mode; of a multi-task checkpoint the head of `task`
    (default: its first)."""
    return build_model_from_payload(load_checkpoint(path, map_location=device), path, device, task)


def build_model_from_payload(checkpoint: Checkpoint, path: str, device: str | torch.device = "cpu", task: str = ""
                             ) -> TrainedModel:
    """`build_model_from_checkpoint` for a checkpoint already loaded (by `load_latest_checkpoint`) from `path`."""
    model, features = stored_model(checkpoint, path)
    network: Network
    if checkpoint.tasks:
        network, features = task_head_model(checkpoint, model, features, task, path)
    elif task:
        raise ValueError(f"--task {task}: {path} was trained on a single task (no tasks)")
    else:
        network = build_model(model, features)
        load_checked(network, checkpoint.model, path)
    network.to(device).eval()
    return TrainedModel(network, features, model, checkpoint.step)


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
    path, saved = found[0], found[1].model
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


def load_checked(model: torch.nn.Module, saved: dict[str, torch.Tensor], source: str) -> None:
    """`model.load_state_dict(saved)`, refused first with a ValueError naming the tensors (a few, and how many) that
    are missing, unknown or of another shape: weights never go into a differently shaped network."""
    problems = tensor_mismatches(model.state_dict(), saved)
    if problems:
        raise ValueError(f"{source} does not fit this model ({len(problems)} tensor(s) differ): "
                         + "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else ""))
    model.load_state_dict(saved)


def tensor_mismatches(expected: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> list[str]:
    """Each tensor name that `saved` lacks, adds, or holds in another shape than `expected`."""
    problems = [f"{name}: not in the checkpoint" for name in expected if name not in saved]
    problems += [f"{name}: only in the checkpoint" for name in saved if name not in expected]
    problems += [f"{name}: shape {list(saved[name].shape)} in the checkpoint, {list(tensor.shape)} here"
                 for name, tensor in expected.items() if name in saved and saved[name].shape != tensor.shape]
    return problems

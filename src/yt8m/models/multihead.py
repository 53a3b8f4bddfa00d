"""The multi-task model: a trunk shared by every task and one output head per task (tasks with a 'shared' head read
the first task's: one network where only the loss differs).

The trunk of a frame model (DbofModel, LstmModel, FrameLevelLogisticModel) is everything before its video-level
classifier (`shared_features`); each head is a video-level model on it, by default the frame model's own
--video_level_classifier_model. A video-level model (LogisticModel, MoeModel) is a single classifier on the input:
it has no inner layers to share, so its trunk is the identity (the heads then train side by side on the same input),
unless --trunk_hidden_sizes adds fully connected layers that every head reads, which is what lets one task's data
shape the features another task's head uses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from yt8m.models import create_model, hparam_names, model_hparams
from yt8m.models.registry import create_classifier
from yt8m.models.base import BaseModel, starter_linear
from yt8m.tasks.spec import TaskSpec


class Trunk(nn.Module):
    """Input features to the shared features every head reads: the frame model without its classifier (or the
    L2-normalized input of a video-level model), then the hidden layers."""

    def __init__(self, base: Optional[BaseModel], feature_size: int, hidden_sizes: Iterable[int]):
        super().__init__()
        self.base, self.feature_size = base, feature_size
        sizes = [base.shared_size if base is not None else feature_size, *hidden_sizes]
        self.hidden = nn.Sequential(*[layer for size_in, size_out in zip(sizes, sizes[1:])
                                      for layer in (starter_linear(size_in, size_out), nn.ReLU())])
        self.output_size = sizes[-1]

    @property
    def frame_level(self) -> bool:
        return self.base is not None and self.base.frame_level

    def forward(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        if self.base is not None:
            shared = self.base.shared_features(self.base.prepare_input(features, num_frames), num_frames)
        elif features.dim() != 2 or features.shape[-1] != self.feature_size:
            raise ValueError(f"the multi-task trunk expects input [batch, features] with features = "
                             f"{self.feature_size}, got shape {tuple(features.shape)}")
        else:
            shared = F.normalize(features, dim=-1)
        return self.hidden(shared)


class MultiTaskModel(nn.Module):
    """Output `{"logits": {head: [batch, classes]}, "predictions": {head: ...}}` for every head (or those asked
    for); `task_heads` maps each task to the head it reads."""

    def __init__(self, trunk: Trunk, heads: dict[str, BaseModel], task_heads: dict[str, str]):
        super().__init__()
        self.trunk, self.heads, self.task_heads = trunk, nn.ModuleDict(heads), dict(task_heads)

    @property
    def frame_level(self) -> bool:
        return self.trunk.frame_level

    def forward(self, features: torch.Tensor, num_frames: Optional[torch.Tensor] = None,
                heads: Optional[Iterable[str]] = None) -> dict[str, dict[str, torch.Tensor]]:
        shared = self.trunk(features, num_frames)
        outputs = {name: self.heads[name].compute_output(shared, None) for name in (heads or self.heads)}
        return {key: {name: output[key] for name, output in outputs.items()} for key in ("logits", "predictions")}

    def l2_penalties(self) -> list[tuple[torch.Tensor, float]]:
        """The heads' classifier penalties (the starter kit penalizes classifier weights only; the trunk has none)."""
        return [term for head in self.heads.values() for term in head.l2_penalties()]


class HeadView(nn.Module):
    """One task's head of a MultiTaskModel as a single-task model (`{"logits", "predictions"}`), for evaluation,
    prediction and export."""

    def __init__(self, model: MultiTaskModel, task: str):
        super().__init__()
        self.model, self.head = model, model.task_heads[task]

    @property
    def frame_level(self) -> bool:
        return self.model.frame_level

    @property
    def feature_size(self) -> int:
        return self.model.trunk.feature_size

    def forward(self, features: torch.Tensor, num_frames: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        output = self.model(features, num_frames, heads=(self.head,))
        return {"logits": output["logits"][self.head], "predictions": output["predictions"][self.head]}


def build_multitask_model(config: Any, specs: list[TaskSpec]) -> MultiTaskModel:
    """The model a train config and its resolved tasks (num_classes known) describe."""
    feature_size = sum(config.feature_sizes)
    base = None
    if config.frame_features:
        base = create_model(config.model, feature_size, 1, modality_sizes=config.feature_sizes,
                            **model_hparams(config.model, config))
        setattr(base, base.classifier_name, None)  # the heads replace it
    trunk = Trunk(base, feature_size, config.trunk_hidden_sizes)
    default_head = config.video_level_classifier_model if config.frame_features else config.model
    heads = {}
    for spec in specs:
        if spec.head != spec.name:
            continue
        head_model = spec.head_model or default_head
        unknown = sorted(set(spec.head_hparams) - set(hparam_names(head_model)))
        if unknown:
            raise ValueError(f"task {spec.name}: head_hparams {', '.join(unknown)} are not hyper-parameters of "
                             f"{head_model} (it has: {', '.join(hparam_names(head_model))})")
        hparams = {**model_hparams(head_model, config), **spec.head_hparams}
        heads[spec.name] = create_classifier(head_model, trunk.output_size, spec.num_classes, **hparams)
    return MultiTaskModel(trunk, heads, {spec.name: spec.head for spec in specs})


def task_head_model(payload: dict[str, Any], config: Any, task: str, path: str) -> tuple[HeadView, Any, TaskSpec]:
    """One task's head of a multi-task checkpoint's model (weights loaded), the config as that task's single-task
    config (its num_classes and label kind) and the task; `task` "" is the first task."""
    specs = [TaskSpec(**spec) for spec in payload["tasks"]]
    names = [spec.name for spec in specs]
    name = task or names[0]
    if name not in names:
        raise ValueError(f"--task {name}: {path} has no such task (its tasks: {', '.join(names)})")
    model = build_multitask_model(config, specs)
    model.load_state_dict(payload["model"])
    spec = specs[names.index(name)]
    return HeadView(model, name), dataclasses.replace(config, num_classes=spec.num_classes,
                                                      segment_labels=spec.segments), spec

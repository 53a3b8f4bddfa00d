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
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from yt8m.config import config_values
from yt8m.data.reading.spec import FeatureSpec
from yt8m.io.checkpoints import Checkpoint
from yt8m.models.base import BaseModel, starter_linear
from yt8m.models.config import ModelConfig, build_model
from yt8m.models.registry import classifier_problem, create_model, hparam_names

# The starter kit's --video_level_classifier_model default: the heads of a frame model that has no such flag.
STARTER_CLASSIFIER = "MoeModel"


class Trunk(nn.Module):
    """Input features to the shared features every head reads: the frame model without its classifier (or the
    L2-normalized input of a video-level model, as stored with `normalize` False), then the hidden layers."""

    def __init__(self, base: Optional[BaseModel], feature_size: int, hidden_sizes: Iterable[int],
                 normalize: bool = True):
        super().__init__()
        self.base, self.feature_size, self.normalize = base, feature_size, normalize
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
            shared = F.normalize(features, dim=-1) if self.normalize else features
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
        outputs = {name: self.head(name).compute_output(shared, None) for name in (heads or self.heads)}
        return {key: {name: output[key] for name, output in outputs.items()} for key in ("logits", "predictions")}

    def l2_penalties(self) -> list[tuple[torch.Tensor, float]]:
        """The heads' classifier penalties (the starter kit penalizes classifier weights only; the trunk has none)."""
        return [term for name in self.heads for term in self.head(name).l2_penalties()]

    def head(self, name: str) -> BaseModel:
        head = self.heads[name]
        assert isinstance(head, BaseModel)  # the heads are video-level models
        return head


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


# What yt8m runs as one model (evaluates, predicts with, exports): a model, or one task's head of a multi-task one.
Network = Union[BaseModel, HeadView]


@dataclass
class Head:
    """What the model needs of a task: its name, the head it reads (its own name, or the task whose head it shares),
    that head's video-level model and hyper-parameters (empty: the defaults), and its number of classes. Made from a
    resolved task (yt8m.tasks.spec.TaskSpec) or from a checkpoint's record of it."""

    name: str
    head: str
    head_model: str
    head_hparams: dict[str, Any]
    num_classes: int

    @classmethod
    def of(cls, task: Any) -> "Head":
        """The head of a TaskSpec, or of a checkpoint's dict of one."""
        values = task if isinstance(task, dict) else config_values(task)
        return cls(*(values[field.name] for field in dataclasses.fields(cls)))


def build_multitask_model(model: ModelConfig, features: FeatureSpec, tasks: Sequence[Any]) -> MultiTaskModel:
    """The model a model section, the features and the resolved tasks (TaskSpecs or Heads, num_classes known)
    describe."""
    heads_of = [Head.of(task) if not isinstance(task, Head) else task for task in tasks]
    base = None
    if features.frame_features:
        base = build_model(model, dataclasses.replace(features, num_classes=1))
        assert base.classifier_name is not None  # a frame model has its classifier
        setattr(base, base.classifier_name, None)  # the heads replace it
    trunk = Trunk(base, features.feature_size, model.trunk_hidden_sizes, model.input_l2_normalize)
    default_head = getattr(model.hparams, "video_level_classifier_model", STARTER_CLASSIFIER) \
        if features.frame_features else model.name
    heads = {head.name: _head_model(head, model, default_head, trunk.output_size)
             for head in heads_of if head.head == head.name}
    return MultiTaskModel(trunk, heads, {head.name: head.head for head in heads_of})


def _head_model(head: Head, model: ModelConfig, default_head: str, feature_size: int) -> BaseModel:
    """The head's classifier: its model's hyper-parameters from the model section where they are the chosen
    model's too (moe_num_mixtures of a frame model's classifier), its own defaults elsewhere, `head_hparams` over
    both."""
    head_model = head.head_model or default_head
    names = hparam_names(head_model)
    unknown = sorted(set(head.head_hparams) - set(names))
    if unknown:
        raise ValueError(f"task {head.name}: head_hparams {', '.join(unknown)} are not hyper-parameters of "
                         f"{head_model} (it has: {', '.join(names)})")
    chosen = dataclasses.asdict(model.hparams) if model.hparams is not None else {}
    values = {**{name: chosen[name] for name in names if name in chosen}, **head.head_hparams}
    problem = classifier_problem(head_model)
    if problem:
        raise ValueError(f"task {head.name}: head_model {problem}")
    return create_model(head_model, feature_size, head.num_classes, **values)


def task_head_model(checkpoint: Checkpoint, model: ModelConfig, features: FeatureSpec, task: str, path: str
                    ) -> tuple[HeadView, FeatureSpec]:
    """One task's head of a multi-task checkpoint's model (weights loaded), and the features as that task reads
    them (its num_classes and label kind); `task` "" is the first task."""
    recorded = checkpoint.tasks
    names = [entry["name"] for entry in recorded]
    name = task or names[0]
    if name not in names:
        raise ValueError(f"--task {name}: {path} has no such task (its tasks: {', '.join(names)})")
    network = build_multitask_model(model, features, recorded)
    network.load_state_dict(checkpoint.model)  # the model its own tasks describe: the same tensors
    entry = recorded[names.index(name)]
    return HeadView(network, name), dataclasses.replace(features, num_classes=entry["num_classes"],
                                                        segment_labels=entry["label_source"] == "segments")

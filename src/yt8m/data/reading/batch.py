"""The batch every reader yields and every step takes (training, evaluation, prediction): typed, so that what a
batch carries is written once, and moved to a device in one way."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass
class Batch:
    """A batch of examples: videos, or 2019 rated segments (ids VIDEOID:START).

    `features` is float32 [B, D] (video level) or uint8 [B, T, D] as stored, zero-padded after `num_frames` (frame
    level and segments; dequantized by the model on its device; a worker's slot while inside the loader). `labels` is
    the bool multi-hot [B, classes] of the classes present (LabelIds while still inside the loader, a few KB to send
    instead of the tensor); segments add `label_weights`, every class rated there. `source` is the index of the
    training data set the batch came from (a multi-task run reads several; 0 otherwise). `position`: where its reader
    stood after it (a shuffling reader's StreamPosition; a resume starts from the last one trained on).
    """

    video_ids: list[str]
    features: torch.Tensor
    labels: Any
    num_frames: Optional[torch.Tensor] = None
    label_weights: Any = None
    source: int = 0
    position: Any = None

    def __len__(self) -> int:
        return self.features.shape[0]

    def to(self, device: torch.device) -> "Batch":
        """The batch on `device`; non_blocking pays off only from pinned memory, which CUDA runs use."""
        non_blocking = device.type == "cuda"
        return self._map(lambda tensor: tensor.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """Called by torch's DataLoader (pin_memory=True) on each batch."""
        return self._map(lambda tensor: tensor.pin_memory())

    def tensors(self) -> list[torch.Tensor]:
        """The batch's tensors (features, and labels, num_frames, label_weights where they are tensors)."""
        return [value for field in dataclasses.fields(self) if torch.is_tensor(value := getattr(self, field.name))]

    def _map(self, move: Any) -> "Batch":
        changes = {field.name: move(value) for field in dataclasses.fields(self)
                   if torch.is_tensor(value := getattr(self, field.name))}
        return dataclasses.replace(self, **changes)

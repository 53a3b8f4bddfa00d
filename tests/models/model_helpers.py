"""Helpers shared by the model tests: tiny hyper-parameters (fast tests) and random padded input."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import torch

from yt8m.config import ModelConfig
from yt8m.models import BaseModel, create_model, is_frame_level

TINY = dataclasses.asdict(ModelConfig(dbof_cluster_size=64, dbof_hidden_size=32, iterations=8, lstm_cells=32,
                                     netvlad_cluster_size=4, fv_cluster_size=4, softdbof_cluster_size=16,
                                     willow_hidden_size=16, nextvlad_cluster_size=4, nextvlad_hidden_size=16,
                                     nextvlad_groups=2, deep_hidden_size=32,
                                     transformer_hidden_size=16, transformer_heads=2, transformer_max_frames=6))


def tiny_model(name: str, feature_size: int, num_classes: int, **overrides) -> BaseModel:
    return create_model(name, feature_size, num_classes, **{**TINY, **overrides})


def random_input(name: str, batch: int, feature_size: int, frames: int = 9, seed: int = 0):
    """Features (zero-padded for frame-level models) and num_frames (None for video-level ones)."""
    generator = torch.Generator().manual_seed(seed)
    if not is_frame_level(name):
        return torch.randn(batch, feature_size, generator=generator), None
    num_frames = torch.randint(1, frames + 1, (batch,), generator=generator)
    features = torch.randn(batch, frames, feature_size, generator=generator)
    features[torch.arange(frames) >= num_frames[:, None]] = 0
    return features, num_frames


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """One torch thread: tiny models train faster without thread hand-offs, above all on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)

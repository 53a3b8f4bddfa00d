"""The `augment` section: what training does to each batch before the model sees it, to regularize a model on a
small training set: mixup of video-level features (Zhang et al. 2018) and feature dropout. Validation, evaluation and
prediction read the batches as they are."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from yt8m.data.reading.batch import Batch
from yt8m.fields import setting


@dataclass(frozen=True)
class AugmentConfig:
    """The `augment` section: mixup and feature dropout of the training batches (video-level features)."""

    mixup_alpha: float = setting(0.0, "Mixup (Zhang et al. 2018): train on lam x one video + (1 - lam) x another of "
                                      "its batch, features and labels alike, lam ~ Beta(alpha, alpha) per batch "
                                      "(0: off; the paper's alpha 0.2-0.4). Video-level features, a run without "
                                      "tasks or teacher.", at_least=0)
    feature_dropout: float = setting(0.0, "Zero each input feature of a training batch with this probability, the "
                                          "others scaled by 1 / (1 - p) (0: off). Video-level features.", at_least=0,
                                     below=1)

    @property
    def active(self) -> bool:
        return self.mixup_alpha > 0 or self.feature_dropout > 0


class Augmenter:
    """Applies the section to a training batch on its device; its random draws depend on (seed, rank, step, batch in
    the step) alone, so a resumed run draws what the uninterrupted one would."""

    def __init__(self, config: AugmentConfig, seed: int, rank: int):
        self.config, self.seed, self.rank = config, seed, rank

    def __call__(self, batch: Batch, step: int, index: int) -> Batch:
        if not self.config.active:
            return batch
        rng = np.random.default_rng([self.seed, self.rank, step, index])
        features, labels = batch.features, batch.labels
        if self.config.mixup_alpha > 0:
            lam = float(rng.beta(self.config.mixup_alpha, self.config.mixup_alpha))
            order = torch.from_numpy(rng.permutation(len(batch))).to(features.device)
            targets = labels.to(features.dtype)
            features = features * lam + features[order] * (1 - lam)
            labels = targets * lam + targets[order] * (1 - lam)
        if self.config.feature_dropout > 0:
            keep = 1 - self.config.feature_dropout
            generator = torch.Generator(device=features.device).manual_seed(int(rng.integers(2 ** 62)))
            mask = torch.rand(features.shape, generator=generator, device=features.device) < keep
            features = features * mask / keep
        return dataclasses.replace(batch, features=features, labels=labels)


def augment_problems(config: AugmentConfig, frame_features: bool, multitask: bool, teacher: bool) -> list[str]:
    """What the section cannot do with the run: frames are uint8 as stored, and mixed labels serve one task of the
    batch's own labels."""
    problems = []
    if config.active and frame_features:
        problems.append("--mixup_alpha and --feature_dropout act on video-level features (frame-level batches are "
                        "uint8 frames as stored): drop them or train on video-level data")
    if config.mixup_alpha > 0 and (multitask or teacher):
        problems.append("--mixup_alpha mixes a batch's own labels: it does not combine with tasks:, "
                        "--aux_vertical_weight or --teacher")
    return problems

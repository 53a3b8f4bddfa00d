"""The small-data regularizers: mixup and feature dropout of the training batches, stochastic weight averaging,
decoupled weight decay; each as its paper defines it, deterministic, and refused where it cannot act."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from workflow_fixtures import train_config
from yt8m.config import ConfigError
from yt8m.data.reading.batch import Batch
from yt8m.training.augment import AugmentConfig, Augmenter
from yt8m.training.checks import checked_train_config
from yt8m.training.optim import OptimizerConfig, build_optimizer
from yt8m.training.weight_average import EpochAverage


def batch(videos: int = 16, features: int = 6, classes: int = 5) -> Batch:
    generator = torch.Generator().manual_seed(0)
    return Batch([f"v{i}" for i in range(videos)], torch.randn(videos, features, generator=generator),
                 torch.rand(videos, classes, generator=generator) < 0.4)


def test_mixup_is_a_convex_combination_of_two_videos_of_the_batch_features_and_labels_alike():
    original = batch()
    mixed = Augmenter(AugmentConfig(mixup_alpha=0.4), seed=3, rank=0)(original, step=7, index=0)
    rng = np.random.default_rng([3, 0, 7, 0])  # the draws the augmenter makes, in its order
    lam, order = rng.beta(0.4, 0.4), torch.from_numpy(rng.permutation(16))
    labels = original.labels.float()
    torch.testing.assert_close(mixed.features, original.features * lam + original.features[order] * (1 - lam))
    torch.testing.assert_close(mixed.labels, labels * lam + labels[order] * (1 - lam))
    assert mixed.video_ids == original.video_ids
    again = Augmenter(AugmentConfig(mixup_alpha=0.4), seed=3, rank=0)(original, step=7, index=0)
    assert torch.equal(again.features, mixed.features)  # a resumed run draws the same
    other = Augmenter(AugmentConfig(mixup_alpha=0.4), seed=3, rank=0)(original, step=8, index=0)
    assert not torch.equal(other.features, mixed.features)


def test_feature_dropout_zeroes_a_share_p_and_scales_the_rest():
    original = Batch(["v"] * 200, torch.ones(200, 50), torch.zeros(200, 3, dtype=torch.bool))
    dropped = Augmenter(AugmentConfig(feature_dropout=0.3), seed=0, rank=0)(original, step=1, index=0)
    zero = (dropped.features == 0).float().mean().item()
    assert abs(zero - 0.3) < 0.02
    assert torch.allclose(dropped.features[dropped.features != 0], torch.tensor(1 / 0.7))
    assert torch.equal(dropped.labels, original.labels)


def test_without_augmentation_the_batch_is_untouched():
    original = batch()
    assert Augmenter(AugmentConfig(), seed=0, rank=0)(original, 1, 0) is original


@pytest.mark.parametrize("values, message", [
    ({"mixup_alpha": 0.2, "frame_features": True, "model": "DbofModel"}, "act on video-level features"),
    ({"feature_dropout": 0.1, "frame_features": True, "model": "DbofModel"}, "act on video-level features"),
    ({"mixup_alpha": 0.2, "aux_vertical_weight": 0.1, "vocabulary_file": "v.csv"}, "does not combine with tasks:"),
    ({"ema_decay": 0.99, "swa_start_epoch": 2}, "both average the weights: choose one"),
    ({"feature_dropout": 1.0}, "--feature_dropout must be below 1"),
])
def test_a_regularizer_that_cannot_act_is_a_config_error(values, message):
    with pytest.raises(ConfigError, match=message):
        checked_train_config(train_config(train_data_pattern="x", **values))


def test_swa_is_the_equal_average_of_each_epochs_weights_from_its_start():
    live = nn.Linear(3, 2)
    average = EpochAverage(start_epoch=2)
    snapshots = []
    for epoch in range(1, 5):
        with torch.no_grad():
            live.weight.add_(torch.full_like(live.weight, float(epoch)))
        average.end_epoch(live, epoch)
        if epoch >= 2:
            snapshots.append(live.weight.detach().clone())
        if epoch == 1:
            assert average.model is None  # before its start: the live weights are evaluated
    torch.testing.assert_close(average.model.weight, torch.stack(snapshots).mean(0))
    assert average.snapshots == 3 == average.snapshots_at(4)


def test_weight_decay_reaches_the_optimizer_and_is_refused_where_it_has_none():
    parameters = [nn.Parameter(torch.zeros(2))]
    assert build_optimizer(OptimizerConfig(name="AdamW", weight_decay=0.05), parameters).defaults[
        "weight_decay"] == 0.05
    assert build_optimizer(OptimizerConfig(name="AdamW"), parameters).defaults["weight_decay"] == 0.01  # torch's
    with pytest.raises(ValueError, match="--weight_decay: Rprop takes no weight_decay"):
        build_optimizer(OptimizerConfig(name="Rprop", weight_decay=0.1), parameters)

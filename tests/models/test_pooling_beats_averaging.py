"""On synthetic frame-level data whose evidence for half the labels lies in a window of frames (yt8m synth --kind
frame), NeXtVLAD beats a MoE on the videos' averaged frames (what video-level features are), for the same epochs."""

from __future__ import annotations

import torch
from model_helpers import single_threaded

from yt8m.data.making.synthetic import write_synthetic
from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset
from yt8m.eval.metrics import calculate_gap
from yt8m.models import create_model
from yt8m.tasks.losses import create_loss

CLASSES, SIZES, EPOCHS = 20, (32, 16), 8


def load(pattern: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch = next(iter(YT8MDataset(pattern, FeatureSpec(["rgb", "audio"], list(SIZES), True, num_classes=CLASSES),
                                  100_000)))
    return batch.features, batch.num_frames, batch.labels.float()


def averaged(features: torch.Tensor, num_frames: torch.Tensor) -> torch.Tensor:
    return features.sum(dim=1) / num_frames[:, None]  # padding is zero


def validation_gap(name: str, train, validate, on_average: bool, **hparams) -> float:
    torch.manual_seed(0)
    model = create_model(name, sum(SIZES), CLASSES, modality_sizes=SIZES, **hparams)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.004)
    loss_fn = create_loss("CrossEntropyLoss")
    features, num_frames, labels = train
    order = torch.Generator().manual_seed(0)
    for _ in range(EPOCHS):
        model.train()
        for rows in torch.randperm(len(labels), generator=order).split(32):
            inputs = (averaged(features[rows], num_frames[rows]), None) if on_average else (features[rows], num_frames[rows])
            loss = loss_fn(model(*inputs), labels[rows]) + model.regularization_loss()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    features, num_frames, labels = validate
    inputs = (averaged(features, num_frames), None) if on_average else (features, num_frames)
    with torch.no_grad():
        return calculate_gap(model(*inputs)["predictions"].numpy(), labels.numpy())


def test_nextvlad_beats_a_moe_on_averaged_frames(tmp_path):
    written = write_synthetic(str(tmp_path), kind="frame", num_classes=CLASSES, train_videos=1500,
                              validate_videos=400, test_videos=0, shards=1, feature_sizes=SIZES, min_frames=20,
                              max_frames=60, seed=1)
    train, validate = load(written["train"][0]), load(written["validate"][0])
    with single_threaded():
        moe = validation_gap("MoeModel", train, validate, on_average=True)
        # 376 steps: slim's decay (0.999) leaves the batch norms' statistics 69% at their start (GAP 0.56)
        nextvlad = validation_gap("NeXtVLADModel", train, validate, on_average=False, nextvlad_cluster_size=16,
                                  nextvlad_hidden_size=64, nextvlad_groups=4, pooling_batch_norm_decay=0.99)
    assert nextvlad > moe + 0.05, f"NeXtVLAD GAP {nextvlad:.3f}, MoE on averaged frames {moe:.3f}"

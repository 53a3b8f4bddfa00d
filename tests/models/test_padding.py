"""Padding never changes a frame-level model's output: not its length, not what it holds."""

from __future__ import annotations

import pytest
import torch
from model_helpers import tiny_model

from yt8m.models import is_frame_level, list_models

FRAME_MODELS = [name for name in list_models() if is_frame_level(name)]
LENGTHS = torch.tensor([5, 1, 7, 3])


def padded(videos: list, length: int) -> torch.Tensor:
    """Videos padded to `length` frames with garbage, which the model must never read."""
    batch = torch.randn(len(videos), length, videos[0].shape[1]) * 100
    for i, video in enumerate(videos):
        batch[i, :len(video)] = video
    return batch


def warmed_up(name: str, **overrides):
    """A model whose batch-norm statistics moved away from their initial values."""
    torch.manual_seed(0)
    model = tiny_model(name, feature_size=6, num_classes=5, **overrides)
    model(torch.randn(8, 7, 6), torch.full((8,), 7))
    return model


@pytest.mark.parametrize("name", FRAME_MODELS)
@pytest.mark.parametrize("sample_random_frames", [True, False])
def test_eval_output_is_independent_of_padding_and_batch(name, sample_random_frames):
    model = warmed_up(name, sample_random_frames=sample_random_frames).eval()
    videos = [torch.randn(int(n), 6) for n in LENGTHS]
    batched = model(padded(videos, 12), LENGTHS)["logits"]
    for i, video in enumerate(videos):
        alone = model(video[None], torch.tensor([len(video)]))["logits"]
        torch.testing.assert_close(batched[i:i + 1], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sample_random_frames", [True, False])
def test_dbof_training_samples_only_real_frames(sample_random_frames):
    model = warmed_up("DbofModel", sample_random_frames=sample_random_frames).train()
    videos = [torch.randn(int(n), 6) for n in LENGTHS]
    outputs = []
    for batch in (padded(videos, 7), padded(videos, 30)):
        torch.manual_seed(3)  # the same frame samples for both paddings
        outputs.append(model(batch, LENGTHS)["logits"])
    torch.testing.assert_close(outputs[0], outputs[1])
    index = model.frame_indices(LENGTHS)
    assert index.shape == (4, 8) and (index < LENGTHS[:, None]).all() and (index >= 0).all()


def test_dbof_eval_sampling_spreads_over_the_video():
    model = tiny_model("DbofModel", feature_size=6, num_classes=5).eval()
    assert model.frame_indices(torch.tensor([16])).tolist() == [[1, 3, 5, 7, 9, 11, 13, 15]]
    model.sample_random_frames = False
    assert model.frame_indices(torch.tensor([16, 3])).tolist() == [
        [4, 5, 6, 7, 8, 9, 10, 11], [0, 1, 2, 2, 2, 2, 2, 2]]


@pytest.mark.parametrize("name", FRAME_MODELS)
def test_videos_without_frames_read_one_zero_frame(name):
    """A batch of only 0-frame videos (no frame axis at all, or zero padding) has a defined, finite output in
    training and evaluation, the same either way it comes."""
    model = warmed_up(name)
    no_frames = torch.zeros(3, dtype=torch.long)
    output = model(torch.zeros(3, 0, 6), no_frames)
    output["logits"].sum().backward()
    assert torch.isfinite(output["logits"]).all()
    model.eval()
    torch.testing.assert_close(model(torch.zeros(3, 0, 6), no_frames)["logits"],
                               model(torch.zeros(3, 1, 6), no_frames)["logits"])
    assert torch.isfinite(model(torch.zeros(3, 0, 6), None)["logits"]).all()

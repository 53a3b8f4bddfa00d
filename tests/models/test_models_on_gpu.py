"""Every registered model on CUDA (`pytest -m gpu`; skipped elsewhere): the CPU's outputs, a mixed-precision step
with finite gradients, and compiled mixed-precision training of the pooling models, then ONNX export and predict."""

from __future__ import annotations

import pytest
import torch
from model_helpers import export_then_predict, random_input, tiny_model, train_frames, write_eight_frame_data

from yt8m.models import list_models
from yt8m.runtime import autocast
from yt8m.tasks.losses import create_loss

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


@pytest.mark.parametrize("name", list_models())
def test_every_model_steps_on_the_gpu_under_mixed_precision(name):
    """The GPU gives the CPU's float32 outputs; a mixed-precision step gives finite CUDA gradients for every weight
    and predictions near float32's."""
    torch.manual_seed(0)
    model = tiny_model(name, 24, 10).eval()
    features, num_frames = random_input(name, 16, 24)
    labels = (torch.rand(16, 10, generator=torch.Generator().manual_seed(1)) < 0.3).float().to(CUDA)
    with torch.no_grad():
        on_cpu = model(features, num_frames)["predictions"]
        model.to(CUDA)
        cuda_input = (features.to(CUDA), None if num_frames is None else num_frames.to(CUDA))
        torch.testing.assert_close(model(*cuda_input)["predictions"].cpu(), on_cpu, rtol=1e-3, atol=1e-4)
        with autocast(CUDA, True):
            mixed = model(*cuda_input)["predictions"].float().cpu()
    assert (mixed - on_cpu).abs().max() < 0.05
    model.train()
    with autocast(CUDA, True):
        loss = create_loss("CrossEntropyLoss")(model(*cuda_input), labels)
    loss.backward()
    assert torch.isfinite(loss)
    for weight_name, weight in model.named_parameters():
        assert weight.grad is not None and weight.grad.is_cuda, weight_name
        assert torch.isfinite(weight.grad).all(), weight_name


@pytest.mark.parametrize("name, flags", [
    ("NeXtVLADModel", ["--nextvlad_cluster_size", "8", "--nextvlad_hidden_size", "32", "--nextvlad_groups", "4"]),
    ("NetVLADModel", ["--netvlad_cluster_size", "8", "--willow_hidden_size", "32"]),
    ("TransformerModel", ["--transformer_hidden_size", "32", "--transformer_heads", "4"]),
])
def test_compiled_mixed_precision_training_on_the_gpu_then_export_predicts(name, flags, tmp_path, capsys):
    data = write_eight_frame_data(tmp_path / "data")
    summary = train_frames("--model", name, *flags, "--train_data_pattern", data["train"], "--train_dir",
                           str(tmp_path / "run"), "--num_epochs", "2", "--device", "cuda", "--compile",
                           "--mixed_precision")
    assert summary["global_step"] == 8 and summary["loss"] > 0
    assert len(export_then_predict(tmp_path / "run", data["validate"], tmp_path, capsys)) == 1 + 16

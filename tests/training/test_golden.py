"""Golden values: 20 training steps of LogisticModel and MoeModel (the trainer's step: label loss, L2 penalties,
per-weight clipping, Adam) on fixed synthetic data and seed, each loss asserted to 1e-5 against the values recorded
here, with the fused CPU kernels on and off: both paths must give the same losses."""

from __future__ import annotations

import pytest
import torch

from yt8m import kernels
from yt8m.models import create_model
from yt8m.tasks.losses import create_loss
from yt8m.training.optim import OptimizerConfig, apply_update, build_optimizer, l2_terms

FEATURES, CLASSES, BATCH, STEPS = 32, 24, 32, 20
# Recorded on the eager path, torch 2.13 on an x86-64 CPU, one thread; the fused path came within 4e-6 of them.
GOLDEN = {
    "LogisticModel": [16.7123566, 16.5415859, 16.4610043, 16.3522205, 16.1857853, 15.9180231, 15.7934103, 15.4690647,
                      15.2712545, 15.3722706, 15.2583990, 15.0372076, 14.6157551, 14.4993868, 14.7233152, 14.2914591,
                      14.2711859, 14.3374720, 13.8334141, 13.9254789],
    "MoeModel": [12.4339666, 12.0893507, 12.2167768, 12.1028976, 11.6569023, 12.0114841, 11.4830227, 11.5823927,
                 11.2564850, 11.2120972, 10.9387436, 10.7316628, 10.8215580, 10.4242010, 10.7751036, 10.2173328,
                 10.5411406, 10.4696474, 10.0110140, 10.3405838],
}


@pytest.fixture(params=["fused", "eager"])
def kernel_path(request):
    """The fused kernels on (where the extension is built) or off, on one thread: a GEMM's sums may be split
    differently on more."""
    enabled, threads = kernels.enabled_kernels(), torch.get_num_threads()
    kernels.set_enabled_kernels(kernels.KERNELS if request.param == "fused" else ())
    torch.set_num_threads(1)
    yield request.param
    torch.set_num_threads(threads)
    kernels.set_enabled_kernels(enabled)


def synthetic_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Learnable data: each video's features are the sum of its classes' prototypes plus noise."""
    generator = torch.Generator().manual_seed(0)
    prototypes = torch.randn(CLASSES, FEATURES, generator=generator)
    batches = []
    for _ in range(STEPS):
        labels = torch.rand(BATCH, CLASSES, generator=generator) < 0.15
        features = labels.float() @ prototypes + torch.randn(BATCH, FEATURES, generator=generator)
        batches.append((features, labels))
    return batches


def training_losses(name: str) -> list[float]:
    """The label loss of each step, as `yt8m train` takes them with the starter kit's defaults."""
    torch.manual_seed(0)
    model = create_model(name, FEATURES, CLASSES).train()
    optimizer = build_optimizer(OptimizerConfig(name="Adam", base_learning_rate=0.01), model.parameters())
    penalties, loss_fn = l2_terms(model, 1.0), create_loss("CrossEntropyLoss")
    no_scaling = torch.amp.GradScaler("cpu", enabled=False)
    losses = []
    for features, labels in synthetic_batches():
        loss = loss_fn(model(features), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        apply_update(model, optimizer, no_scaling, 1.0, 0.0, penalties)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_training_losses_match_the_golden_values(kernel_path, name):
    losses = training_losses(name)
    assert losses == pytest.approx(GOLDEN[name], abs=1e-5, rel=0)
    assert losses[-1] < 0.9 * losses[0]  # it learns

"""The optimizer step: the L2 penalties' gradients, each weight's gradient clipped to its own norm, then the
optimizer (torch's fused Adam by default)."""

import pytest
import torch
from torch import nn

from yt8m.models import create_model
from yt8m.training.optim import OptimizerConfig, apply_update, build_optimizer, l2_terms

NO_SCALING = torch.amp.GradScaler("cuda", enabled=False)
LR, MAX_NORM = 0.05, 1.0


class Layers(nn.Module):
    """A weight large enough to be split over threads, a small one, a bias, and a penalized weight the loss
    never reaches (its gradient is the penalty's alone)."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.big = nn.Parameter(torch.randn(400, 410, generator=generator) * 0.1)
        self.small = nn.Parameter(torch.randn(30, 7, generator=generator))
        self.bias = nn.Parameter(torch.randn(7, generator=generator))
        self.unused = nn.Parameter(torch.randn(5, 3, generator=generator))

    def penalties(self) -> list[tuple[nn.Parameter, float]]:
        return [(self.big, 0.01), (self.small, 0.001), (self.unused, 2.0)]


def gradients(step: int) -> dict[str, torch.Tensor]:
    """Per step, gradients whose norms (penalties included) fall on both sides of MAX_NORM: clipped, then not."""
    generator = torch.Generator().manual_seed(100 + step)
    scale = 0.001 if step % 2 else 1.0
    return {"big": torch.randn(400, 410, generator=generator) * scale,
            "small": torch.randn(30, 7, generator=generator) * scale,
            "bias": torch.randn(7, generator=generator) * scale}


def train_layers(steps: int, clip_gradient_value: float = 0.0) -> tuple[Layers, torch.optim.Optimizer]:
    layers = Layers()
    optimizer = build_optimizer(OptimizerConfig(name="Adam", base_learning_rate=LR), layers.parameters())
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        for name, grad in gradients(step).items():
            getattr(layers, name).grad = grad.clone()
        apply_update(layers, optimizer, NO_SCALING, MAX_NORM, clip_gradient_value, layers.penalties())
    return layers, optimizer


def reference_adam(steps: int) -> dict[str, torch.Tensor]:
    """The starter kit's step in float64: g + coefficient x w, scaled to a norm of at most MAX_NORM, then Adam."""
    layers = Layers()
    coefficients = {"big": 0.01, "small": 0.001, "unused": 2.0}
    weights = {name: parameter.detach().double().clone() for name, parameter in layers.named_parameters()}
    first = {name: torch.zeros_like(weight) for name, weight in weights.items()}
    second = {name: torch.zeros_like(weight) for name, weight in weights.items()}
    for step in range(1, steps + 1):
        grads = gradients(step - 1)
        for name, weight in weights.items():
            grad = grads[name].double() if name in grads else torch.zeros_like(weight)
            grad = grad + coefficients.get(name, 0.0) * weight
            grad = grad * min(1.0, MAX_NORM / grad.norm().item())
            first[name] = 0.9 * first[name] + 0.1 * grad
            second[name] = 0.999 * second[name] + 0.001 * grad * grad
            denominator = second[name].sqrt() / (1 - 0.999 ** step) ** 0.5 + 1e-8
            weight -= LR / (1 - 0.9 ** step) * first[name] / denominator
    return weights


def test_the_step_matches_a_float64_reference_of_the_starter_kits_step():
    layers, optimizer = train_layers(steps=4)
    expected = reference_adam(steps=4)
    for name, parameter in layers.named_parameters():
        torch.testing.assert_close(parameter.detach().double(), expected[name], rtol=1e-5, atol=1e-6)
        assert optimizer.state[parameter]["step"].item() == 4
    assert optimizer.defaults["fused"]  # torch's fused Adam on the CPU


def test_clipping_by_a_value_the_gradients_never_reach_changes_nothing():
    clipped, _ = train_layers(steps=4, clip_gradient_value=1e6)
    for (name, got), want in zip(clipped.named_parameters(), train_layers(steps=4)[0].parameters()):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("name", ["LogisticModel", "MoeModel", "DbofModel"])
def test_l2_terms_give_the_gradient_of_the_models_regularization_loss(name):
    """The trainer's penalty gradients equal autograd's of regularization_penalty x regularization_loss()."""
    torch.manual_seed(0)
    kwargs = {"dbof_cluster_size": 8, "dbof_hidden_size": 6} if name == "DbofModel" else {}
    model = create_model(name, 5, 4, l2_penalty=0.3, **kwargs)
    (3.0 * model.regularization_loss()).backward()
    expected = {parameter: parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None}
    terms = l2_terms(model, 3.0)
    assert {id(weight) for weight, _ in terms} == {id(parameter) for parameter in expected}
    for weight, coefficient in terms:
        torch.testing.assert_close(coefficient * weight.detach(), expected[weight])
    assert l2_terms(model, 0.0) == []

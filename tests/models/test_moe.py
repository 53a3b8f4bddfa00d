"""MoeModel: the starter kit's mixture probabilities, with logits that stay finite at the extremes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from yt8m.models import create_model


def one_class_moe(gate: float, dummy_gate: float, expert: float):
    """A 1-class, 1-expert MoE whose activations for input [1, 0] are the given values."""
    model = create_model("MoeModel", 2, 1, moe_num_mixtures=1)
    with torch.no_grad():
        model.gates.weight.copy_(torch.tensor([[gate, 0.0], [dummy_gate, 0.0]]))
        model.experts.weight.copy_(torch.tensor([[expert, 0.0]]))
        model.experts.bias.zero_()
    return model


def exact_logit(gate: float, dummy_gate: float, expert: float) -> float:
    """log p - log(1 - p) in float64 for p = softmax(gate, dummy_gate)[0] * sigmoid(expert)."""
    log_gate, log_dummy = np.array([gate, dummy_gate]) - np.logaddexp(gate, dummy_gate)
    log_p = log_gate - np.logaddexp(0.0, -expert)
    log_not_p = np.logaddexp(log_dummy, log_gate - np.logaddexp(0.0, expert))
    return float(log_p - log_not_p)


@pytest.mark.parametrize("gate, dummy_gate, expert", [
    (0.0, 0.0, 0.0), (1.5, -0.5, 2.0), (60.0, -60.0, 300.0), (-60.0, 60.0, 5.0), (3.0, 0.0, -300.0),
])
def test_logits_are_exact_and_finite_at_extremes(gate, dummy_gate, expert):
    logits = one_class_moe(gate, dummy_gate, expert)(torch.tensor([[1.0, 0.0]]))["logits"]
    assert torch.isfinite(logits).all()
    assert logits.item() == pytest.approx(exact_logit(gate, dummy_gate, expert), rel=1e-5, abs=1e-4)


def test_predictions_equal_the_starter_kit_mixture():
    torch.manual_seed(0)
    model = create_model("MoeModel", 10, 6, moe_num_mixtures=3)
    features = torch.nn.functional.normalize(torch.randn(8, 10), dim=-1)
    gates = torch.softmax(model.gates(features).view(8, 6, 4), dim=-1)
    experts = torch.sigmoid(model.experts(features).view(8, 6, 3))
    expected = (gates[..., :3] * experts).sum(-1)
    torch.testing.assert_close(model(features)["predictions"], expected, rtol=1e-5, atol=1e-6)

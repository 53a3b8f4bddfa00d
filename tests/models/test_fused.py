"""The fused CPU kernels against their eager references: values and gradients, extremes, NaN, dispatch."""

import pytest
import torch

from yt8m.kernels import use_fused_kernels
from yt8m.models.fused import MoeMixture
from yt8m.models.video import mixture_logits


def mixture_inputs(mixtures: int, classes: int = 37, rows: int = 9, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    gates = torch.randn(rows, classes * (mixtures + 1), generator=generator) * 4
    experts = torch.randn(rows, classes * mixtures, generator=generator) * 4
    # Extremes where terms underflow in float32: the kernel redoes those classes in log space.
    gates[0, :mixtures + 1] = torch.tensor([60.0] + [-60.0] * mixtures)
    experts[0, :mixtures] = 300.0
    experts[1, :mixtures] = -300.0
    gates[2, -(mixtures + 1):] = torch.tensor([-90.0] * mixtures + [90.0])
    return gates, experts


@pytest.mark.parametrize("mixtures", [1, 2, 3, 4, 6])
def test_moe_mixture_matches_the_float64_reference(mixtures):
    gates, experts = mixture_inputs(mixtures)
    dlogits = torch.randn(gates.shape[0], gates.shape[1] // (mixtures + 1), generator=torch.Generator().manual_seed(1))
    fused_gates, fused_experts = gates.clone().requires_grad_(), experts.clone().requires_grad_()
    assert use_fused_kernels(fused_gates, fused_experts)
    logits = MoeMixture.apply(fused_gates, fused_experts, mixtures)
    logits.backward(dlogits)
    reference_gates, reference_experts = gates.double().requires_grad_(), experts.double().requires_grad_()
    expected = mixture_logits(reference_gates, reference_experts, mixtures)
    expected.backward(dlogits.double())
    torch.testing.assert_close(logits, expected.float(), rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(fused_gates.grad, reference_gates.grad.float(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fused_experts.grad, reference_experts.grad.float(), rtol=1e-4, atol=1e-6)
    assert abs(logits[0, 0].item()) > 100  # the extreme classes really were extreme, and came out exact


def test_moe_mixture_keeps_a_nan():
    gates, experts = mixture_inputs(2)
    gates[3, 5] = float("nan")
    experts[4, 7] = float("nan")
    logits = MoeMixture.apply(gates, experts, 2)
    assert torch.isnan(logits[3, 5 // 3]) and torch.isnan(logits[4, 7 // 2])
    assert torch.isfinite(logits[5:]).all()


def test_the_kernels_run_only_on_contiguous_float32_cpu_tensors():
    gates, experts = mixture_inputs(2)
    assert use_fused_kernels(gates, experts)
    assert not use_fused_kernels(gates.bfloat16(), experts)
    assert not use_fused_kernels(gates.t(), experts)
    assert not use_fused_kernels(gates.double(), experts)


def test_a_forked_child_runs_the_kernels_on_its_own_threads():
    """The parent's pool threads do not survive fork: a child that trains starts its own."""
    import multiprocessing

    gates, experts = mixture_inputs(2)
    expected = MoeMixture.apply(gates, experts, 2)  # the parent's pool now exists
    with multiprocessing.get_context("fork").Pool(1) as pool:
        logits = pool.apply_async(MoeMixture.apply, (gates, experts, 2)).get(timeout=60)  # hangs without the fix
    torch.testing.assert_close(logits, expected)

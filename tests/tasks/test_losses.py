"""The label losses against straightforward formulas (the starter kit's), and stable at the extremes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from yt8m.config import ConfigError
from yt8m.tasks.losses import LossConfig, create_loss

LABELS = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])


def output_for(logits: torch.Tensor) -> dict:
    return {"logits": logits, "predictions": torch.sigmoid(logits)}


def random_logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2


# bool: the multi-hot labels the reader gives, taken by the positives' index; float: any dense labels.
@pytest.mark.parametrize("labels", [LABELS, LABELS.bool()], ids=["float", "bool"])
def test_cross_entropy_equals_the_starter_formula_on_moderate_logits(labels):
    logits = random_logits()
    p = torch.sigmoid(logits)
    expected = -(LABELS * torch.log(p) + (1 - LABELS) * torch.log(1 - p)).sum(1).mean()
    assert create_loss("CrossEntropyLoss")(output_for(logits), labels).item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("labels", [LABELS, LABELS.bool()], ids=["float", "bool"])
def test_cross_entropy_gradient_equals_the_formula_gradient(labels):
    logits = random_logits(4).requires_grad_()
    create_loss("CrossEntropyLoss")(output_for(logits), labels).backward()
    expected = (torch.sigmoid(logits.detach()) - LABELS) / len(LABELS)
    torch.testing.assert_close(logits.grad, expected)


def test_cross_entropy_stays_exact_where_log_p_plus_epsilon_saturates():
    logits = torch.tensor([[-200.0, 200.0]])
    labels = torch.tensor([[1.0, 0.0]])
    p = torch.sigmoid(logits)
    starter = -(labels * torch.log(p + 1e-5) + (1 - labels) * torch.log(1 - p + 1e-5)).sum(1).mean()
    assert starter.item() == pytest.approx(2 * 11.51, rel=1e-3)  # capped: no gradient signal left
    loss = create_loss("CrossEntropyLoss")(output_for(logits.requires_grad_()), labels)
    assert loss.item() == pytest.approx(400.0)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad.abs() > 0.4).all()


def float32_case() -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits spanning both signs and the extremes where sigmoid rounds to 0 or 1, with sparse bool labels
    (the reader's): training's case."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(40, 4000, generator=generator) * 8 - 4
    logits[0, :8] = torch.tensor([-200.0, 200.0, 0.0, -0.0, 1e-8, -1e-8, -30.0, 40.0])
    labels = torch.rand(40, 4000, generator=generator) < 0.01
    labels[0, :2] = True
    return logits, labels


def float64_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, torch.Tensor]:
    x = logits.double().requires_grad_()
    loss = (F.softplus(x) - x * labels.double()).sum(1).mean()
    loss.backward()
    return loss.item(), x.grad.float()


@pytest.mark.parametrize("weight", [1.0, 3.0])
def test_float32_cross_entropy_matches_float64_in_value_and_gradient(weight):
    logits, labels = float32_case()
    expected_loss, expected_gradient = float64_cross_entropy(logits, labels)
    trained = logits.clone().requires_grad_()
    loss = create_loss("CrossEntropyLoss")(output_for(trained), labels)
    (loss * weight).backward()
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(expected_loss, rel=1e-6)
    # (p - 1) / batch with p a float32 sigmoid: off by up to an ulp of 1 / batch where p rounds to 1
    torch.testing.assert_close(trained.grad, expected_gradient * weight, rtol=1e-5, atol=weight * 2e-8)
    with torch.no_grad():  # evaluation: no gradient written, the same value
        assert create_loss("CrossEntropyLoss")(output_for(logits), labels).item() == loss.item()


def test_float32_cross_entropy_keeps_a_nan():
    logits, labels = float32_case()
    logits[3, 7] = float("nan")
    assert torch.isnan(create_loss("CrossEntropyLoss")(output_for(logits), labels))


def test_hinge_loss_on_predictions_with_margin_one():
    logits = random_logits(1)
    p = torch.sigmoid(logits)
    expected = torch.clamp(1.0 - (2 * LABELS - 1) * p, min=0).sum(1).mean()
    assert create_loss("HingeLoss")(output_for(logits), LABELS).item() == pytest.approx(expected.item(), rel=1e-6)


def test_softmax_loss_normalizes_labels_per_video():
    logits = random_logits(2)
    p = torch.sigmoid(logits)
    softmax = torch.exp(p) / torch.exp(p).sum(1, keepdim=True)
    per_video = [-(LABELS[i] / LABELS[i].sum() * torch.log(softmax[i])).sum() if LABELS[i].sum() else torch.tensor(0.0)
                 for i in range(3)]
    expected = torch.stack([v.double() for v in per_video]).mean()
    assert create_loss("SoftmaxLoss")(output_for(logits), LABELS).item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("name", ["CrossEntropyLoss", "HingeLoss", "SoftmaxLoss"])
def test_losses_are_scalars_with_gradients(name):
    logits = random_logits(3).float().requires_grad_()
    loss = create_loss(name)(output_for(logits), LABELS)
    loss.backward()
    assert loss.dim() == 0 and torch.isfinite(loss) and torch.isfinite(logits.grad).all()


def test_unknown_loss_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"--label_loss 'L1' is not a loss \(known: CrossEntropyLoss, FocalLoss, "
                                         r"HingeLoss, SoftmaxLoss; one of your own: package.module:Name"):
        create_loss("L1")


# --- losses with hyper-parameters, against the papers' formulas in float64 NumPy ----------------------------------

def numpy_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def numpy_focal(logits: np.ndarray, labels: np.ndarray, gamma: float, alpha: float) -> float:
    """Lin et al. 2017, eq. 5 per class: -alpha_t (1 - p_t)^gamma log(p_t); summed over classes, mean over videos."""
    p = numpy_sigmoid(logits)
    p_t = np.where(labels > 0, p, 1 - p)
    alpha_t = np.where(labels > 0, alpha, 1 - alpha)
    return float((-alpha_t * (1 - p_t) ** gamma * np.log(p_t)).sum(1).mean())


@pytest.mark.parametrize("gamma, alpha", [(2.0, 0.25), (0.5, 0.6), (0.0, 0.5)])
def test_focal_loss_is_the_papers(gamma, alpha):
    logits = random_logits(7)
    loss = create_loss(LossConfig("FocalLoss", {"focal_gamma": gamma, "focal_alpha": alpha}))
    expected = numpy_focal(logits.numpy(), LABELS.numpy(), gamma, alpha)
    assert loss(output_for(logits.float()), LABELS.bool()).item() == pytest.approx(expected, rel=1e-5)


def test_focal_loss_at_gamma_0_and_alpha_half_is_half_the_cross_entropy():
    logits = random_logits(8)
    focal = create_loss(LossConfig("FocalLoss", {"focal_gamma": 0.0, "focal_alpha": 0.5}))(output_for(logits), LABELS)
    assert focal.item() == pytest.approx(create_loss("CrossEntropyLoss")(output_for(logits), LABELS).item() / 2)


def test_focal_loss_weights_each_rated_class_term():
    logits = random_logits(9)
    loss = create_loss("FocalLoss")(output_for(logits), LABELS, WEIGHTS)
    p = numpy_sigmoid(logits.numpy())
    labels = LABELS.numpy()
    p_t = np.where(labels > 0, p, 1 - p)
    terms = -np.where(labels > 0, 0.25, 0.75) * (1 - p_t) ** 2 * np.log(p_t) * WEIGHTS.numpy()
    assert loss.item() == pytest.approx(float(terms.sum(1).mean()), rel=1e-6)


@pytest.mark.parametrize("labels", [LABELS, LABELS.bool()], ids=["float", "bool"])
def test_label_smoothing_moves_each_target_toward_one_half(labels):
    logits = random_logits(10)
    epsilon = 0.1
    smoothed = LABELS.numpy() * (1 - epsilon) + epsilon / 2
    p = numpy_sigmoid(logits.numpy())
    expected = float(-(smoothed * np.log(p) + (1 - smoothed) * np.log(1 - p)).sum(1).mean())
    loss = create_loss(LossConfig("CrossEntropyLoss", {"label_smoothing": epsilon}))
    trained = logits.float().requires_grad_()
    value = loss(output_for(trained), labels)
    value.backward()
    assert value.item() == pytest.approx(expected, rel=1e-6)
    np.testing.assert_allclose(trained.grad.numpy(), (p - smoothed) / len(p), rtol=1e-5, atol=1e-7)


def test_loss_hyper_parameters_are_checked_and_named():
    """Checked when the section is resolved (the run is built), not when it is made: a config only describes."""
    with pytest.raises(ConfigError, match="--focal_alpha must be at most 1, got 1.5"):
        LossConfig("FocalLoss", {"focal_alpha": 1.5}).resolved()
    with pytest.raises(ConfigError, match="--loss.focal_gama: FocalLoss has no hyper-parameter 'focal_gama'; did you "
                                          "mean 'focal_gamma'"):
        LossConfig("FocalLoss", {"focal_gama": 1.0}).resolved()


# --- label weights (the 2019 segment task: 1 where a class was rated) ------------------------------------------

WEIGHTS = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]])


def weighted_reference(name: str, logits: torch.Tensor) -> torch.Tensor:
    """The starter kit's per-(example, class) loss times the weights, summed over classes, averaged over
    examples, in float64."""
    p, labels, weights = torch.sigmoid(logits.double()), LABELS.double(), WEIGHTS.double()
    if name == "CrossEntropyLoss":
        terms = -(labels * torch.log(p) + (1 - labels) * torch.log(1 - p))
    else:
        terms = torch.clamp(1.0 - (2 * labels - 1) * p, min=0)
    return (terms * weights).sum(1).mean()


@pytest.mark.parametrize("weights", [WEIGHTS, WEIGHTS.bool()], ids=["float", "bool"])
@pytest.mark.parametrize("name", ["CrossEntropyLoss", "HingeLoss"])
def test_label_weights_multiply_each_class_term(name, weights):
    logits = random_logits(5).float().requires_grad_()
    loss = create_loss(name)(output_for(logits), LABELS.bool(), weights)
    reference_logits = logits.detach().double().requires_grad_()
    expected = weighted_reference(name, reference_logits)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    torch.testing.assert_close(logits.grad.double(), reference_logits.grad, rtol=1e-5, atol=1e-7)
    assert not logits.grad[WEIGHTS == 0].any()  # an unrated class gets no gradient


@pytest.mark.parametrize("name", ["CrossEntropyLoss", "HingeLoss"])
def test_all_ones_weights_give_the_unweighted_loss(name):
    logits = random_logits(6)
    unweighted = create_loss(name)(output_for(logits), LABELS)
    assert create_loss(name)(output_for(logits), LABELS, torch.ones_like(LABELS)).item() == pytest.approx(
        unweighted.item(), rel=1e-6)


def test_softmax_loss_refuses_label_weights():
    with pytest.raises(ValueError, match="SoftmaxLoss takes no label weights"):
        create_loss("SoftmaxLoss")(output_for(random_logits()), LABELS, WEIGHTS)

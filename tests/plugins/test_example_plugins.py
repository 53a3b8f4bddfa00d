"""examples/plugins, the example plugin package: its loss is the paper's, its model ignores padding, its metric counts
and merges, and every entry point its pyproject.toml declares names a component yt8m adopts, under flags no other
setting has. Read from the source folder (not installed); tests/plugins/test_own_components.py runs it through the CLI.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT
from yt8m.config import config_settings
from yt8m.models.registry import MODELS, adopt_model
from yt8m.plugins.registry import import_object
from yt8m.tasks.losses import LOSSES, adopt_loss, create_loss
from yt8m.tasks.metrics import METRICS, adopt_metric
from yt8m.training.config import TrainConfig

EXAMPLE = REPO_ROOT / "examples" / "plugins"
GROUPS = {MODELS.group: adopt_model, LOSSES.group: adopt_loss, METRICS.group: adopt_metric}


@pytest.fixture(scope="module")
def example():
    """The example package's modules, imported from examples/plugins."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        yield {name: importlib.import_module(f"yt8m_example_plugins.{name}")
               for name in ("models", "losses", "metrics")}
    finally:
        sys.path.remove(str(EXAMPLE))


def entry_points() -> dict[str, dict[str, str]]:
    """The entry-point groups of examples/plugins/pyproject.toml: group -> {name: module:attribute}."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib (Python 3.11+) reads pyproject.toml")
    with open(EXAMPLE / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]["entry-points"]


def asl_reference(logits: np.ndarray, labels: np.ndarray, gamma_neg: float, gamma_pos: float, clip: float) -> float:
    """ASL from Ridnik et al. 2021's equations in float64: L+ = (1 - p)^g+ log p, L- = p_m^g- log(1 - p_m),
    p_m = max(p - m, 0); -(y L+ + (1 - y) L-) summed over classes, averaged over videos."""
    p = 1 / (1 + np.exp(-logits))
    shifted = np.maximum(p - clip, 0)
    positive = (1 - p) ** gamma_pos * np.log(p)
    negative = shifted ** gamma_neg * np.log(1 - shifted)
    return float(-(labels * positive + (1 - labels) * negative).sum(axis=1).mean())


@pytest.mark.parametrize("gamma_neg, gamma_pos, clip", [(4.0, 0.0, 0.05), (2.0, 1.0, 0.0), (1.0, 0.5, 0.2)])
def test_asymmetric_loss_is_the_papers(example, gamma_neg, gamma_pos, clip):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 10, generator=generator, dtype=torch.float64) * 3
    labels = torch.rand(16, 10, generator=generator) < 0.3
    loss = example["losses"].asymmetric_loss({"logits": logits, "predictions": torch.sigmoid(logits)}, labels,
                                             asl_gamma_neg=gamma_neg, asl_gamma_pos=gamma_pos, asl_clip=clip)
    expected = asl_reference(logits.numpy(), labels.numpy().astype(np.float64), gamma_neg, gamma_pos, clip)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_asymmetric_loss_without_focusing_or_margin_is_the_cross_entropy(example):
    logits = torch.randn(8, 6, generator=torch.Generator().manual_seed(1)) * 4
    labels = torch.rand(8, 6, generator=torch.Generator().manual_seed(2)) < 0.4
    output = {"logits": logits, "predictions": torch.sigmoid(logits)}
    asl = example["losses"].asymmetric_loss(output, labels, asl_gamma_neg=0.0, asl_gamma_pos=0.0, asl_clip=0.0)
    assert asl.item() == pytest.approx(create_loss("CrossEntropyLoss")(output, labels).item(), rel=1e-6)


def test_asymmetric_loss_drops_easy_negatives_and_weights_each_term(example):
    asymmetric_loss = example["losses"].asymmetric_loss
    logits = torch.tensor([[-4.0, 2.0]], requires_grad=True)  # p = 0.018 (under the margin 0.05), 0.88
    labels = torch.tensor([[False, False]])
    output = {"logits": logits, "predictions": torch.sigmoid(logits)}
    loss = asymmetric_loss(output, labels)
    loss.backward()
    assert logits.grad[0, 0].item() == 0 and logits.grad[0, 1].item() > 0  # the easy negative adds nothing
    only_second = asymmetric_loss(output, labels, label_weights=torch.tensor([[1.0, 0.0]]))
    assert only_second.item() == 0 and loss.item() > 0
    with pytest.raises(ValueError, match="asl_clip in"):
        asymmetric_loss(output, labels, asl_clip=1.5)


def test_attention_pooling_weighs_only_the_real_frames(example):
    torch.manual_seed(0)
    model = example["models"].AttentionPooling(6, 3, attention_hidden=4).eval()
    features = torch.randn(2, 5, 6)
    num_frames = torch.tensor([3, 0])
    logits = model(features, num_frames)
    garbage = features.clone()
    garbage[0, 3:] = 100.0  # what lies past num_frames never counts
    assert torch.equal(model(garbage, num_frames), logits)
    assert torch.allclose(model(features[:, :3], num_frames), logits, atol=1e-6)  # nor how much padding there is
    weights = torch.softmax(model.score(features[0, :3]).squeeze(-1), dim=0)
    assert torch.allclose(logits[0], model.classifier((weights[:, None] * features[0, :3]).sum(0)), atol=1e-6)
    assert torch.equal(logits[1], model.classifier.bias.detach())  # a video without frames: the pooled vector is 0
    assert torch.allclose(model(features, None), model(features, torch.tensor([5, 5])))


def test_the_models_are_a_video_level_and_a_frame_level_model_with_their_hyper_parameters(example):
    mlp, attention = (adopt_model(name, getattr(example["models"], name)) for name in ("MLP", "AttentionPooling"))
    assert not mlp.cls.frame_level and attention.cls.frame_level
    assert mlp.hparams().mlp_hidden == 512 and mlp.hparams().mlp_dropout == 0.2
    assert attention.hparams().attention_hidden == 128
    model = mlp.cls(24, 7, mlp.hparams(mlp_hidden=5, mlp_dropout=0.0))
    assert model(torch.rand(4, 24))["predictions"].shape == (4, 7)
    assert model.module.layers[0].out_features == 5


def test_micro_f1_counts_every_pair_and_merges_counts(example):
    MicroF1 = example["metrics"].MicroF1
    predictions = np.array([[0.9, 0.2], [0.6, 0.7], [0.1, 0.4]], dtype=np.float32)
    labels = np.array([[1, 0], [0, 1], [1, 0]], dtype=np.float32)
    whole = MicroF1(num_classes=2)
    whole.update(predictions, labels)  # TP 2, FP 1 (video 1, class 0), FN 1 (video 2, class 0)
    assert whole.compute() == pytest.approx(4 / 6)
    first, second = MicroF1(num_classes=2), MicroF1(num_classes=2)
    first.update(predictions[:1], labels[:1])
    second.update(predictions[1:], labels[1:])
    first.merge(second)
    assert first.compute() == whole.compute()
    strict = MicroF1(num_classes=2, threshold=0.8)
    strict.update(predictions, labels)  # TP 1, FN 2
    assert strict.compute() == pytest.approx(2 / 4)
    assert MicroF1(num_classes=2).compute() == 0.0
    entry = adopt_metric("micro_f1", MicroF1)
    assert entry.higher_is_better and entry.hparams().threshold == 0.5


def builtins(registry) -> list:
    """The registry's built-in entries (whatever this process has loaded besides: the example, installed, included)."""
    return [entry for entry in registry.entries(load=False) if entry.source.__module__.startswith("yt8m.")]


def test_every_entry_point_names_a_component_yt8m_adopts(example):
    declared = entry_points()
    assert set(declared) == set(GROUPS)
    assert {name for group in declared.values() for name in group} == {"MLP", "AttentionPooling", "asymmetric_loss",
                                                                        "micro_f1"}
    registries = {MODELS.group: MODELS, LOSSES.group: LOSSES, METRICS.group: METRICS}
    for group, points in declared.items():
        for name, path in points.items():
            GROUPS[group](name, import_object(path))  # a TypeError says what the component lacks
            assert name not in {entry.name for entry in builtins(registries[group])}, f"{name} is a built-in's name"


def test_the_hyper_parameters_are_flags_of_their_own(example):
    """A hyper-parameter named as a train setting or another component's would share its flag: the value would go
    to the other (the setting wins, silently)."""
    own = {f for cls in (example["models"].MLP, example["models"].AttentionPooling)
           for f in adopt_model(cls.__name__, cls).hparams.__dataclass_fields__} - {"l2_penalty"}
    own |= set(adopt_loss("asymmetric_loss", example["losses"].asymmetric_loss).hparams.__dataclass_fields__)
    assert own == {"mlp_hidden", "mlp_dropout", "attention_hidden", "asl_gamma_neg", "asl_gamma_pos", "asl_clip"}
    taken = set(config_settings(TrainConfig))
    taken |= {name for entry in builtins(MODELS) for name in entry.component.hparams.__dataclass_fields__}
    taken |= {name for entry in builtins(LOSSES) for name in entry.component.hparams.__dataclass_fields__}
    assert not own & taken

"""Context gating and GatedMoeModel: the gated logit is exact where the probabilities saturate."""

from __future__ import annotations

import torch

from yt8m.data.reading.spec import FeatureSpec
from yt8m.models import create_model, model_class, registered_model
from yt8m.models.base import BaseModel, ClassifierHParams
from yt8m.models.config import ModelConfig, build_model
from yt8m.models.gating import ContextGating, gated_logits
from yt8m.models.nextvlad import SqueezeExcitationGating


def test_gated_logits_are_the_logit_of_the_product_of_probabilities():
    logits = torch.tensor([-3.0, 0.0, 2.5, 40.0, -40.0], dtype=torch.float64)
    gates = torch.tensor([1.0, -2.0, 0.5, 40.0, 3.0], dtype=torch.float64)
    product = torch.sigmoid(logits) * torch.sigmoid(gates)
    torch.testing.assert_close(torch.sigmoid(gated_logits(logits, gates)), product)
    extreme = gated_logits(torch.tensor([60.0, -60.0]), torch.tensor([60.0, 0.0]))
    assert torch.isfinite(extreme).all() and extreme[0] > 50 and extreme[1] < -55


def test_context_gating_scales_each_unit_by_a_gate_in_0_1():
    torch.manual_seed(0)
    for gating in (ContextGating(8), ContextGating(8, batch_norm=False), SqueezeExcitationGating(8, reduction=4)):
        features = torch.rand(5, 8) + 0.1
        ratio = gating(features) / features
        assert ((ratio > 0) & (ratio < 1)).all()


def test_gated_moe_gates_the_moe_probabilities():
    torch.manual_seed(0)
    model = create_model("GatedMoeModel", 6, 4, moe_num_mixtures=3).eval()
    features = torch.nn.functional.normalize(torch.randn(3, 6), dim=-1)
    moe = torch.sigmoid(model.moe.compute_logits(features, None))
    gates = torch.sigmoid(model.gating.gate_logits(moe))
    torch.testing.assert_close(model(features)["predictions"], moe * gates)




def test_models_that_split_modalities_get_the_feature_sizes():

    class SplitProbe(BaseModel):
        splits_modalities = True

        def __init__(self, feature_size, num_classes, hparams=ClassifierHParams(), modality_sizes=(1,)):
            super().__init__(feature_size, num_classes, hparams)
            self.modality_sizes = modality_sizes

    with registered_model(SplitProbe, ClassifierHParams):
        features = FeatureSpec(["rgb", "audio"], [5, 3], num_classes=2)
        assert build_model(ModelConfig("SplitProbe"), features).modality_sizes == (5, 3)
        assert create_model("SplitProbe", 8, 2).modality_sizes == (8,)
        assert not hasattr(create_model("MoeModel", 8, 2), "modality_sizes")
    assert model_class("GatedMoeModel").splits_modalities is False

"""DeepClassifierModel: its layers, dropout in training only, each video-level classifier on top, and the
classifiers it (and the frame models) refuse: those with hyper-parameters the flags would not reach."""

from __future__ import annotations

import pytest
import torch
from model_helpers import random_input
from torch import nn

from yt8m.config import ConfigError, config_from_dict
from yt8m.models import create_model
from yt8m.models.video import MoeModel
from yt8m.training import TrainConfig
from yt8m.training.checks import train_config_problems


def test_hidden_layers_of_batch_norm_relu_and_dropout_feed_the_classifier():
    model = create_model("DeepClassifierModel", 12, 5, deep_hidden_layers=3, deep_hidden_size=8, deep_dropout=0.25)
    assert isinstance(model.input_norm, nn.BatchNorm1d) and len(model.hidden) == 3
    for index, layer in enumerate(model.hidden):
        linear, norm, relu, dropout = layer
        assert linear.in_features == (12 if index == 0 else 8) and linear.out_features == 8 and linear.bias is None
        assert (norm.num_features, type(relu), dropout.p) == (8, nn.ReLU, 0.25)
    assert isinstance(model.classifier, MoeModel) and model.classifier.feature_size == 8
    assert [weight.shape for weight, _ in model.l2_penalties()][:3] == [(8, 12), (8, 8), (8, 8)]


@pytest.mark.parametrize("classifier", ["MoeModel", "LogisticModel", "GatedMoeModel"])
@pytest.mark.parametrize("layers", [0, 2])
def test_each_video_level_classifier_sits_on_the_hidden_layers(classifier, layers):
    torch.manual_seed(0)
    model = create_model("DeepClassifierModel", 12, 5, deep_hidden_layers=layers, deep_hidden_size=8,
                         video_level_classifier_model=classifier, moe_num_mixtures=3).eval()
    assert type(model.classifier).__name__ == classifier and model.classifier.feature_size == (8 if layers else 12)
    features, _ = random_input("DeepClassifierModel", batch=6, feature_size=12)
    output = model(features)
    hidden = model.hidden_features(nn.functional.normalize(features, dim=-1))
    torch.testing.assert_close(output["predictions"], model.classifier.compute_output(hidden, None)["predictions"])
    torch.testing.assert_close(output["logits"], model.compute_logits(nn.functional.normalize(features, dim=-1)))


def test_dropout_acts_in_training_only():
    torch.manual_seed(0)
    model = create_model("DeepClassifierModel", 12, 5, deep_hidden_size=64, deep_dropout=0.5)
    features, _ = random_input("DeepClassifierModel", batch=8, feature_size=12)
    assert not torch.equal(model(features)["logits"], model(features)["logits"])
    model.eval()
    torch.testing.assert_close(model(features)["logits"], model(features)["logits"], rtol=0, atol=0)


@pytest.mark.parametrize("model, classifier", [("DeepClassifierModel", "DeepClassifierModel"),
                                               ("DbofModel", "DeepClassifierModel"),
                                               ("LstmModel", "DbofModel")])
def test_a_classifier_the_flags_could_not_configure_is_refused(model, classifier):
    values = {"model": model, "video_level_classifier_model": classifier, "train_data_pattern": "x",
              "frame_features": model != "DeepClassifierModel"}
    with pytest.raises(ConfigError, match=f"--video_level_classifier_model '{classifier}' (has hyper-parameters a "
                                          f"classifier is not given|is a frame-level model)"):
        config_from_dict(TrainConfig, values, checks=train_config_problems)
    with pytest.raises(ValueError, match=f"--video_level_classifier_model '{classifier}' "):
        create_model(model, 12, 5, video_level_classifier_model=classifier)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match=r"--deep_hidden_layers must be at least 0, got -1"):
        create_model("DeepClassifierModel", 12, 5, deep_hidden_layers=-1)
    with pytest.raises(ConfigError, match="--deep_dropout must be below 1, got 1.0"):
        config_from_dict(TrainConfig, {"model": "DeepClassifierModel", "deep_dropout": 1.0, "train_data_pattern": "x"}, checks=train_config_problems)

"""One contract for every registered model: shapes, probabilities, logits, regularization, gradients."""

from __future__ import annotations

import pytest
import torch
from model_helpers import TINY, random_input, tiny_model

from workflow_fixtures import train_config
from yt8m.models import is_frame_level, list_models
from yt8m.models.model_size import config_model_size, model_size
from yt8m.training import TrainConfig
from yt8m.training.checks import train_config_problems


@pytest.mark.parametrize("name", list_models())
def test_model_contract(name):
    torch.manual_seed(0)
    model = tiny_model(name, feature_size=12, num_classes=7)
    features, num_frames = random_input(name, batch=5, feature_size=12)
    output = model(features, num_frames)
    assert set(output) == {"logits", "predictions"}
    assert output["logits"].shape == output["predictions"].shape == (5, 7)
    assert ((output["predictions"] >= 0) & (output["predictions"] <= 1)).all()
    torch.testing.assert_close(torch.sigmoid(output["logits"]), output["predictions"])
    penalty = model.regularization_loss()
    assert penalty.dim() == 0 and torch.isfinite(penalty) and penalty > 0
    (output["logits"].sum() + penalty).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert type(model).frame_level == is_frame_level(name)


@pytest.mark.parametrize("name", list_models())
def test_wrong_input_shape_is_a_clear_error(name):
    model = tiny_model(name, feature_size=12, num_classes=7)
    with pytest.raises(ValueError, match="expects input"):
        model(torch.zeros(2, 3, 11) if is_frame_level(name) else torch.zeros(2, 11))


@pytest.mark.parametrize("name", list_models())
def test_input_is_l2_normalized_inside_the_model(name):
    torch.manual_seed(0)
    model = tiny_model(name, feature_size=12, num_classes=7).eval()
    features, num_frames = random_input(name, batch=4, feature_size=12)
    torch.testing.assert_close(model(features * 37.0, num_frames)["logits"], model(features, num_frames)["logits"])


def test_regularization_loss_is_half_the_penalized_squared_weights():
    model = tiny_model("LogisticModel", feature_size=3, num_classes=2, l2_penalty=0.5)
    expected = 0.5 * model.linear.weight.square().sum() / 2
    torch.testing.assert_close(model.regularization_loss(), expected)
    model.regularization_loss().backward()
    torch.testing.assert_close(model.linear.weight.grad, 0.5 * model.linear.weight.detach())
    dbof = tiny_model("DbofModel", feature_size=3, num_classes=2, l2_penalty=0.5)
    classifier = dbof.classifier
    torch.testing.assert_close(dbof.regularization_loss(), classifier.regularization_loss())


@pytest.mark.parametrize("name", [name for name in list_models() if is_frame_level(name)])
def test_a_frame_models_trunk_is_all_but_its_classifier(name):
    """Multi-task training shares `shared_features` and puts one head per task in place of the classifier."""
    from yt8m.config import config_from_dict
    from yt8m.models.multihead import build_multitask_model
    from yt8m.tasks.spec import resolve_tasks
    from yt8m.training import TrainConfig

    torch.manual_seed(0)
    model = tiny_model(name, feature_size=12, num_classes=7).eval()
    features, num_frames = random_input(name, batch=3, feature_size=12)
    normalized = model.prepare_input(features)
    assert model.shared_features(normalized, num_frames).shape == (3, model.shared_size)
    assert isinstance(getattr(model, model.classifier_name), torch.nn.Module)

    hparams = {key: value for key, value in TINY.items() if key != "model"}
    config = config_from_dict(TrainConfig, dict(
        hparams, train_data_pattern="unused", model=name, frame_features=True, feature_names="rgb,audio",
        feature_sizes="8,4", tasks=[{"name": "a", "num_classes": 5}, {"name": "b", "num_classes": 3}]), checks=train_config_problems)
    trunk_and_heads = build_multitask_model(config.model, config.features,
                                            resolve_tasks(config.tasks, config.main_task()))
    output = trunk_and_heads(features, num_frames)
    assert output["logits"]["a"].shape == (3, 5) and output["predictions"]["b"].shape == (3, 3)


@pytest.mark.parametrize("name", list_models())
def test_the_meta_device_measures_the_model_as_built_drawing_no_random_numbers(name):
    """`--max_model_size_mb` measures the model on the meta device, before anything is allocated."""
    torch.manual_seed(0)
    expected = model_size(tiny_model(name, feature_size=12, num_classes=7))
    config = train_config(**{**TINY, "model": name}, feature_sizes="12", num_classes=7, train_data_pattern="unused")
    state = torch.random.get_rng_state()
    assert config_model_size(config.model, config.features) == expected
    assert torch.equal(torch.random.get_rng_state(), state)

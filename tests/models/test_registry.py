"""The model registry: names, errors, hyper-parameters as flags (one type per name) with each model's defaults."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from yt8m.config import TrainConfig
from yt8m.models import (BaseModel, create_model, hparam_fields, hparam_names, hparams_class, is_frame_level,
                         list_models, model_class, model_hparams, register_model)
from yt8m.models.base import ClassifierHParams
from yt8m.models.registry import create_classifier

STARTER_MODELS = ["DbofModel", "FrameLevelLogisticModel", "LogisticModel", "LstmModel", "MoeModel"]


def test_the_starter_kit_models_are_registered():
    assert set(STARTER_MODELS) <= set(list_models())
    assert [name for name in STARTER_MODELS if is_frame_level(name)] == [
        "DbofModel", "FrameLevelLogisticModel", "LstmModel"]


@pytest.mark.parametrize("name", list_models())
def test_hyper_parameters_are_flags_with_the_models_defaults(name):
    flags = {f.name for f, _ in hparam_fields()}
    defaults = {f.name: f.default for f in dataclasses.fields(hparams_class(name))}
    signature = inspect.signature(model_class(name).__init__).parameters
    for hparam in hparam_names(name):
        assert hparam in flags, f"{name}.{hparam} is not a flag"
        assert signature[hparam].default == defaults[hparam], f"{name}.{hparam} default differs from its dataclass"
    assert model_hparams(name, train_config(model=name)) == defaults


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown model 'NoSuchModel'; did you mean 'MoeModel'.*; known models: .*Lstm"):
        create_model("NoSuchModel", 4, 3)


def test_create_model_ignores_hyper_parameters_the_model_does_not_take():
    config = train_config(moe_num_mixtures=3, lstm_cells=7)
    model = create_model("MoeModel", 4, 3, **config.model_hparams)
    assert model.num_mixtures == 3
    assert model_hparams("MoeModel", config) == {"moe_num_mixtures": 3, "l2_penalty": 1e-8}


def test_frame_level_classifier_and_bad_settings_are_errors():
    with pytest.raises(ValueError, match="must be a video-level model"):
        create_classifier("LstmModel", 4, 3)
    with pytest.raises(ValueError, match="dbof_pooling_method"):
        create_model("DbofModel", 4, 3, dbof_pooling_method="median", dbof_cluster_size=8)
    with pytest.raises(ValueError, match="moe_num_mixtures"):
        create_model("MoeModel", 4, 3, moe_num_mixtures=0)


def test_registering_a_name_twice_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        register_model(ClassifierHParams)(type("MoeModel", (BaseModel,), {}))


def test_a_constructor_must_take_its_declared_hyper_parameters():
    class Narrow(BaseModel):
        def __init__(self, feature_size: int, num_classes: int, l2_penalty: float = 1e-6):
            super().__init__(feature_size, num_classes, l2_penalty)

    with pytest.raises(TypeError, match="Narrow.__init__ takes .* but its hyper-parameters ClassifierHParams declare"):
        register_model(ClassifierHParams)(Narrow)
    assert "Narrow" not in list_models()

"""The model registry: names, errors, hyper-parameters as flags (one type per name) with each model's defaults."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from yt8m.models import (
    BaseModel,
    create_model,
    hparam_fields,
    hparam_names,
    hparams_class,
    is_frame_level,
    list_models,
    model_class,
    register_model,
    registered_model,
)
from yt8m.models.base import ClassifierHParams
from yt8m.models.config import ModelConfig
from yt8m.models.frame import DbofHParams
from yt8m.models.registry import create_classifier

STARTER_MODELS = ["DbofModel", "FrameLevelLogisticModel", "LogisticModel", "LstmModel", "MoeModel"]


def test_the_starter_kit_models_are_registered():
    assert set(STARTER_MODELS) <= set(list_models())
    assert [name for name in STARTER_MODELS if is_frame_level(name)] == [
        "DbofModel", "FrameLevelLogisticModel", "LstmModel"]


@pytest.mark.parametrize("name", list_models())
def test_a_model_takes_its_hyper_parameters_whole_with_their_defaults_written_once(name):
    """As GPT(config): the constructor takes the dataclass, whose fields are the flags, at their defaults."""
    flags = {f.name for f, _ in hparam_fields()}
    assert set(hparam_names(name)) <= flags
    parameters = list(inspect.signature(model_class(name).__init__).parameters)[1:]
    assert parameters[:3] == ["feature_size", "num_classes", "hparams"]
    defaults = hparams_class(name)()
    assert ModelConfig(name).resolved().hparams == defaults
    assert dataclasses.is_dataclass(defaults) and type(defaults).__dataclass_params__.frozen


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"'NoSuchModel' is not a model; did you mean 'MoeModel'\? \(known: .*Lstm.*; one "
                                         r"of your own: package.module:Name, or an entry point of group yt8m.models\)"):
        create_model("NoSuchModel", 4, 3)


def test_create_model_ignores_other_models_hyper_parameters_and_names_unknown_ones():
    model = create_model("MoeModel", 4, 3, moe_num_mixtures=3, lstm_cells=7)
    assert model.num_mixtures == 3 and model.hparams.moe_num_mixtures == 3
    with pytest.raises(ValueError, match="unknown field 'moe_num_mixture'; did you mean 'moe_num_mixtures'"):
        create_model("MoeModel", 4, 3, moe_num_mixture=3)


def test_frame_level_classifier_and_bad_settings_are_errors():
    with pytest.raises(ValueError, match="must be a video-level model"):
        create_classifier(DbofHParams(video_level_classifier_model="LstmModel"), 4, 3)
    with pytest.raises(ValueError, match="dbof_pooling_method"):
        create_model("DbofModel", 4, 3, dbof_pooling_method="median", dbof_cluster_size=8)
    with pytest.raises(ValueError, match="moe_num_mixtures must be at least 1"):
        create_model("MoeModel", 4, 3, moe_num_mixtures=0)
    with pytest.raises(ValueError, match="MoeModel: --moe_num_mixtures must be at least 1, got 0"):
        model_class("MoeModel")(4, 3, hparams_class("MoeModel")(moe_num_mixtures=0))  # the bounds, checked once


def test_registering_a_name_twice_is_an_error():
    taken = r"the model name 'MoeModel' is taken by the built-in model MoeModel \(yt8m.models.video:MoeModel\): rename it"
    with pytest.raises(ValueError, match=taken):
        register_model(ClassifierHParams)(type("MoeModel", (BaseModel,), {}))


def test_a_constructor_must_take_its_hyper_parameters_whole():
    class Narrow(BaseModel):
        def __init__(self, feature_size: int, num_classes: int, l2_penalty: float = 1e-6):
            super().__init__(feature_size, num_classes, ClassifierHParams(l2_penalty))

    with pytest.raises(TypeError, match=r"Narrow.__init__ takes \(feature_size, num_classes, l2_penalty\), but a model "
                                        r"takes \(feature_size, num_classes, hparams\)"):
        register_model(ClassifierHParams)(Narrow)
    assert "Narrow" not in list_models()


def test_hyper_parameters_must_be_a_frozen_dataclass():
    @dataclasses.dataclass
    class Loose:
        l2_penalty: float = 1e-8

    class Wide(BaseModel):
        def __init__(self, feature_size: int, num_classes: int, hparams: Loose = Loose()):
            super().__init__(feature_size, num_classes, hparams)

    with pytest.raises(TypeError, match="Loose must be a frozen dataclass"):
        register_model(Loose)(Wide)


def test_a_scoped_registration_is_gone_after_its_block():
    class Scoped(BaseModel):
        def __init__(self, feature_size: int, num_classes: int, hparams: ClassifierHParams = ClassifierHParams()):
            super().__init__(feature_size, num_classes, hparams)

    with registered_model(Scoped, ClassifierHParams):
        assert "Scoped" in list_models() and ModelConfig("Scoped").resolved().hparams == ClassifierHParams()
    assert "Scoped" not in list_models()
    with pytest.raises(ValueError, match="'Scoped' is not a model"):
        create_model("Scoped", 4, 3)

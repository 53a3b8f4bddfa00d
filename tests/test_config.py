"""Typed config: starter-kit style flags and YAML files resolve to the same dataclass, errors name every problem."""

from __future__ import annotations

import argparse

import pytest

from yt8m.config import (DataConfig, TrainConfig, add_config_arguments, add_config_file_argument, config_from_dict,
                         feature_layout, parse_config)


def _parse(argv: list[str]) -> tuple[TrainConfig, set[str]]:
    parser = argparse.ArgumentParser()
    add_config_file_argument(parser)
    add_config_arguments(parser, TrainConfig)
    return parse_config(TrainConfig, parser.parse_args(argv))


def test_defaults_are_the_starter_kits():
    config, given = _parse([])
    assert (config.batch_size, config.base_learning_rate, config.learning_rate_decay) == (1024, 0.01, 0.95)
    assert (config.learning_rate_decay_examples, config.label_loss, config.model) == (4000000, "CrossEntropyLoss",
                                                                                        "LogisticModel")
    assert given == set()


@pytest.mark.parametrize("argv, expected", [
    (["--frame_features"], True), (["--frame_features=True"], True), (["--frame_features=false"], False),
    (["--noframe_features"], False), (["--frame_features", "0"], False),
])
def test_boolean_flags_in_every_absl_spelling(argv, expected):
    config, given = _parse(argv)
    assert config.frame_features is expected
    assert "frame_features" in given


def test_flags_override_the_yaml_file(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("model: MoeModel\nmoe_num_mixtures: 4\nbase_learning_rate: 0.5\n")
    config, given = _parse(["--config", str(path), "--base_learning_rate", "0.02"])
    assert (config.model, config.moe_num_mixtures, config.base_learning_rate) == ("MoeModel", 4, 0.02)
    assert given == {"model", "moe_num_mixtures", "base_learning_rate"}


def test_one_error_names_every_unknown_or_ill_typed_field():
    with pytest.raises(ValueError) as raised:
        config_from_dict(TrainConfig, {"modle": "MoeModel", "batch_size": "many", "num_epochs": 2.5}, "run.yaml")
    message = str(raised.value)
    for text in ("unknown field 'modle'", "'batch_size' expects int", "'num_epochs' expects int", "run.yaml"):
        assert text in message


def test_feature_layout_pairs_names_with_sizes():
    assert feature_layout(DataConfig(feature_names="mean_rgb, mean_audio", feature_sizes="1024,128")) == (
        ["mean_rgb", "mean_audio"], [1024, 128])
    with pytest.raises(ValueError, match="same number of entries"):
        feature_layout(DataConfig(feature_names="mean_rgb,mean_audio", feature_sizes="1024"))
    with pytest.raises(ValueError, match="comma-separated integers"):
        feature_layout(DataConfig(feature_names="mean_rgb", feature_sizes="big"))

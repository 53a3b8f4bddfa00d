"""Typed config: starter-kit style flags and YAML files resolve to the same dataclass, errors name every problem."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from yt8m.training.checks import train_config_problems
from yt8m.config import (DataConfig, TrainConfig, add_config_arguments, add_config_file_argument, config_from_dict,
                         parse_config)


def _parse(argv: list[str]) -> tuple[TrainConfig, set[str]]:
    parser = argparse.ArgumentParser()
    add_config_file_argument(parser)
    add_config_arguments(parser, TrainConfig)
    config, given = parse_config(TrainConfig, parser.parse_args(["--train_data_pattern", "data/*", *argv]))
    return config, given - {"train_data_pattern"}


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
    model = "FrameLevelLogisticModel" if expected else "LogisticModel"
    config, given = _parse([*argv, "--model", model])
    assert config.frame_features is expected
    assert given == {"frame_features", "model"}


def test_flags_override_the_yaml_file(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("model: MoeModel\nmoe_num_mixtures: 4\nbase_learning_rate: 0.5\n")
    config, given = _parse(["--config", str(path), "--base_learning_rate", "0.02"])
    assert (config.model, config.model_hparams["moe_num_mixtures"], config.base_learning_rate) == ("MoeModel", 4, 0.02)
    assert given == {"model", "moe_num_mixtures", "base_learning_rate"}


def test_one_error_names_every_unknown_or_ill_typed_field():
    with pytest.raises(ValueError) as raised:
        config_from_dict(TrainConfig, {"modle": "MoeModel", "batch_size": "many", "num_epochs": 2.5}, "run.yaml",
                         checks=train_config_problems)
    message = str(raised.value)
    for text in ("unknown field 'modle'", "'batch_size' expects int", "'num_epochs' expects int", "run.yaml"):
        assert text in message


def test_feature_lists_are_parsed_once_from_the_starter_kits_comma_strings():
    from_strings = DataConfig(feature_names="mean_rgb, mean_audio", feature_sizes="1024,128")
    assert (from_strings.feature_names, from_strings.feature_sizes) == (["mean_rgb", "mean_audio"], [1024, 128])
    assert config_from_dict(DataConfig, {"feature_names": ["mean_rgb", "mean_audio"], "feature_sizes": [1024, 128]}) \
        == from_strings
    config, _ = _parse(["--feature_names", "mean_rgb,mean_audio", "--feature_sizes", "1024,128"])
    assert (config.feature_names, config.feature_sizes) == (["mean_rgb", "mean_audio"], [1024, 128])
    with pytest.raises(ValueError, match="same number of entries"):
        config_from_dict(DataConfig, {"feature_names": "mean_rgb,mean_audio", "feature_sizes": "1024"})
    with pytest.raises(ValueError, match="'feature_sizes' expects a comma-separated list of int, got 'big'"):
        config_from_dict(DataConfig, {"feature_names": "mean_rgb", "feature_sizes": "big"})


def yt8m(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yt8m", *map(str, args)], capture_output=True, text=True)


def test_train_reports_every_problem_of_its_config_file_at_once(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("train_data_pattern: data/*\nmodel: MoeModl\nbatch_size: -5\nbase_learning_rate: abc\n"
                    "batch_sise: 5\n")
    result = yt8m("train", "--config", path, "--train_dir", tmp_path / "run")
    assert result.returncode == 1
    for text in ("unknown field 'batch_sise'; did you mean 'batch_size'?", "'base_learning_rate' expects float, got 'abc'",
                 "--model 'MoeModl' is not a model; did you mean 'MoeModel'?", "--batch_size must be at least 1, got -5"):
        assert text in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_train_reports_every_bad_flag_at_once(tmp_path):
    result = yt8m("train", "--train_data_pattern", "data/*", "--train_dir", tmp_path / "run", "--batch_size", "-5",
                  "--base_learning_rate", "0", "--learning_rate_decay", "-1", "--keep_checkpoints", "0",
                  "--num_epochs", "two", "--optimizer", "FooOpt", "--frame_features", "maybe")
    assert result.returncode == 1
    for text in ("--batch_size must be at least 1, got -5", "--base_learning_rate must be above 0, got 0.0",
                 "--learning_rate_decay must be above 0, got -1.0", "--keep_checkpoints must be at least 1, got 0",
                 "'num_epochs' expects int, got 'two'", "--optimizer 'FooOpt' is not a torch.optim class",
                 "'frame_features' expects bool, got 'maybe'"):
        assert text in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("text, expected", [
    ("model: [MoeModel\n", "not a valid YAML config: line 2, column 1"),
    ("model: !!python/object/apply:os.system ['true']\n", "not a valid YAML config"),
])
def test_a_broken_yaml_file_is_one_line(tmp_path, text, expected):
    path = tmp_path / "train.yaml"
    path.write_text(text)
    result = yt8m("train", "--config", path, "--train_dir", tmp_path / "run")
    assert result.returncode == 1
    assert expected in result.stderr and str(path) in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr

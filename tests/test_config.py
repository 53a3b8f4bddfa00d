"""Typed config in sections: starter-kit style flags and YAML files (flat, or nested by section) resolve to the same
frozen sections, every flag of before the sections keeps its name and meaning, errors name every problem."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from yt8m.commands.command_line import add_config_arguments, add_config_file_argument, parse_config
from yt8m.config import (
    ConfigError,
    config_document,
    config_from_dict,
    config_values,
    flag_names,
    flag_type,
    load_config,
    resolve_components,
    save_config,
)
from yt8m.data.reading.spec import FeatureSpec
from yt8m.eval.config import EvalConfig
from yt8m.inference.config import EnsembleConfig, PredictConfig
from yt8m.models.frame import DbofHParams
from yt8m.models.video import MoeModel
from yt8m.training import TrainConfig
from yt8m.training.checks import train_config_problems

TESTS = Path(__file__).resolve().parent
BEFORE_SECTIONS = json.loads((TESTS / "commands" / "flags_before_sections.json").read_text())
OLD_RUNS = TESTS / "io" / "runs_before_sections"
COMMAND_CONFIGS = {"train": TrainConfig, "eval": EvalConfig, "predict": PredictConfig, "ensemble": EnsembleConfig}


def _parse(argv: list[str]) -> tuple[TrainConfig, set[str]]:
    parser = argparse.ArgumentParser()
    add_config_file_argument(parser)
    add_config_arguments(parser, TrainConfig)
    config, given = parse_config(TrainConfig, parser.parse_args(["--train_data_pattern", "data/*", *argv]))
    return config, given - {"train_data_pattern"}


def test_defaults_are_the_starter_kits():
    config, given = _parse([])
    decay = resolve_components(config).lr_schedule
    assert (config.schedule.batch_size, config.optimizer.base_learning_rate, decay.name) == \
        (1024, 0.01, "exponential")
    assert (decay.hparams.learning_rate_decay, decay.hparams.learning_rate_decay_examples) == (0.95, 4000000)
    assert (config.loss.name, config.model.name) == ("CrossEntropyLoss", "LogisticModel")
    assert given == set()


def test_the_train_config_is_sections_each_frozen():
    config = TrainConfig()
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    assert all(dataclasses.is_dataclass(getattr(config, name)) for name in fields)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.schedule.batch_size = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.schedule = config.schedule  # type: ignore[misc]


@pytest.mark.parametrize("argv, expected", [
    (["--frame_features"], True), (["--frame_features=True"], True), (["--frame_features=false"], False),
    (["--noframe_features"], False), (["--frame_features", "0"], False),
])
def test_boolean_flags_in_every_absl_spelling(argv, expected):
    model = "FrameLevelLogisticModel" if expected else "LogisticModel"
    config, given = _parse([*argv, "--model", model])
    assert config.features.frame_features is expected
    assert given == {"frame_features", "model"}


def test_flags_override_the_yaml_file(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("model: MoeModel\nmoe_num_mixtures: 4\nbase_learning_rate: 0.5\n")
    config, given = _parse(["--config", str(path), "--base_learning_rate", "0.02"])
    assert (config.model.name, config.model.hparams.moe_num_mixtures, config.optimizer.base_learning_rate) == \
        ("MoeModel", 4, 0.02)
    assert given == {"model", "moe_num_mixtures", "base_learning_rate"}


def test_nested_yaml_by_section_is_the_same_config_as_flat_yaml(tmp_path):
    flat, nested = tmp_path / "flat.yaml", tmp_path / "nested.yaml"
    flat.write_text("model: MoeModel\nmoe_num_mixtures: 3\nbatch_size: 64\nfeature_names: rgb,audio\n"
                    "feature_sizes: 1024,128\nframe_features: false\n")
    nested.write_text("model: {name: MoeModel, hparams: {moe_num_mixtures: 3}}\nschedule: {batch_size: 64}\n"
                      "features: {feature_names: [rgb, audio], feature_sizes: [1024, 128]}\n")
    assert _parse(["--config", str(flat)])[0] == _parse(["--config", str(nested)])[0]
    inline = tmp_path / "inline.yaml"  # a model's hyper-parameters may also sit in its section by their names
    inline.write_text("model: {name: MoeModel, moe_num_mixtures: 3}\n")
    assert _parse(["--config", str(inline)])[0].model.hparams == _parse(["--config", str(flat)])[0].model.hparams


def test_model_hyper_parameters_are_the_models_own_dataclass():
    config = config_from_dict(TrainConfig, {"model": "DbofModel", "frame_features": True, "iterations": 7,
                                            "train_data_pattern": "x"}, checks=train_config_problems)
    assert config.model.hparams == DbofHParams(iterations=7)
    assert MoeModel(4, 3).hparams.moe_num_mixtures == 2  # the dataclass's default, written once


def test_a_misspelt_name_is_an_unknown_field_never_a_hyper_parameter():
    with pytest.raises(ConfigError) as raised:
        config_from_dict(TrainConfig, {"model": "MoeModel", "moe_num_mixture": 3, "train_data_pattern": "x"})
    assert "unknown field 'moe_num_mixture'; did you mean 'moe_num_mixtures'?" in str(raised.value)


def test_another_models_hyper_parameter_is_ignored_with_a_warning(caplog):
    config = config_from_dict(TrainConfig, {"model": "LogisticModel", "moe_num_mixtures": 3, "train_data_pattern": "x"})
    assert not hasattr(config.model.hparams, "moe_num_mixtures")
    assert "--moe_num_mixtures" in caplog.text


def test_one_error_names_every_unknown_or_ill_typed_field():
    with pytest.raises(ValueError) as raised:
        config_from_dict(TrainConfig, {"modle": "MoeModel", "batch_size": "many", "num_epochs": 2.5,
                                       "schedule": {"seeed": 3}}, "run.yaml", checks=train_config_problems)
    message = str(raised.value)
    for text in ("unknown field 'modle'", "'batch_size' expects int", "'num_epochs' expects int", "run.yaml",
                 "unknown field 'schedule.seeed'; did you mean 'seed'?"):
        assert text in message


def test_feature_lists_are_parsed_from_the_starter_kits_comma_strings():
    from_strings = config_from_dict(FeatureSpec, {"feature_names": "mean_rgb, mean_audio", "feature_sizes": "1024,128"})
    assert (from_strings.feature_names, from_strings.feature_sizes) == (["mean_rgb", "mean_audio"], [1024, 128])
    assert config_from_dict(FeatureSpec, {"feature_names": ["mean_rgb", "mean_audio"], "feature_sizes": [1024, 128]}) \
        == from_strings
    config, _ = _parse(["--feature_names", "mean_rgb,mean_audio", "--feature_sizes", "1024,128"])
    assert (config.features.feature_names, config.features.feature_sizes) == (["mean_rgb", "mean_audio"], [1024, 128])
    with pytest.raises(ValueError, match="same number of entries"):
        config_from_dict(FeatureSpec, {"feature_names": "mean_rgb,mean_audio", "feature_sizes": "1024"})
    with pytest.raises(ValueError, match="'feature_sizes' expects a comma-separated list of int, got 'big'"):
        config_from_dict(FeatureSpec, {"feature_names": "mean_rgb", "feature_sizes": "big"})


def test_one_feature_size_is_a_number_in_yaml_flags_and_python(tmp_path):
    flat, nested = tmp_path / "flat.yaml", tmp_path / "nested.yaml"
    flat.write_text("feature_names: mean_audio\nfeature_sizes: 128\n")
    nested.write_text("features: {feature_names: mean_audio, feature_sizes: 128}\n")
    for path in (flat, nested):
        assert _parse(["--config", str(path)])[0].features.feature_sizes == [128]
    assert _parse(["--feature_names", "mean_audio", "--feature_sizes", "128"])[0].features.feature_sizes == [128]
    assert config_from_dict(FeatureSpec, {"feature_names": "mean_audio", "feature_sizes": 128}).feature_sizes == [128]
    for wrong in (True, 12.5):
        with pytest.raises(ValueError, match=f"'feature_sizes' expects a comma-separated list of int, got {wrong}"):
            config_from_dict(FeatureSpec, {"feature_names": "mean_audio", "feature_sizes": wrong})


@pytest.mark.parametrize("command", sorted(COMMAND_CONFIGS))
def test_every_flag_of_before_the_sections_is_taken_with_its_old_default(command):
    cls = COMMAND_CONFIGS[command]
    old = BEFORE_SECTIONS[command]
    assert set(old) <= set(flag_names(cls))
    now = config_values(cls())  # the default model's hyper-parameters among them; another model's are its own
    for name, default in old.items():
        if name in now and name != "model_hparams" and default is not None:
            assert now[name] == default, name


@pytest.mark.parametrize("command", sorted(COMMAND_CONFIGS))
def test_every_flag_of_before_the_sections_keeps_its_meaning(command):
    """Each old flag, given alone on the command line, lands where the flat view (config_values) reads it by that
    name: the value the flag meant is the value the config holds."""
    cls = COMMAND_CONFIGS[command]
    for name, default in BEFORE_SECTIONS[command].items():
        if name in ("model_hparams", "tasks") or isinstance(default, dict):
            continue
        value = _another_value(name, default if default is not None else _example_of(flag_type(cls, name)))
        values = {"model": _model_having(name)} if command in ("train", "eval") and _model_having(name) else {}
        config = config_from_dict(cls, {**values, name: value}, "flags", check_values=False)
        assert config_values(config)[name] == _typed(value), name


def _another_value(name: str, default):
    if isinstance(default, bool):
        return "true" if not default else "false"
    if isinstance(default, int):
        return str(default + 2)
    if isinstance(default, float):
        return str(default / 2 if default else 0.25)
    if isinstance(default, list):
        return "3,4" if name.endswith(("sizes", "weights")) else "a,b"
    return f"{default}x" if default else "given"


def _example_of(kind):
    """A default-like value of a flag's type, for a flag whose default was each model's own."""
    return {bool: False, int: 1, float: 0.5, str: "x"}.get(kind, [])


def _typed(value: str):
    if value in ("true", "false"):
        return value == "true"
    if value in ("3,4", "a,b"):
        return [3, 4] if value == "3,4" else ["a", "b"]
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _model_having(name: str):
    """A registered model that has hyper-parameter `name` (None for a setting of the config itself)."""
    from yt8m.models.registry import hparam_names, list_models

    return next((model for model in list_models() if name in hparam_names(model)), None)


@pytest.mark.parametrize("run", ["video_moe_ema", "frame_dbof", "multitask"])
def test_every_config_yaml_written_before_the_sections_loads(run):
    config = load_config(TrainConfig, str(OLD_RUNS / run / "config.yaml"))
    flat = yaml.safe_load((OLD_RUNS / run / "config.yaml").read_text())
    values = config_values(config)
    # Added since, each at the default that changes nothing: the loss's hyper-parameter (CrossEntropyLoss's label
    # smoothing), --metrics, the augment section, stochastic weight averaging, the optimizer's weight decay, the
    # RAM cache's --cache_in_memory_required, --input_l2_normalize (true: the video-level input normalized, as
    # always before), the learning-rate schedule's name (the starter kit's decay, as always before), the optimizer's
    # parameter groups, the resume's record of changes, --checkpoint_at_examples (none); and --memory_check, whose default refuses under a cgroup a run that would be killed part-way
    # (where such a run was killed before).
    added = {"label_smoothing": 0.0, "metrics": [], "mixup_alpha": 0.0, "feature_dropout": 0.0, "swa_start_epoch": 0,
             "weight_decay": None, "cache_in_memory_required": False, "memory_check": "refuse",
             "input_l2_normalize": True, "lr_schedule": "exponential", "no_decay_biases_and_norms": False,
             "resume_with_changes": False, "resume_changes": [], "checkpoint_at_examples": []}
    assert {name: values[name] for name in set(values) - set(flat)} == added
    assert {name: value for name, value in values.items() if name in flat} == {name: flat[name] for name in values
                                                                               if name in flat}


def test_config_yaml_is_written_by_section_and_reads_back_whole(tmp_path):
    config = config_from_dict(TrainConfig, {"model": "DbofModel", "frame_features": True, "iterations": 7,
                                            "train_data_pattern": "x", "tasks": [{"name": "a"}], "ema_decay": 0.9})
    save_config(config, str(tmp_path / "config.yaml"))
    written = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert list(written) == [f.name for f in dataclasses.fields(TrainConfig)]
    assert written["model"] == {"name": "DbofModel", "hparams": config_document(config.model)["hparams"],
                                "trunk_hidden_sizes": [], "input_l2_normalize": True}
    assert load_config(TrainConfig, str(tmp_path / "config.yaml")) == config


def test_recipes_and_shipped_configs_load():
    for path in sorted((TESTS.parent / "configs").glob("*.yaml")) + sorted((TESTS.parent / "configs").glob("*/*.yaml")):
        document = yaml.safe_load(path.read_text())
        train = document.get("train", document) if "search" in document else document
        config_from_dict(TrainConfig, {"train_data_pattern": "x", **{k: v for k, v in train.items()
                                                                    if k != "eval_data_pattern"}},
                         str(path), check_values=False)


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


def test_a_hyper_parameter_named_as_a_setting_or_another_components_takes_its_dotted_name():
    """A model of one's own may name a hyper-parameter as a setting (`seed`) or as the loss's (`label_smoothing`):
    the flat name is the setting's, or refused naming both components; the dotted names always reach each."""
    from torch import nn

    from yt8m.models.registry import registered_model

    class Seedy(nn.Module):
        def __init__(self, feature_size: int, num_classes: int, seed: int = 5, label_smoothing: float = 0.0):
            super().__init__()
            self.linear = nn.Linear(feature_size, num_classes)

        def forward(self, features):
            return self.linear(features)

    with registered_model(Seedy):
        config = resolve_components(config_from_dict(TrainConfig, {
            "model": "Seedy", "train_data_pattern": "x", "seed": 9, "model.seed": 3, "model.label_smoothing": 0.2,
            "loss.label_smoothing": 0.1}))
        assert (config.schedule.seed, config.model.hparams.seed, config.model.hparams.label_smoothing,
                config.loss.hparams.label_smoothing) == (9, 3, 0.2, 0.1)
        with pytest.raises(ConfigError) as raised:
            config_from_dict(TrainConfig, {"model": "Seedy", "train_data_pattern": "x", "label_smoothing": 0.1})
    assert raised.value.problems == [
        "config: --label_smoothing is a hyper-parameter of both Seedy (--model.label_smoothing) and CrossEntropyLoss "
        "(--loss.label_smoothing): give it by its dotted name"]

"""The Python API: its names in one place, its documented examples run, and its checks as the commands'."""

from __future__ import annotations

import doctest
import importlib

import pytest

import yt8m
import yt8m.api
from yt8m.training.config import ScheduleConfig, TrainConfig

DOCUMENTED = ["yt8m.api.runs", "yt8m.api.videos", "yt8m.api.workflow", "yt8m.data.making.videos",
              "yt8m.models.registry", "yt8m.tasks.losses", "yt8m.tasks.metrics", "yt8m.training.schedules"]


def test_the_public_names_are_listed_once_and_importable_from_yt8m():
    assert yt8m.__all__ == yt8m.api.__all__
    assert all(getattr(yt8m, name) is getattr(yt8m.api, name) for name in yt8m.__all__)
    with pytest.raises(AttributeError, match="no attribute 'fit'"):
        yt8m.fit  # noqa: B018 - the attribute access is the test


@pytest.mark.parametrize("module", DOCUMENTED)
def test_documented_examples_run(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_every_problem_is_one_value_error_never_a_type_error():
    with pytest.raises(ValueError) as raised:
        yt8m.train(TrainConfig(schedule=ScheduleConfig(batch_size="abc")), modle="MoeModel", num_epochs=-1)
    message = str(raised.value)
    for problem in ("field 'batch_size' expects int, got 'abc'", "unknown field 'modle'; did you mean 'model'?",
                    "--train_data_pattern is required", "--num_epochs must be at least 1, got -1"):
        assert problem in message


def test_a_config_of_another_kind_is_refused():
    with pytest.raises(ValueError, match="config must be a EvalConfig, a YAML file.s path or a dict, got TrainConfig"):
        yt8m.evaluate(TrainConfig(), train_dir="x")

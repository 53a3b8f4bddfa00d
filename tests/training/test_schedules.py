"""The learning-rate schedule as a component (--lr_schedule): the starter kit's exponential decay as the default and
under its own flags, step, cosine with warmup and one-cycle against their definitions (torch's OneCycleLR), one's own
function and torch LRScheduler by import path, the rate each step trained with, an exact resume, a tuned schedule,
and weight decay left off biases and norms."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
import yaml
from torch import nn

from tune_fixtures import shards, tune_file  # noqa: F401  (a fixture)
from workflow_fixtures import Crash, crash_after_checkpoint, tiny_data, tiny_train_config  # noqa: F401
from yt8m import cli
from yt8m.config import config_from_dict
from yt8m.io.checkpoints import load_checkpoint, final_checkpoint
from yt8m.training import TrainConfig, TrainEvent, train
from yt8m.training.checks import resolve_components
from yt8m.training.optim import OptimizerConfig, build_optimizer
from yt8m.training.schedules import LRScheduleConfig, build_schedule

OWN_SCHEDULES = '''
import math

import torch


def halving(step, every: int = 2):
    return 0.5 ** (step // every)


class Linear(torch.optim.lr_scheduler.LambdaLR):
    def __init__(self, optimizer, steps: int = 8, last_epoch: int = -1):
        super().__init__(optimizer, lambda step: 1 - step / steps, last_epoch)
'''


def factors(config: LRScheduleConfig, steps: int, max_steps=None, examples_per_step: int = 0) -> list[float]:
    schedule = build_schedule(config, max_steps)
    return [schedule.factor(step, step * examples_per_step) for step in range(steps)]


def test_the_default_is_the_starter_kits_staircase_decay_by_global_examples():
    config = LRScheduleConfig("exponential", {"learning_rate_decay": 0.5, "learning_rate_decay_examples": 100})
    assert factors(config, 6, examples_per_step=50) == [1, 1, 0.5, 0.5, 0.25, 0.25]
    assert TrainConfig().lr_schedule.name == "exponential"


def test_the_starter_kits_flags_set_the_exponential_decay():
    config = resolve_components(config_from_dict(TrainConfig, {"learning_rate_decay": 0.8,
                                                               "learning_rate_decay_examples": 1000}, source="flags",
                                                 check_values=False))
    assert (config.lr_schedule.hparams.learning_rate_decay, config.lr_schedule.hparams.learning_rate_decay_examples) \
        == (0.8, 1000)


def test_step_cosine_and_onecycle_follow_their_definitions():
    assert factors(LRScheduleConfig("step", {"step_size": 2, "gamma": 0.1}), 5) == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01])
    cosine = factors(LRScheduleConfig("cosine", {"warmup_steps": 4, "min_factor": 0.1}), 20, max_steps=14)
    assert cosine[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert cosine[4] == 1.0 and cosine[9] == pytest.approx(0.1 + 0.9 * 0.5) and cosine[14:] == [pytest.approx(0.1)] * 6
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    reference = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=50)
    expected = []
    for _ in range(50):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        reference.step()
    assert factors(LRScheduleConfig("onecycle"), 50, max_steps=50) == pytest.approx(expected, rel=1e-12)


def record_rates(into: dict):
    """The rate each step trained with, seen at its checkpoint (one every step)."""
    def hook(event: TrainEvent):
        if event.kind == "checkpoint":
            into[event.step] = event.optimizer.param_groups[0]["lr"]
    return hook


@pytest.fixture
def own_schedules(tmp_path, monkeypatch):
    (tmp_path / "myschedules.py").write_text(OWN_SCHEDULES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("myschedules", None)


@pytest.mark.parametrize("schedule, hparams, expected", [
    ("cosine", {"warmup_steps": 2}, [0.5, 1.0] + [0.5 * (1 + math.cos(math.pi * k / 6)) for k in range(6)]),
    ("myschedules:halving", {"every": 3}, [1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25]),
    ("myschedules:Linear", {"steps": 8}, [1 - step / 8 for step in range(8)]),
], ids=["cosine", "a function", "a torch LRScheduler"])
def test_each_step_trains_at_the_schedules_rate(tiny_data, tmp_path, own_schedules, schedule, hparams, expected):
    rates: dict[int, float] = {}
    config = tiny_train_config(tiny_data, tmp_path / "run", max_steps=8, export_model_steps=1, lr_schedule=schedule,
                               **{f"lr_schedule.{name}": value for name, value in hparams.items()})
    train(config, hooks=[record_rates(rates)])
    assert [rates[step] for step in range(1, 9)] == pytest.approx([0.05 * factor for factor in expected], rel=1e-12)
    stored = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["lr_schedule"]
    assert stored["name"] == schedule and hparams.items() <= stored["hparams"].items()


@pytest.mark.parametrize("schedule", ["cosine", "myschedules:Linear"])
def test_a_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tiny_data, tmp_path, own_schedules, schedule):
    def config(name: str):
        return tiny_train_config(tiny_data, tmp_path / name, max_steps=8, export_model_steps=1, keep_checkpoints=10,
                                 lr_schedule=schedule, **({"lr_schedule.warmup_steps": 3} if schedule == "cosine"
                                                          else {}))

    whole_rates: dict[int, float] = {}
    train(config("whole"), hooks=[record_rates(whole_rates)])
    with pytest.raises(Crash):
        train(config("resumed"), hooks=[crash_after_checkpoint(4)])
    rates: dict[int, float] = {}
    train(config("resumed"), hooks=[record_rates(rates)])
    assert sorted(rates) == [5, 6, 7, 8] and all(rates[step] == whole_rates[step] for step in rates)
    whole, resumed = (load_checkpoint(final_checkpoint(str(tmp_path / name))).model for name in ("whole", "resumed"))
    assert all(torch.equal(whole[key], resumed[key]) for key in whole)


def test_a_schedule_without_a_horizon_is_refused_before_training(tiny_data, tmp_path):
    with pytest.raises(ValueError, match=r"--lr_schedule cosine decays over a number of steps: give --max_steps, or "
                                         r"--lr_schedule.decay_steps"):
        train(tiny_train_config(tiny_data, tmp_path / "run", lr_schedule="cosine"))
    assert not (tmp_path / "run").exists()


def test_a_resume_with_another_schedule_is_refused(tiny_data, tmp_path):
    train(tiny_train_config(tiny_data, tmp_path, max_steps=2, lr_schedule="cosine", **{"lr_schedule.decay_steps": 8}))
    with pytest.raises(ValueError, match=r"--warmup_steps: checkpoint has 0, this run asks for 2"):
        train(tiny_train_config(tiny_data, tmp_path, max_steps=4, lr_schedule="cosine",
                                **{"lr_schedule.decay_steps": 8, "lr_schedule.warmup_steps": 2}))


def test_weight_decay_leaves_biases_and_norms_out_when_asked():
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    config = OptimizerConfig(name="AdamW", weight_decay=0.1, no_decay_biases_and_norms=True)
    groups = build_optimizer(config, model.parameters()).param_groups
    assert [(len(group["params"]), group["weight_decay"]) for group in groups] == [(1, 0.1), (3, 0.0)]
    assert groups[0]["params"][0] is model[0].weight
    plain = build_optimizer(OptimizerConfig(name="AdamW", weight_decay=0.1), model.parameters()).param_groups
    assert [(len(group["params"]), group["weight_decay"]) for group in plain] == [(4, 0.1)]


def test_a_study_searches_the_schedule_and_its_warmup(tmp_path, shards, capsys):
    search = {"lr_schedule": {"type": "categorical", "choices": ["exponential", "cosine"]},
              "lr_schedule.warmup_steps": {"type": "int", "low": 0, "high": 4, "when": {"lr_schedule": "cosine"}}}
    path = tune_file(tmp_path / "tune.yaml", shards, search, tune={"pruner": "none", "n_startup_trials": 4},
                     model="LogisticModel", num_epochs=1, max_steps=8)
    assert cli.main(["tune", "--config", path, "--n_trials", "4"]) == 0, capsys.readouterr().err[-3000:]
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n_trials"]["complete"] == 4
    best = yaml.safe_load((tmp_path / "study" / "best.yaml").read_text())
    assert best["lr_schedule"]["name"] in ("exponential", "cosine")


def test_a_config_yaml_written_before_the_schedule_was_a_section_keeps_its_decay(tmp_path):
    from yt8m.config import load_config

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "data": {"train_data_pattern": "x"},
        "optimizer": {"name": "Adam", "base_learning_rate": 0.01, "learning_rate_decay": 0.8,
                      "learning_rate_decay_examples": 1000}}))
    schedule = load_config(TrainConfig, str(tmp_path / "config.yaml")).lr_schedule
    assert (schedule.name, schedule.hparams.learning_rate_decay, schedule.hparams.learning_rate_decay_examples) == \
        ("exponential", 0.8, 1000)


def test_a_flag_naming_another_schedule_leaves_the_files_decay_out(tiny_data, tmp_path, capsys):
    train(tiny_train_config(tiny_data, tmp_path / "a", max_steps=1, learning_rate_decay=0.8))
    assert cli.main(["train", "--config", str(tmp_path / "a" / "config.yaml"), "--train_dir", str(tmp_path / "b"),
                     "--lr_schedule", "cosine", "--warmup_steps", "2", "--max_steps", "2"]) == 0, \
        capsys.readouterr().err[-2000:]
    stored = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())["lr_schedule"]
    assert stored["name"] == "cosine" and stored["hparams"]["warmup_steps"] == 2
    assert "learning_rate_decay" not in stored["hparams"]

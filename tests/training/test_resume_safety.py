"""Resuming never puts a state into a parameter of another name or shape: a reordered `tasks:` list resumes with each
head's optimizer state on its own parameters; a checkpoint whose tensors or optimizer state differ from the run's is
refused with one line naming them, before the train dir is touched; --revert_to_best loads the same way."""

from __future__ import annotations

import pytest
import torch
import yaml

from workflow_fixtures import NUM_CLASSES, VERTICALS, as_flags, tiny_data, tiny_train_config, vocabulary  # noqa: F401
from yt8m.cli import main as cli_main
from yt8m.config import config_values
from yt8m.io.checkpoints import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from yt8m.models import create_model
from yt8m.training.optim import OptimizerConfig, build_optimizer, load_optimizer_state, optimizer_state

pytestmark = pytest.mark.integration


def train_with_tasks(data: dict, tmp_path, vocabulary: str, tasks: list[dict], max_steps: int, capsys) -> int:
    config = tiny_train_config(data, tmp_path / "run", max_steps=max_steps, model="MoeModel",
                               vocabulary_file=vocabulary, tasks=tasks)
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump(config_values(config)))
    code = cli_main(["train", "--config", str(tmp_path / "tasks.yaml")])
    capsys.readouterr()
    return code


def test_a_reordered_task_list_resumes_each_heads_state_on_its_own_parameters(tiny_data, vocabulary, tmp_path,
                                                                             capsys):
    main, vertical = {"name": "main"}, {"name": "vertical", "label_source": "vocabulary", "weight": 0.5}
    assert train_with_tasks(tiny_data, tmp_path, vocabulary, [main, vertical], 4, capsys) == 0
    saved = load_checkpoint(latest_checkpoint(str(tmp_path / "run"))).optimizer
    # Positions now differ: the heads' ModuleDict follows the list. Before, this crashed (fused Adam on mismatched
    # shapes) or, with heads of one shape, trained on with each head's state on the other's weights.
    assert train_with_tasks(tiny_data, tmp_path, vocabulary, [vertical, main], 8, capsys) == 0
    assert [step for step, _ in list_checkpoints(str(tmp_path / "run"))][-1] == 8

    model = torch.nn.ModuleDict({"vertical": create_model("MoeModel", 24, VERTICALS),
                                 "main": create_model("MoeModel", 24, NUM_CLASSES)})
    named = dict(zip(saved["param_names"], (index for group in saved["param_groups"] for index in group["params"])))
    renamed = {f"{name.split('.')[1]}.{name.split('.', 2)[2]}": index for name, index in named.items()
               if name.startswith("heads.")}
    state = {**saved, "param_names": list(renamed),
             "param_groups": [dict(saved["param_groups"][0], params=list(renamed.values()))]}
    optimizer = build_optimizer(OptimizerConfig(name="Adam", base_learning_rate=0.01), model.parameters())
    load_optimizer_state(optimizer, model, state, "test")
    for name, parameter in model.named_parameters():
        expected = saved["state"][renamed[name]]["exp_avg"]
        assert torch.equal(optimizer.state[parameter]["exp_avg"], expected), name


def test_a_checkpoint_of_other_tensors_is_refused_naming_them(tiny_data, tmp_path, capsys):
    values = config_values(tiny_train_config(tiny_data, tmp_path / "run", max_steps=4))
    assert cli_main(["train", *as_flags(values)]) == 0
    capsys.readouterr()
    path = latest_checkpoint(str(tmp_path / "run"))
    checkpoint = load_checkpoint(path)
    weight = next(name for name in checkpoint.model if name.endswith("weight"))
    checkpoint.model[weight] = torch.zeros(3, 5)
    checkpoint.progress["step"] = 8
    save_checkpoint(str(tmp_path / "run"), checkpoint, keep=5)
    before = sorted(p.name for p in (tmp_path / "run").rglob("*"))
    assert cli_main(["train", *as_flags({**values, "max_steps": 12})]) == 1
    err = capsys.readouterr().err
    assert f"{weight}: shape [3, 5] in the checkpoint" in err and err.count("\n") == 1 and "Traceback" not in err
    assert sorted(p.name for p in (tmp_path / "run").rglob("*")) == before


def test_an_optimizer_state_of_another_shape_is_refused_before_anything_loads():
    model = create_model("MoeModel", 6, 4)
    optimizer = build_optimizer(OptimizerConfig(name="Adam", base_learning_rate=0.01), model.parameters())
    model(torch.randn(2, 6))["logits"].sum().backward()
    optimizer.step()
    state = optimizer_state(optimizer, model)
    other = create_model("MoeModel", 6, 5)
    with pytest.raises(ValueError, match=r"optimizer state of shape \[.*\] in the checkpoint, \[.*5.*\] here"):
        load_optimizer_state(build_optimizer(OptimizerConfig(name="Adam", base_learning_rate=0.01), other.parameters()), other, state, "ckpt")
    positional = {key: value for key, value in state.items() if key != "param_names"}  # a checkpoint of before
    with pytest.raises(ValueError, match="optimizer state of shape"):
        load_optimizer_state(build_optimizer(OptimizerConfig(name="Adam", base_learning_rate=0.01), other.parameters()), other, positional, "ckpt")

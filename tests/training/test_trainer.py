"""The training loop: learning-rate schedule, optimizers, checkpoints, hooks and exact resumption.

Loop tests feed `fit` in-test batches and a tiny model; `train` end to end runs on tiny synthetic shards.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
import yaml
from torch import nn

from workflow_fixtures import Crash, crash_after_checkpoint, one_task, tiny_data, tiny_train_config, train_config  # noqa: F401  (fixture)
from yt8m.commands.train import parse_args
from yt8m.config import config_document, load_config
from yt8m.data.reading.batch import Batch
from yt8m.data.reading.dataset import YT8MDataset
from yt8m.eval.evaluate import evaluate_model
from yt8m.io.checkpoints import final_checkpoint, list_checkpoints, load_checkpoint
from yt8m.models.checkpoints import build_model_from_checkpoint
from yt8m.tasks.video import features_task
from yt8m.training import TrainConfig, TrainEvent, fit, train
from yt8m.training.optim import OptimizerConfig, build_optimizer

FEATURES, CLASSES, BATCH = 6, 4, 8


class TinyModel(nn.Module):
    """The BaseModel protocol in a few lines: logits and probabilities, an L2 term."""

    frame_level = False

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, CLASSES)
        self.dropout = nn.Dropout(0.5)  # random in training: resumption must restore the RNG to match

    def forward(self, features, num_frames=None):
        logits = self.linear(self.dropout(nn.functional.normalize(features, dim=-1)))
        return {"logits": logits, "predictions": torch.sigmoid(logits)}

    def l2_penalties(self):
        return [(self.linear.weight, 2.0)]  # the penalty: sum(w^2)


def tiny_loss(output, labels):
    return nn.functional.binary_cross_entropy_with_logits(output["logits"], labels)


def tiny_batches(epoch: int, batches: int = 5) -> list[Batch]:
    generator = torch.Generator().manual_seed(epoch)
    return [Batch(video_ids=[f"v{epoch}-{b}-{i}" for i in range(BATCH)],
                  features=torch.randn(BATCH, FEATURES, generator=generator),
                  labels=(torch.rand(BATCH, CLASSES, generator=generator) > 0.5).float())
            for b in range(batches)]


def tiny_config(tmp_path, **overrides) -> TrainConfig:
    values = dict(train_dir=str(tmp_path / "run"), num_epochs=3, export_model_steps=4, keep_checkpoints=2,
                  metrics_every_steps=1000, base_learning_rate=0.1, regularization_penalty=1e-3)
    return train_config(**{**values, **overrides})


def run_fit(config: TrainConfig, hooks=(), resume=None, seed: int = 0):
    torch.manual_seed(seed)
    model = TinyModel()
    optimizer = build_optimizer(config.optimizer, model.parameters())
    summary = fit(model, optimizer, one_task(config, tiny_loss), tiny_batches, config, hooks=hooks, resume=resume)
    return model, summary


@pytest.mark.parametrize("name, cls, extra", [
    ("Adam", torch.optim.Adam, {}),
    ("adamw", torch.optim.AdamW, {}),
    ("AdamOptimizer", torch.optim.Adam, {}),
    ("GradientDescentOptimizer", torch.optim.SGD, {"momentum": 0}),
    ("MomentumOptimizer", torch.optim.SGD, {"momentum": 0.9}),
    ("AdagradOptimizer", torch.optim.Adagrad, {"initial_accumulator_value": 0.1}),
    ("RMSPropOptimizer", torch.optim.RMSprop, {"alpha": 0.9}),
])
def test_optimizer_names_from_torch_and_tensorflow(name, cls, extra):
    optimizer = build_optimizer(OptimizerConfig(name=name, base_learning_rate=0.5), nn.Linear(2, 2).parameters())
    assert type(optimizer) is cls
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.5
    assert {key: group[key] for key in extra} == extra


def test_unknown_optimizer_lists_the_known_ones():
    with pytest.raises(ValueError, match="FtrlOptimizer.*Adam.*SGD"):
        build_optimizer(OptimizerConfig(name="FtrlOptimizer", base_learning_rate=0.1), nn.Linear(2, 2).parameters())


def test_fit_runs_epochs_and_keeps_the_newest_checkpoints(tmp_path):
    config = tiny_config(tmp_path)
    _, summary = run_fit(config)
    assert summary["global_step"] == 15  # 3 epochs of 5 batches
    assert summary["examples"] == 15 * BATCH
    assert {"global_step", "examples", "seconds", "examples_per_sec", "loss"} <= set(summary)
    steps = [step for step, _ in list_checkpoints(config.checkpoints.train_dir)]
    assert steps == [12, 15]  # every 4 steps, 2 kept, plus the final one
    assert final_checkpoint(config.checkpoints.train_dir).endswith("ckpt-00000015.pt")
    checkpoint = load_checkpoint(final_checkpoint(config.checkpoints.train_dir))
    assert checkpoint.progress == {"step": 15, "examples": 120, "epoch": 3, "batches_in_epoch": 0, "lr_factor": 1.0,
                                   "world_size": 1}


def test_max_steps_stops_mid_epoch(tmp_path):
    _, summary = run_fit(tiny_config(tmp_path, max_steps=7))
    assert summary["global_step"] == 7


def test_checkpoints_load_with_weights_only(tmp_path):
    config = tiny_config(tmp_path, optimizer="Adam")
    run_fit(config)
    for _, path in list_checkpoints(config.checkpoints.train_dir):
        payload = torch.load(path, weights_only=True)
        assert {"model", "optimizer", "progress", "rng", "config"} <= set(payload)
    assert not [name for name in os.listdir(os.path.join(config.checkpoints.train_dir, "checkpoints")) if name.endswith(".tmp")]


def test_hooks_see_checkpoints_and_epoch_ends_and_can_stop(tmp_path):
    events: list[tuple] = []

    def record(event: TrainEvent):
        events.append((event.kind, event.step, event.epoch, event.final))
        assert event.train_dir == config.checkpoints.train_dir and isinstance(event.model, TinyModel)
        return event.kind == "epoch_end" and event.epoch == 2

    config = tiny_config(tmp_path)
    _, summary = run_fit(config, hooks=[record])
    assert events == [("checkpoint", 4, 0, False), ("epoch_end", 5, 1, False), ("checkpoint", 8, 1, False),
                      ("epoch_end", 10, 2, False), ("checkpoint", 10, 2, True)]
    assert summary["global_step"] == 10
    assert final_checkpoint(config.checkpoints.train_dir).endswith("ckpt-00000010.pt")


@pytest.mark.parametrize("run", [{}, {"ema_decay": 0.9}, {"swa_start_epoch": 2},
                                 {"mixup_alpha": 0.4, "feature_dropout": 0.2}], ids=["plain", "ema", "swa", "augment"])
def test_crash_and_resume_matches_an_uninterrupted_run(tmp_path, run):
    """Bit-exact: same data order, optimizer state, schedule and dropout draws (CPU, one process); with
    --ema_decay or --swa_start_epoch, the weight average (the final checkpoint's model) too; with mixup and feature
    dropout, their draws."""
    reference, reference_summary = run_fit(tiny_config(tmp_path / "a", **run))
    config = tiny_config(tmp_path / "b", **run)
    with pytest.raises(Crash):
        run_fit(config, hooks=[crash_after_checkpoint(8)])  # mid-epoch 2, after batch 3 of 5
    resume = load_checkpoint(list_checkpoints(config.checkpoints.train_dir)[-1][1])
    resumed, summary = run_fit(config, resume=resume, seed=123)  # another init: weights must come from the file
    assert summary["global_step"] == reference_summary["global_step"]
    assert summary["loss"] == reference_summary["loss"]
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], tensor, rtol=0, atol=0)
    finals = [load_checkpoint(final_checkpoint(str(run / "run"))) for run in (tmp_path / "a", tmp_path / "b")]
    for name, tensor in finals[0].model.items():
        torch.testing.assert_close(finals[1].model[name], tensor, rtol=0, atol=0)
    assert (finals[1].trained_weights is not None) == bool(run.get("ema_decay") or run.get("swa_start_epoch"))


def test_gradient_clipping_bounds_each_parameters_update(tmp_path):
    config = tiny_config(tmp_path, optimizer="SGD", base_learning_rate=1.0, clip_gradient_norm=1e-3,
                         max_steps=1, regularization_penalty=0.0)
    torch.manual_seed(0)
    model = TinyModel()
    before = [p.detach().clone() for p in model.parameters()]
    fit(model, build_optimizer(config.optimizer, model.parameters()), one_task(config, tiny_loss), tiny_batches, config)
    # SGD step = lr * clipped gradient, each parameter's clipped on its own (the starter kit's clip_by_norm)
    changes = [torch.linalg.vector_norm(p.detach() - b).item() for p, b in zip(model.parameters(), before)]
    assert len(changes) >= 2 and changes == pytest.approx([1e-3] * len(changes), rel=1e-4)


def test_resume_config_is_recorded(tmp_path):
    config = tiny_config(tmp_path, max_steps=3)
    run_fit(config)
    checkpoint = load_checkpoint(final_checkpoint(config.checkpoints.train_dir))
    assert checkpoint.config == config_document(config)


# --- `train` end to end on tiny synthetic shards --------------------------------------------------------


def validation_metrics(train_dir, data) -> dict:
    trained = build_model_from_checkpoint(final_checkpoint(str(train_dir)))
    dataset = YT8MDataset(data["validate_pattern"], trained.features, 32)
    return evaluate_model(trained.network, dataset, features_task(trained.features, "CrossEntropyLoss"))


def test_interrupted_run_resumes_to_the_same_steps_and_metrics(tiny_data, tmp_path):
    """Tolerance: identical step counts, metrics within 1e-6 (CPU, num_readers=0: bit-exact in practice)."""
    reference = train(tiny_train_config(tiny_data, tmp_path / "a", export_model_steps=3))
    config = tiny_train_config(tiny_data, tmp_path / "b", export_model_steps=3)
    with pytest.raises(Crash):
        train(config, hooks=[crash_after_checkpoint(6)])  # epoch 2, after 2 of its 4 batches
    assert latest_checkpoint_step(config.checkpoints.train_dir) == 6 and final_checkpoint(config.checkpoints.train_dir) is None
    resumed = train(config)
    assert resumed["global_step"] == reference["global_step"] == 12
    assert resumed["examples"] == reference["examples"] == 3 * 240
    assert resumed["loss"] == pytest.approx(reference["loss"], abs=1e-6)
    expected = validation_metrics(tmp_path / "a", tiny_data)
    for name, value in validation_metrics(tmp_path / "b", tiny_data).items():
        assert value == pytest.approx(expected[name], abs=1e-6), name


def latest_checkpoint_step(train_dir: str) -> int:
    return list_checkpoints(train_dir)[-1][0]


def test_resuming_a_different_model_is_refused_naming_each_field(tiny_data, tmp_path):
    train(tiny_train_config(tiny_data, tmp_path, max_steps=2))
    changed = tiny_train_config(tiny_data, tmp_path, model="LogisticModel", feature_names="mean_rgb",
                                feature_sizes="16", label_loss="HingeLoss")
    with pytest.raises(ValueError) as error:
        train(changed)
    message = str(error.value)
    for line in ("--model: checkpoint has 'MoeModel', this run asks for 'LogisticModel'",
                 "--feature_names: checkpoint has 'mean_rgb,mean_audio', this run asks for 'mean_rgb'",
                 "--feature_sizes", "--label_loss", "--start_new_model", "--train_dir"):
        assert line in message
    with pytest.raises(ValueError, match="--moe_num_mixtures: checkpoint has 2, this run asks for 3") as error:
        train(tiny_train_config(tiny_data, tmp_path, moe_num_mixtures=3))
    assert "--model" not in str(error.value)
    assert latest_checkpoint_step(str(tmp_path)) == 2  # nothing was touched


def test_a_resume_with_other_hyper_parameters_is_refused_unless_allowed_and_then_recorded(tiny_data, tmp_path):
    train(tiny_train_config(tiny_data, tmp_path, max_steps=2, label_loss="FocalLoss", focal_gamma=3.0))
    changed = dict(label_loss="FocalLoss", focal_gamma=1.0, base_learning_rate=0.02, max_steps=4)
    with pytest.raises(ValueError) as error:
        train(tiny_train_config(tiny_data, tmp_path, **changed))
    message = str(error.value)
    assert "\n" not in message and "--resume_with_changes" in message
    assert "--focal_gamma: checkpoint has 3.0, this run asks for 1.0" in message
    assert "--base_learning_rate: checkpoint has 0.05, this run asks for 0.02" in message
    assert latest_checkpoint_step(str(tmp_path)) == 2
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["loss"]["hparams"]["focal_gamma"] == 3.0

    summary = train(tiny_train_config(tiny_data, tmp_path, resume_with_changes=True, **changed))
    assert summary["global_step"] == 4
    stored = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert stored["loss"]["hparams"]["focal_gamma"] == 1.0
    record = ["step 2: --focal_gamma 3.0 -> 1.0", "step 2: --base_learning_rate 0.05 -> 0.02"]
    assert sorted(stored["checkpoints"]["resume_changes"]) == sorted(record)
    assert stored["checkpoints"]["resume_with_changes"] is False  # the permission was this resume's only
    # A later resume with the same values is no change: it keeps the record, without the flag.
    train(tiny_train_config(tiny_data, tmp_path, **{**changed, "max_steps": 5}))
    stored = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert sorted(stored["checkpoints"]["resume_changes"]) == sorted(record)
    assert load_checkpoint(list_checkpoints(str(tmp_path))[-1][1]).config["checkpoints"]["resume_changes"] == \
        stored["checkpoints"]["resume_changes"]


def test_a_new_run_from_a_resumed_runs_config_starts_without_its_record(tiny_data, tmp_path):
    config = tiny_train_config(tiny_data, tmp_path, max_steps=1, resume_changes=["step 9: --focal_gamma 3.0 -> 1.0"])
    train(config)
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["checkpoints"]["resume_changes"] == []


def test_start_new_model_starts_over(tiny_data, tmp_path):
    train(tiny_train_config(tiny_data, tmp_path, max_steps=5, export_model_steps=2))
    summary = train(tiny_train_config(tiny_data, tmp_path, model="LogisticModel", max_steps=3,
                                      export_model_steps=2, start_new_model=True))
    assert summary["global_step"] == 3
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [2, 3]
    assert load_config(TrainConfig, str(tmp_path / "config.yaml")).model.name == "LogisticModel"


def test_resume_continues_and_saves_the_resolved_config(tiny_data, tmp_path):
    first = train(tiny_train_config(tiny_data, tmp_path, max_steps=5))
    config = tiny_train_config(tiny_data, tmp_path, max_steps=7, log_every_steps=2)  # not a hyper-parameter: no change
    second = train(config)
    assert (first["global_step"], second["global_step"]) == (5, 7)
    assert second["examples"] == 7 * 64 - 16  # epoch 1 ended with a short batch of 48
    assert load_config(TrainConfig, str(tmp_path / "config.yaml")) == config
    assert any(name.startswith("events.out.tfevents.") for name in os.listdir(tmp_path))


def test_frame_model_on_video_features_is_refused(tiny_data, tmp_path):
    with pytest.raises(ValueError, match="DbofModel is a frame-level model but --frame_features is False"):
        train(tiny_train_config(tiny_data, tmp_path, model="DbofModel"))


def test_yaml_config_equals_the_same_flags(tmp_path):
    flags = ["--train_data_pattern", "d/train*", "--model", "MoeModel", "--moe_num_mixtures", "4",
             "--feature_names", "mean_rgb,mean_audio", "--feature_sizes", "1024,128", "--frame_features=false",
             "--base_learning_rate", "0.002", "--max_steps", "50", "--optimizer", "AdamOptimizer"]
    (tmp_path / "train.yaml").write_text(
        "train_data_pattern: d/train*\nmodel: MoeModel\nmoe_num_mixtures: 4\nfeature_names: mean_rgb,mean_audio\n"
        "feature_sizes: 1024,128\nframe_features: false\nbase_learning_rate: 0.002\nmax_steps: 50\n"
        "optimizer: AdamOptimizer\n")
    from_yaml = parse_args(["--config", str(tmp_path / "train.yaml")])
    assert from_yaml == parse_args(flags)
    assert from_yaml.schedule.batch_size == 1024  # the starter kit's defaults
    assert from_yaml.lr_schedule.name == "exponential"
    assert parse_args(["--config", str(tmp_path / "train.yaml"), "--max_steps", "7"]).schedule.max_steps == 7


def test_mixed_precision_on_the_cpu_trains_in_bfloat16_close_to_float32(tiny_data, tmp_path):
    from yt8m.runtime import autocast

    with autocast(torch.device("cpu"), True):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), False):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32
    full = train(tiny_train_config(tiny_data, tmp_path / "fp32"))
    mixed = train(tiny_train_config(tiny_data, tmp_path / "bf16", mixed_precision=True))
    assert mixed["global_step"] == full["global_step"] and mixed["loss"] != full["loss"]  # it did run in bf16
    expected = validation_metrics(tmp_path / "fp32", tiny_data)
    assert validation_metrics(tmp_path / "bf16", tiny_data)["gap"] == pytest.approx(expected["gap"], abs=0.01)


def test_the_log_names_the_train_dir_the_steps_of_the_total_and_the_time_left(tiny_data, tmp_path, caplog):
    config = tiny_train_config(tiny_data, tmp_path / "run", num_epochs=2, log_every_steps=1)
    with caplog.at_level(logging.INFO, logger="yt8m.train"):
        train(config)
    lines = [record.getMessage() for record in caplog.records]
    assert any(line.startswith(f"train dir {tmp_path / 'run'}: checkpoints {tmp_path / 'run' / 'checkpoints'}")
               for line in lines)
    steps = [line for line in lines if line.startswith("step ")]
    assert steps[-1].startswith("step 8/8 | epoch 2/2") and "| ETA 0:00:00" in steps[-1]
    assert steps[0].startswith("step 1/") and "| ETA " in steps[0]  # within the first epoch: estimated from bytes

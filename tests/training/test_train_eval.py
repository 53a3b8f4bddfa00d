"""Train and evaluate: early stopping, LR halving (and revert) on scripted validation metrics, the exporters,
resumption of the validation state, gradient accumulation, value clipping and --init_from.

Scripted metrics come through `train(..., evaluate=...)`, keyed by step, so a replayed evaluation after a
resume sees the same value the interrupted run saw.
"""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from torch import nn

from workflow_fixtures import tiny_data, tiny_train_config, train_config, trained_dir  # noqa: F401  (fixtures)
from yt8m.data.reading.batch import Batch
from yt8m.io.checkpoints import (
    Checkpoint,
    final_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    list_exports,
    load_checkpoint,
    read_export_metrics,
    save_checkpoint,
)
from yt8m.models.checkpoints import build_model_from_checkpoint, init_from_checkpoint
from yt8m.tasks.taskset import one_task_set
from yt8m.tasks.video import VIDEO_METRICS
from yt8m.training import TrainConfig, TrainEvent, fit, train
from yt8m.training.optim import build_optimizer


def scripted(values: dict[int, float], metric: str = "gap"):
    """An evaluate(model, step) returning `values[step]` as `metric` (the other metrics fixed)."""
    calls: list[int] = []

    def evaluate(model, step):
        calls.append(step)
        return {**{name: 0.5 for name in VIDEO_METRICS}, "num_videos": 64, metric: values[step]}

    evaluate.calls = calls
    return evaluate


def every_step_config(data, train_dir, **overrides) -> TrainConfig:
    """4 steps per epoch, a checkpoint (and an evaluation) after every step, a constant base learning rate."""
    return tiny_train_config(data, train_dir, export_model_steps=1, keep_checkpoints=20, learning_rate_decay=1.0,
                             log_every_steps=100, metrics_every_steps=100, **overrides)


def record_learning_rates(into: dict):
    def hook(event: TrainEvent):
        if event.kind == "checkpoint":
            into[event.step] = event.optimizer.param_groups[0]["lr"]
    return hook


GAPS = {1: 0.5, 2: 0.6, 3: 0.55, 4: 0.65, 5: 0.64, 6: 0.63, 7: 0.7, 8: 0.69}


def test_learning_rate_halves_exactly_after_each_evaluation_without_improvement(tiny_data, tmp_path):
    config = every_step_config(tiny_data, tmp_path, num_epochs=2, lr_halving_patience=1)
    seen: dict[int, float] = {}
    evaluate = scripted(GAPS)
    summary = train(config, hooks=[record_learning_rates(seen)], evaluate=evaluate)
    # No improvement at steps 3, 5, 6 and 8: each halves the rate of the steps after it.
    factors = {step: lr / config.optimizer.base_learning_rate for step, lr in seen.items()}
    assert factors == {1: 1, 2: 1, 3: 1, 4: 0.5, 5: 0.5, 6: 0.25, 7: 0.125, 8: 0.125}
    assert summary["lr_factor"] == 0.0625
    assert evaluate.calls == [1, 2, 3, 4, 5, 6, 7, 8]  # the final checkpoint is step 8's, evaluated once
    assert summary["best_value"] == 0.7 and summary["best_step"] == 7 and summary["evaluations"] == 8
    # A checkpoint holds the factor its step trained with (step 6's evaluation runs after it is written).
    assert load_checkpoint(os.path.join(tmp_path, "checkpoints", "ckpt-00000006.pt")).progress["lr_factor"] == 0.25


def test_patience_counts_evaluations_in_a_row(tiny_data, tmp_path):
    config = every_step_config(tiny_data, tmp_path, num_epochs=2, lr_halving_patience=2)
    seen: dict[int, float] = {}
    train(config, hooks=[record_learning_rates(seen)], evaluate=scripted(GAPS))
    factors = [seen[step] / config.optimizer.base_learning_rate for step in sorted(seen)]
    assert factors == [1, 1, 1, 1, 1, 1, 0.5, 0.5]  # steps 5 and 6 are the second run of two


def test_early_stopping_stops_at_the_patience_th_evaluation_without_improvement(tiny_data, tmp_path):
    config = every_step_config(tiny_data, tmp_path, num_epochs=3, early_stopping_patience=2)
    evaluate = scripted({1: 0.5, 2: 0.6, 3: 0.59, 4: 0.61, 5: 0.61, 6: 0.4, 7: 0.9})
    summary = train(config, evaluate=evaluate)
    assert evaluate.calls == [1, 2, 3, 4, 5, 6]
    assert summary["global_step"] == 6 and summary["stopped_early"] is True
    assert summary["best_step"] == 4 and summary["best_value"] == 0.61  # equal is no improvement
    assert final_checkpoint(str(tmp_path)).endswith("ckpt-00000006.pt")


def test_a_nan_validation_is_never_the_best_value(tiny_data, tmp_path):
    """A nan compares False with everything: kept as the best, no later evaluation would replace it."""
    config = every_step_config(tiny_data, tmp_path, num_epochs=1)
    with pytest.raises(ValueError, match=r"^step 2: validation gap is nan, which cannot rank checkpoints"):
        train(config, evaluate=scripted({1: 0.5, 2: float("nan"), 3: 0.6, 4: 0.7}))
    assert [step for step, _ in list_exports(str(tmp_path), "best")] == [1]


def test_best_latest_and_final_exports(tiny_data, tmp_path):
    config = every_step_config(tiny_data, tmp_path, num_epochs=2, keep_best_exports=2, keep_latest_exports=3)
    train(config, evaluate=scripted(GAPS))
    assert [step for step, _ in list_exports(str(tmp_path), "best")] == [4, 7]  # the two newest improvements
    assert [step for step, _ in list_exports(str(tmp_path), "latest")] == [6, 7, 8]
    best = list_exports(str(tmp_path), "best")[-1][1]
    assert read_export_metrics(best)["gap"] == 0.7 and read_export_metrics(best)["global_step"] == 7
    final = tmp_path / "export" / "final"
    assert read_export_metrics(str(final))["global_step"] == 8 and read_export_metrics(str(final))["gap"] == 0.69
    # Each export is a train dir of its own: the checkpoint loads, with the run's config beside it.
    trained = build_model_from_checkpoint(latest_checkpoint(best))
    assert trained.step == 7 and os.path.exists(os.path.join(best, "config.yaml"))
    reference = load_checkpoint(os.path.join(tmp_path, "checkpoints", "ckpt-00000007.pt")).model
    for name, tensor in trained.network.state_dict().items():
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=0)


def test_loss_as_best_metric_prefers_lower_values(tiny_data, tmp_path):
    config = every_step_config(tiny_data, tmp_path, max_steps=3, best_metric="loss")
    summary = train(config, evaluate=scripted({1: 0.9, 2: 0.7, 3: 0.8}, metric="loss"))
    assert (summary["best_step"], summary["best_value"]) == (2, 0.7)
    assert [step for step, _ in list_exports(str(tmp_path), "best")] == [2]


def test_revert_to_best_reloads_weights_and_optimizer_state(tiny_data, tmp_path, caplog):
    config = every_step_config(tiny_data, tmp_path, max_steps=4, lr_halving_patience=1, revert_to_best=True)
    adam_steps: dict[int, int] = {}

    def record_adam_steps(event: TrainEvent):
        first = next(iter(event.optimizer.state.values()))
        adam_steps[event.step] = int(first["step"])

    with caplog.at_level(logging.INFO, logger="yt8m.train"):
        train(config, hooks=[record_adam_steps], evaluate=scripted({1: 0.5, 2: 0.6, 3: 0.55, 4: 0.5}))
    # Step 3 did not improve on step 2: step 4 starts from step 2's weights and Adam state (2 updates).
    assert adam_steps == {1: 1, 2: 2, 3: 3, 4: 3}
    assert "reverted to the weights and optimizer state of the best model, step 2" in caplog.text


class Crash(RuntimeError):
    pass


def test_resume_replays_the_lost_evaluation_and_keeps_the_lr_factor(tiny_data, tmp_path):
    """Step 3's evaluation (a halving) ran after its checkpoint was written; the resumed run redoes it."""
    reference = train(every_step_config(tiny_data, tmp_path / "a", num_epochs=2, lr_halving_patience=1),
                      evaluate=scripted(GAPS))
    config = every_step_config(tiny_data, tmp_path / "b", num_epochs=2, lr_halving_patience=1)

    def crash_at_step_3(event: TrainEvent):
        if event.step == 3:
            raise Crash

    with pytest.raises(Crash):
        train(config, hooks=[crash_at_step_3], evaluate=scripted(GAPS))
    evaluate = scripted(GAPS)
    resumed = train(config, evaluate=evaluate)
    assert evaluate.calls == [3, 4, 5, 6, 7, 8]
    for key in ("global_step", "lr_factor", "best_step", "best_value", "evaluations", "loss"):
        assert resumed[key] == reference[key], key
    expected = load_checkpoint(final_checkpoint(str(tmp_path / "a"))).model
    for name, tensor in load_checkpoint(final_checkpoint(config.checkpoints.train_dir)).model.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


def test_validation_set_end_to_end(tiny_data, tmp_path):
    config = tiny_train_config(tiny_data, tmp_path, eval_data_pattern=tiny_data["validate_pattern"], eval_steps=1,
                               num_epochs=2)
    summary = train(config)
    assert summary["evaluations"] == 2 and summary["best_metric"] == "gap" and 0 < summary["best_value"] <= 1
    with open(tmp_path / "eval" / "metrics-00000008.json") as fh:
        metrics = json.load(fh)
    assert metrics["num_videos"] == 64  # --eval_steps 1: one batch of --batch_size 64
    assert any(name.startswith("events.out.tfevents.") for name in os.listdir(tmp_path / "eval"))
    assert read_export_metrics(str(tmp_path / "export" / "final")) == metrics


@pytest.mark.parametrize("flags, message", [
    ({"early_stopping_patience": 2}, "--early_stopping_patience needs --eval_data_pattern"),
    ({"eval_data_pattern": "x", "revert_to_best": True}, "--revert_to_best acts when the learning rate is halved"),
    ({"eval_data_pattern": "x", "best_metric": "accuracy"}, "--best_metric 'accuracy' is not a metric .known: gap, map"),
    ({"eval_data_pattern": "x", "eval_steps": 0}, "--eval_steps must be at least 1"),
    ({"numbatches_to_aggregate": 0}, "--numbatches_to_aggregate must be at least 1"),
])
def test_flag_problems_are_named(tiny_data, tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        train(tiny_train_config(tiny_data, tmp_path, **flags))


# --- gradient accumulation and clipping, on a tiny linear model ---------------------------------------

FEATURES, CLASSES = 6, 4


class LinearModel(nn.Module):
    frame_level = False

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, CLASSES)

    def forward(self, features, num_frames=None):
        logits = self.linear(features)
        return {"logits": logits, "predictions": torch.sigmoid(logits)}

    def l2_penalties(self):
        return [(self.linear.weight, 2.0)]  # the penalty: sum(w^2)


def bce(output, labels):
    return nn.functional.binary_cross_entropy_with_logits(output["logits"], labels)


def batches_of(sizes: list[int], seed: int = 0) -> list[Batch]:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(sum(sizes), FEATURES, generator=generator)
    labels = (torch.rand(sum(sizes), CLASSES, generator=generator) > 0.5).float()
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [Batch(video_ids=[str(i) for i in range(start, start + size)], features=features[start:start + size],
                  labels=labels[start:start + size]) for start, size in zip(starts, sizes)]


def trained_parameters(tmp_path, sizes: list[int], aggregate: int, steps: int, **overrides) -> list[torch.Tensor]:
    values = dict(train_dir=str(tmp_path), num_epochs=1, max_steps=steps, numbatches_to_aggregate=aggregate,
                  optimizer="SGD", base_learning_rate=0.5, regularization_penalty=0.01, export_model_steps=1000,
                  metrics_every_steps=1000)
    config = train_config(**{**values, **overrides})
    torch.manual_seed(0)
    model = LinearModel()
    fit_with_loss(model, bce, lambda epoch: batches_of(sizes), config)
    return [p.detach() for p in model.parameters()]


def fit_with_loss(model: nn.Module, loss_fn, epoch_batches, config: TrainConfig) -> dict:
    """`fit` a model of one's own on one task whose loss is `loss_fn`, with the config's optimizer."""
    tasks = one_task_set(config.main_task(), config.validation.top_n, loss_fn)
    return fit(model, build_optimizer(config.optimizer, model.parameters()), tasks, epoch_batches, config)


@pytest.mark.parametrize("clip_gradient_norm", [0.0, 1e-2])
def test_accumulated_micro_batches_equal_one_large_batch(tmp_path, clip_gradient_norm):
    """Two steps: 8+8+5 examples (unequal last micro-batch) then 8, against batches of 21 and 8."""
    accumulated = trained_parameters(tmp_path / "k", [8, 8, 5, 8], aggregate=3, steps=2,
                                     clip_gradient_norm=clip_gradient_norm)
    large = trained_parameters(tmp_path / "one", [21, 8], aggregate=1, steps=2, clip_gradient_norm=clip_gradient_norm)
    moved = trained_parameters(tmp_path / "other", [21, 8], aggregate=1, steps=1, clip_gradient_norm=clip_gradient_norm)
    for got, expected, one_step in zip(accumulated, large, moved):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        assert not torch.allclose(got, one_step)  # the second step happened


def test_accumulation_counts_examples_and_steps(tmp_path):
    config = train_config(train_dir=str(tmp_path), num_epochs=2, numbatches_to_aggregate=2, optimizer="SGD",
                          base_learning_rate=0.1, export_model_steps=1000, metrics_every_steps=1000)
    model = LinearModel()
    summary = fit_with_loss(model, bce, lambda epoch: batches_of([8, 8, 8]), config)
    assert (summary["global_step"], summary["examples"]) == (4, 48)  # per epoch: 8+8, then 8 alone


def test_value_clipping_bounds_every_gradient_element(tmp_path):
    before = trained_parameters(tmp_path / "none", [8], aggregate=1, steps=0)
    after = trained_parameters(tmp_path / "clip", [8], aggregate=1, steps=1, clip_gradient_norm=0.0,
                               clip_gradient_value=1e-3, regularization_penalty=0.0)
    for old, new in zip(before, after):
        change = (new - old).abs()
        assert change.max().item() == pytest.approx(0.5 * 1e-3, rel=1e-4)  # lr x clipped element


# --- --init_from --------------------------------------------------------------------------------------


def test_init_from_reports_what_it_loaded(tmp_path):
    source = nn.ModuleDict({"a": nn.Linear(3, 2), "b": nn.Linear(3, 4), "gone": nn.Linear(1, 1)})
    save_checkpoint(str(tmp_path), Checkpoint(model=source.state_dict(), progress={"step": 1}), keep=1)
    target = nn.ModuleDict({"a": nn.Linear(3, 2), "b": nn.Linear(3, 5), "new": nn.Linear(2, 2)})
    report = init_from_checkpoint(target, str(tmp_path))  # a train dir: its latest checkpoint
    assert report.loaded == ["a.weight", "a.bias"]
    assert report.not_loaded == {"b.weight": "shape [4, 3] in the checkpoint, [5, 3] here",
                                 "b.bias": "shape [4] in the checkpoint, [5] here",
                                 "new.weight": "not in the checkpoint", "new.bias": "not in the checkpoint"}
    assert report.unused == ["gone.weight", "gone.bias"]
    torch.testing.assert_close(target["a"].weight, source["a"].weight)


def test_init_from_starts_a_new_run_from_another_runs_weights(tiny_data, trained_dir, tmp_path, caplog):
    config = tiny_train_config(tiny_data, tmp_path / "same", init_from=str(trained_dir), max_steps=0)
    with caplog.at_level(logging.INFO, logger="yt8m.train"):
        train(config)
    assert "loaded 3 of 3 tensors" in caplog.text
    source = load_checkpoint(final_checkpoint(str(trained_dir))).model
    for name, tensor in load_checkpoint(list_checkpoints(config.checkpoints.train_dir)[-1][1]).model.items():
        torch.testing.assert_close(tensor, source[name], rtol=0, atol=0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="yt8m.train"):
        train(tiny_train_config(tiny_data, tmp_path / "wider", init_from=str(trained_dir), max_steps=0,
                                moe_num_mixtures=3))
    assert "loaded 0 of 3 tensors" in caplog.text
    assert "not loaded (kept their initialization): gates.weight (shape [36, 24] in the checkpoint, [48, 24] here)" \
        in caplog.text


@pytest.mark.parametrize("export_model_steps", [1000, 0])
def test_checkpoint_every_epoch_evaluates_each_epoch_end(tiny_data, tmp_path, export_model_steps):
    seen = []
    config = tiny_train_config(tiny_data, tmp_path, export_model_steps=export_model_steps, checkpoint_every_epoch=True,
                               eval_data_pattern=tiny_data["validate_pattern"])
    summary = train(config, hooks=[lambda event: seen.append((event.kind, event.step, event.metrics is not None))])
    assert [entry for entry in seen if entry[0] == "checkpoint"] == [("checkpoint", 4, True), ("checkpoint", 8, True),
                                                                    ("checkpoint", 12, True)]
    assert sorted(name for name in os.listdir(tmp_path / "eval") if name.startswith("metrics-")) == [
        "metrics-00000004.json", "metrics-00000008.json", "metrics-00000012.json"]
    assert summary["evaluations"] == 3


@pytest.mark.parametrize("every_epoch, steps", [(False, [12]), (True, [4, 8, 12])])
def test_export_model_steps_0_checkpoints_at_no_step_count(tiny_data, tmp_path, every_epoch, steps):
    seen = []
    config = tiny_train_config(tiny_data, tmp_path, export_model_steps=0, checkpoint_every_epoch=every_epoch,
                               eval_data_pattern=tiny_data["validate_pattern"])
    train(config, hooks=[lambda event: seen.append(event.step) if event.kind == "checkpoint" else None])
    assert seen == steps
    assert [step for step, _ in list_checkpoints(config.checkpoints.train_dir)] == steps


def test_checkpoint_at_examples_checkpoints_where_each_count_is_reached_once(tiny_data, tmp_path):
    """240 videos an epoch in batches of 64: 64, 128, 192, 240, 304, ... examples after steps 1, 2, 3, 4, 5, ..."""
    seen = []

    def hook(event):
        if event.kind == "checkpoint":
            seen.append((event.step, event.examples, event.metrics is not None))

    values = dict(export_model_steps=0, checkpoint_at_examples=[100, 130, 500],
                  eval_data_pattern=tiny_data["validate_pattern"])
    train(tiny_train_config(tiny_data, tmp_path, max_steps=5, **values), hooks=[hook])
    assert seen == [(2, 128, True), (3, 192, True), (5, 304, True)]
    seen.clear()
    # Resumed past the first two counts: only the third is written, then the final checkpoint.
    train(tiny_train_config(tiny_data, tmp_path, **values), hooks=[hook])
    assert seen == [(9, 544, True), (12, 720, True)]
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [2, 3, 5, 9, 12]

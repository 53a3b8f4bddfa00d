"""Multi-task training: the `tasks:` config and the --aux_vertical_weight shorthand, the shared-trunk model, the
interleaved data, per-task losses and metrics (TASK/METRIC), best tracking per task, and the errors naming a task."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import torch
import yaml

from workflow_fixtures import NUM_CLASSES, VERTICALS, as_flags, tiny_data, tiny_train_config, vocabulary  # noqa: F401
from yt8m.cli import main
from yt8m.config import config_from_dict, config_values
from yt8m.data.making.synthetic import write_synthetic
from yt8m.data.reading.batch import Batch
from yt8m.models.multihead import HeadView, build_multitask_model
from yt8m.tasks.spec import TaskSpec, resolve_tasks
from yt8m.tasks.taskset import plan_tasks
from yt8m.training import TrainConfig, train
from yt8m.training.checks import train_config_problems
from yt8m.training.data import Interleaving


@pytest.fixture(scope="module")
def other_release(tmp_path_factory) -> dict:
    """Shards of another release: id key video_id, 10 classes, the same features."""
    root = tmp_path_factory.mktemp("other_release")
    write_synthetic(str(root), kind="video", num_classes=10, train_videos=128, validate_videos=32, test_videos=8,
                    shards=2, feature_sizes=(16, 8), seed=5, id_key="video_id")
    return {split: str(root / "video" / f"{split}-*.tfrecord") for split in ("train", "validate")}


def metrics_files(train_dir) -> list[dict]:
    folder = os.path.join(train_dir, "eval")
    return [json.load(open(os.path.join(folder, name))) for name in sorted(os.listdir(folder))
            if name.startswith("metrics-")]


def test_the_vertical_shorthand_trains_two_heads_and_reports_each_tasks_metrics(tiny_data, vocabulary, tmp_path,
                                                                               caplog, capsys):
    values = {**config_values(tiny_train_config(tiny_data, tmp_path / "run", num_epochs=2)),
              "eval_data_pattern": tiny_data["validate_pattern"]}
    flags = as_flags({name: values[name] for name in (
        "train_data_pattern", "eval_data_pattern", "train_dir", "model", "feature_names", "feature_sizes",
        "num_classes", "batch_size", "num_epochs", "export_model_steps", "num_readers", "seed",
        "log_every_steps", "metrics_every_steps")})
    with caplog.at_level(logging.INFO, logger="yt8m.train"):
        assert main(["train", *flags, "--aux_vertical_weight", "0.5", "--vocabulary_file", vocabulary,
                     "--best_metric", "vertical/gap"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["best_metric"] == "vertical/gap"
    assert set(summary["task_best"]) == {"main", "vertical"}
    assert summary["task_best"]["main"]["metric"] == "main/gap"
    step_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("step 4 |", "step 4/"))]
    assert "main/loss" in step_lines[0] and "vertical/loss" in step_lines[0]
    last = metrics_files(tmp_path / "run")[-1]
    assert {"main/gap", "main/map", "main/hit_at_one", "main/perr", "vertical/gap", "vertical/num_videos"} <= set(last)
    assert last["vertical/gap"] == summary["best_value"] or summary["best_step"] != last["global_step"]
    payload = torch.load(tmp_path / "run" / "checkpoints" / "ckpt-00000008.pt", weights_only=True)  # as written
    assert payload["model"]["heads.vertical.experts.bias"].shape[0] == VERTICALS * 2
    assert [task["name"] for task in payload["tasks"]] == ["main", "vertical"]


def test_the_combined_loss_is_the_weighted_sum_of_the_task_losses(tiny_data, vocabulary, tmp_path):
    config = tiny_train_config(tiny_data, tmp_path / "run", aux_vertical_weight=0.25, vocabulary_file=vocabulary)
    plan = plan_tasks(config.tasks, config.main_task(), config.validation.top_n)
    model = build_multitask_model(config.model, config.features, plan.specs)
    batch = Batch(features=torch.randn(5, 24), labels=torch.rand(5, NUM_CLASSES) > 0.7,
                  video_ids=list("abcde"), source=0)
    total, losses = plan.loss(model(batch.features), batch)
    assert total.item() == pytest.approx((losses["main/loss"] + 0.25 * losses["vertical/loss"]).item(), rel=1e-6)
    vertical_labels = plan.tasks["vertical"].mapped(batch).labels
    for row in range(5):
        expected = {index % VERTICALS for index in batch.labels[row].nonzero().flatten().tolist()}
        assert set(vertical_labels[row].nonzero().flatten().tolist()) == expected


def test_a_yaml_tasks_section_trains_on_two_releases_each_validated_on_its_own(tiny_data, other_release, tmp_path):
    tasks = [{"name": "r2018"},
             {"name": "r2017", "train_data_pattern": other_release["train"],
              "eval_data_pattern": other_release["validate"], "num_classes": 10, "weight": 2.0}]
    config = tiny_train_config(tiny_data, tmp_path / "run", tasks=tasks, trunk_hidden_sizes=[32], num_epochs=1,
                               eval_data_pattern=tiny_data["validate_pattern"], task_sampling="round_robin",
                               best_metric="r2017/map")
    summary = train(config)
    assert summary["global_step"] == 4 + 2  # 240 / 64 and 128 / 64 batches, one epoch
    assert summary["best_metric"] == "r2017/map"
    result = metrics_files(tmp_path / "run")[-1]
    assert result["r2018/num_videos"] == 64 and result["r2017/num_videos"] == 32


def test_task_sampling_is_deterministic_under_the_seed_and_reads_every_batch():
    def streams():
        return [iter([("a", i) for i in range(6)]), iter([("b", i) for i in range(2)])]

    orders = [list(Interleaving(streams(), "proportional", [3.0, 1.0], np.random.default_rng([7, 0])).batches())
              for _ in range(2)]
    assert orders[0] == orders[1]
    assert sorted(orders[0]) == sorted(item for stream in streams() for item in stream)
    assert list(Interleaving(streams(), "round_robin", [1, 1], np.random.default_rng(0)).batches())[:4] == [
        ("a", 0), ("b", 0), ("a", 1), ("b", 1)]


def test_the_trunk_of_a_frame_model_is_all_but_its_classifier(tiny_data, tmp_path):
    config = config_from_dict(TrainConfig, dict(
        train_data_pattern="unused", model="DbofModel", frame_features=True, feature_names="rgb,audio",
        feature_sizes="16,8", dbof_cluster_size=8, dbof_hidden_size=6, iterations=4,
        tasks=[{"name": "a", "num_classes": 5}, {"name": "b", "num_classes": 3, "head_model": "LogisticModel"},
               {"name": "c", "num_classes": 5, "head": "shared"}]), checks=train_config_problems)
    specs = resolve_tasks(config.tasks, config.main_task())
    model = build_multitask_model(config.model, config.features, specs)
    assert model.trunk.base.classifier is None and set(model.heads) == {"a", "b"}
    output = model(torch.rand(2, 7, 24), torch.tensor([7, 3]))
    assert output["logits"]["a"].shape == (2, 5) and output["predictions"]["b"].shape == (2, 3)
    model.eval()
    view = HeadView(model, "c")(torch.rand(2, 7, 24), torch.tensor([7, 3]))
    assert view["predictions"].shape == (2, 5)
    assert [name for name, _ in model.heads["a"].named_parameters()] == [
        name.removeprefix("heads.a.") for name, _ in model.named_parameters() if name.startswith("heads.a.")]


@pytest.mark.parametrize("normalize", [True, False])
def test_the_trunk_of_a_video_level_model_normalizes_its_input_as_asked(normalize):
    config = config_from_dict(TrainConfig, dict(
        train_data_pattern="unused", model="LogisticModel", feature_names="mean_rgb", feature_sizes=6,
        input_l2_normalize=normalize, tasks=[{"name": "a", "num_classes": 4}, {"name": "b", "num_classes": 3}]),
        checks=train_config_problems)
    model = build_multitask_model(config.model, config.features, resolve_tasks(config.tasks, config.main_task()))
    features = torch.rand(5, 6) * 3
    read = torch.nn.functional.normalize(features, dim=-1) if normalize else features
    for head, logits in model(features)["logits"].items():
        torch.testing.assert_close(logits, model.heads[head].linear(read))


def test_a_task_written_by_section_is_the_task_written_flat():
    flat = {"name": "v", "label_source": "vocabulary", "vocabulary_file": "v.csv", "weight": 0.5,
            "head_model": "LogisticModel", "metric": "hit_at_one"}
    nested = {"name": "v", "data": {"label_source": "vocabulary", "vocabulary_file": "v.csv"},
              "objective": {"weight": 0.5, "metric": "hit_at_one"}, "head": {"head_model": "LogisticModel"}}
    specs = [resolve_tasks(config_from_dict(TrainConfig, dict(train_data_pattern="d/*", tasks=[{"name": "a"}, entry]),
                                            checks=train_config_problems).tasks, _main_task()) for entry in (flat, nested)]
    assert specs[0] == specs[1]
    vertical = specs[0][1]
    assert (vertical.data.vocabulary_file, vertical.objective.weight, vertical.head.head) == ("v.csv", 0.5, "v")
    assert config_values(vertical)["weight"] == 0.5  # a checkpoint records its tasks flat, as before the sections
    assert TaskSpec.from_dict(config_values(vertical)) == vertical


def _main_task():
    return config_from_dict(TrainConfig, dict(train_data_pattern="d/*"), checks=train_config_problems).main_task()


def test_every_task_problem_is_named_in_one_error(tmp_path, capsys):
    path = tmp_path / "train.yaml"
    path.write_text("train_data_pattern: data/*\neval_data_pattern: val/*\nbest_metric: nosuch/gap\ntasks:\n"
                    "  - {name: a}\n  - {name: a, weight: -1}\n  - {name: b, label_source: vocabulary}\n"
                    "  - {name: c, train_data_pattern: other/*, lable_source: labels}\n")
    assert main(["train", "--config", str(path)]) != 0
    message = capsys.readouterr().err
    for text in ("tasks[1] (a): weight must be at least 0", "two tasks are named 'a'",
                 "task b: label_source vocabulary needs vocabulary_file",
                 "tasks[3] (c): unknown field 'lable_source'; did you mean 'label_source'?",
                 "--best_metric nosuch/gap: no task is named 'nosuch'"):
        assert text in message


def test_a_vocabulary_missing_a_class_is_refused_naming_the_task(tiny_data, tmp_path):
    path = tmp_path / "short.csv"
    path.write_text("Index,Vertical1\n" + "".join(f"{i},v\n" for i in range(NUM_CLASSES - 2)))
    config = tiny_train_config(tiny_data, tmp_path / "run", aux_vertical_weight=0.1, vocabulary_file=str(path))
    with pytest.raises(ValueError, match=r"task vertical: vocabulary_file .*short.csv maps no Vertical1 for 2 of "
                                         r"the 12 label classes: 10, 11"):
        train(config)
    assert not (tmp_path / "run").exists()


def test_labels_beyond_a_tasks_num_classes_are_refused_naming_the_task(tiny_data, other_release, tmp_path):
    tasks = [{"name": "main"}, {"name": "small", "train_data_pattern": other_release["train"], "num_classes": 4,
                                "validate": False}]
    with pytest.raises(ValueError, match=r"task small \(num_classes 4, reading .*\): .*labels"):
        train(tiny_train_config(tiny_data, tmp_path / "run", tasks=tasks))


def test_the_num_classes_of_a_release_of_its_own_comes_from_its_id_key(tiny_data, other_release, tmp_path):
    tasks = [{"name": "main"}, {"name": "old", "train_data_pattern": other_release["train"], "validate": False}]
    config = tiny_train_config(tiny_data, tmp_path / "run", tasks=tasks)
    plan = plan_tasks(config.tasks, config.main_task(), config.validation.top_n)
    assert [spec.num_classes for spec in plan.specs] == [NUM_CLASSES, 4716]


def test_resuming_with_another_task_set_is_refused_naming_what_differs(tiny_data, vocabulary, tmp_path):
    config = tiny_train_config(tiny_data, tmp_path / "run", num_epochs=1, aux_vertical_weight=0.5,
                               vocabulary_file=vocabulary)
    train(config)
    with pytest.raises(ValueError, match="other tasks: task main: only in the checkpoint; task vertical: only in the checkpoint"):
        train(tiny_train_config(tiny_data, tmp_path / "run", num_epochs=2))
    changed = [{"name": "main"}, {"name": "vertical", "label_source": "vocabulary", "vocabulary_file": vocabulary,
                                  "loss": "HingeLoss"}]
    with pytest.raises(ValueError, match="task vertical: loss 'CrossEntropyLoss' in the checkpoint, 'HingeLoss' here"):
        train(tiny_train_config(tiny_data, tmp_path / "run", num_epochs=2, tasks=changed))
    resumed = train(tiny_train_config(tiny_data, tmp_path / "run", num_epochs=2, aux_vertical_weight=0.5,
                                      vocabulary_file=vocabulary))
    assert resumed["global_step"] == 8 and resumed["examples"] == 480


def test_best_metric_of_one_task_drives_early_stopping(tiny_data, vocabulary, tmp_path):
    values = {1: 0.5, 2: 0.4, 3: 0.3, 4: 0.9}

    def evaluate(model, step):
        return {"main/gap": 0.9, "main/loss": 1.0, "vertical/gap": values[step], "vertical/loss": 1.0}

    config = tiny_train_config(tiny_data, tmp_path / "run", export_model_steps=1, aux_vertical_weight=0.5,
                               vocabulary_file=vocabulary, best_metric="vertical/gap", early_stopping_patience=2)
    summary = train(config, evaluate=evaluate)
    assert summary["stopped_early"] and summary["global_step"] == 3
    assert summary["best_step"] == 1 and summary["task_best"]["main"]["step"] == 1


def test_predict_and_export_serve_one_tasks_head(tiny_data, vocabulary, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    train(tiny_train_config(tiny_data, tmp_path / "run", num_epochs=1, aux_vertical_weight=0.5,
                            vocabulary_file=vocabulary))
    predictions = tmp_path / "vertical.jsonl"
    assert main(["predict", "--train_dir", str(tmp_path / "run"), "--input_data_pattern", tiny_data["test_pattern"],
                 "--output_file", str(predictions), "--output_format", "jsonl", "--task", "vertical",
                 "--top_k", "5"]) == 0
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert rows and all(max(row["class_indexes"]) < VERTICALS and len(row["class_indexes"]) == VERTICALS
                        for row in rows)
    assert main(["export", "--train_dir", str(tmp_path / "run"), "--output", str(tmp_path / "onnx"),
                 "--task", "vertical"]) == 0
    metadata = json.loads((tmp_path / "onnx" / "metadata.json").read_text())
    assert (metadata["task"], metadata["num_classes"], metadata["id_key"]) == ("vertical", VERTICALS, "id")
    capsys.readouterr()
    assert main(["predict", "--train_dir", str(tmp_path / "run"), "--input_data_pattern", tiny_data["test_pattern"],
                 "--output_file", str(predictions), "--task", "nosuch"]) != 0
    assert "--task nosuch" in capsys.readouterr().err


def test_tasks_train_with_gradient_accumulation_and_mixed_precision(tiny_data, vocabulary, tmp_path):
    config = tiny_train_config(tiny_data, tmp_path / "run", num_epochs=1, batch_size=32, numbatches_to_aggregate=2,
                               mixed_precision=True, aux_vertical_weight=0.5, vocabulary_file=vocabulary)
    summary = train(config)
    assert summary["global_step"] == 4 and np.isfinite(summary["loss"])


@pytest.mark.integration
def test_two_processes_train_tasks_whose_batches_reach_different_heads(tiny_data, other_release, tmp_path):
    import subprocess
    import sys

    import yaml

    values = {**config_values(tiny_train_config(tiny_data, tmp_path / "run", num_epochs=1, batch_size=32)),
              "task_sampling": "round_robin", "trunk_hidden_sizes": [16],
              "tasks": [{"name": "main"}, {"name": "other", "train_data_pattern": other_release["train"],
                                           "num_classes": 10, "validate": False}]}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(values))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "yt8m",
               "train", "--config", str(path)]
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["processes"] == 2 and np.isfinite(summary["loss"])


def test_a_task_without_data_or_weight_is_an_error_and_nothing_is_written(tiny_data, vocabulary, tmp_path, capsys):
    empty = tmp_path / "empty-00000-of-00001.tfrecord"
    empty.write_bytes(b"")
    base = config_values(tiny_train_config(tiny_data, tmp_path / "run", vocabulary_file=vocabulary))
    for tasks, expected in [
            ([{"name": "main"}, {"name": "other", "train_data_pattern": str(empty), "validate": False}],
             f"task other (num_classes 3862, reading {empty}): {empty} has no training examples"),
            ([{"name": "main", "weight": 0}, {"name": "vertical", "label_source": "vocabulary", "weight": 0}],
             "every task's weight is 0")]:
        (tmp_path / "tasks.yaml").write_text(yaml.safe_dump({**base, "tasks": tasks}))
        assert main(["train", "--config", str(tmp_path / "tasks.yaml")]) == 1
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err
        assert not (tmp_path / "run").exists()

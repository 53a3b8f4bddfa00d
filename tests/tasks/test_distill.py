"""Distillation (`yt8m train --teacher`): a student learns from a run, a checkpoint, an ONNX export, or JSONL and CSV
predictions; W=0 trains exactly as without a teacher; bad teachers, missing videos and changed settings on resume
are clear errors."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
import yaml

from workflow_fixtures import NUM_CLASSES, as_flags, tiny_data, tiny_train_config, train_config, trained_dir  # noqa: F401
from yt8m.cli import main as cli_main
from yt8m.config import ConfigError, config_from_dict
from yt8m.data.reading.batch import Batch
from yt8m.inference.teachers import CheckpointTeacher, OnnxTeacher, StoredTeacher, locate_teacher, run_checkpoint
from yt8m.io.checkpoints import final_checkpoint, latest_checkpoint, load_checkpoint
from yt8m.optional import available
from yt8m.tasks.losses import create_loss
from yt8m.tasks.teacher import DistillationTask, distillation_loss, probability_logits
from yt8m.tasks.video import VideoTask
from yt8m.training import TrainConfig, train
from yt8m.training.checks import train_config_problems


def student_values(data: dict, train_dir, **overrides) -> dict:
    """A short LogisticModel student on the tiny data (the teacher, trained_dir, is a MoeModel)."""
    values = dict(train_data_pattern=data["train_pattern"], train_dir=str(train_dir), model="LogisticModel",
                  feature_names="mean_rgb,mean_audio", feature_sizes="16,8", num_classes=NUM_CLASSES, batch_size=64,
                  max_steps=4, export_model_steps=4, num_readers=0, base_learning_rate=0.05, log_every_steps=4,
                  metrics_every_steps=4, seed=7)
    return {**values, **overrides}


def train_cli(values: dict, capsys) -> dict:
    assert cli_main(["train", *as_flags(values)]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def teacher_jsonl(tiny_data, trained_dir, tmp_path_factory) -> str:
    """The teacher's full-probability predictions on the training shards, as `yt8m predict` writes them."""
    path = tmp_path_factory.mktemp("teacher") / "train.jsonl"
    assert cli_main(["predict", "--input_data_pattern", tiny_data["train_pattern"], "--train_dir", str(trained_dir),
                     "--output_file", str(path), "--output_format", "jsonl", "--top_k", str(NUM_CLASSES),
                     "--num_readers", "0"]) == 0
    return str(path)


@pytest.fixture(scope="module")
def plain_student(tiny_data, tmp_path_factory) -> tuple[str, dict]:
    """The student trained without a teacher: (train dir, summary)."""
    train_dir = str(tmp_path_factory.mktemp("plain") / "run")
    return train_dir, train(train_config(**student_values(tiny_data, train_dir)))


def test_a_run_teaches_through_the_cli_streamed_and_the_loss_differs_from_plain_training(
        tiny_data, trained_dir, plain_student, tmp_path, capsys, caplog):
    with caplog.at_level(logging.INFO, logger="yt8m.tasks.teacher"):
        distilled = train_cli(student_values(tiny_data, tmp_path / "student", teacher=str(trained_dir),
                                             distill_weight=0.7, distill_temperature=2), capsys)
    assert "(streamed: run on each batch)" in caplog.text and str(trained_dir) in caplog.text
    assert distilled["global_step"] == plain_student[1]["global_step"] == 4
    assert distilled["loss"] != pytest.approx(plain_student[1]["loss"], rel=1e-3)


def test_weight_zero_trains_exactly_as_without_a_teacher(tiny_data, trained_dir, plain_student, tmp_path):
    train(train_config(**student_values(tiny_data, tmp_path / "w0", teacher=str(trained_dir), distill_weight=0.0)))
    plain = load_checkpoint(final_checkpoint(plain_student[0])).model
    zero = load_checkpoint(final_checkpoint(str(tmp_path / "w0"))).model
    assert all(torch.equal(plain[name], zero[name]) for name in plain)


def test_jsonl_and_csv_predictions_teach_as_the_model_they_came_from(tiny_data, trained_dir, teacher_jsonl,
                                                                     tmp_path, capsys, caplog):
    """Full-probability files give the teacher's own logits (to float32 rounding): the same training."""
    csv_path = tmp_path / "train.csv"
    assert cli_main(["convert-predictions", "--input", teacher_jsonl, "--output", str(csv_path),
                     "--top_k", str(NUM_CLASSES)]) == 0
    summaries = {}
    for name, teacher in (("run", str(trained_dir)), ("jsonl", teacher_jsonl), ("csv", str(csv_path))):
        with caplog.at_level(logging.INFO, logger="yt8m.tasks.teacher"):
            summaries[name] = train_cli(student_values(tiny_data, tmp_path / name, teacher=teacher), capsys)
    assert "(stored: read once into a store keyed by video id)" in caplog.text
    assert summaries["jsonl"]["loss"] == pytest.approx(summaries["run"]["loss"], rel=1e-4)
    assert summaries["csv"]["loss"] == pytest.approx(summaries["run"]["loss"], rel=1e-3)  # CSV's 6 decimals


def test_a_video_the_teacher_lacks_is_an_error_naming_it_the_teacher_and_its_record(tiny_data, teacher_jsonl,
                                                                                      tmp_path, capsys):
    lines = open(teacher_jsonl).read().splitlines()
    dropped = json.loads(lines[5])["video_id"]
    partial = tmp_path / "partial.jsonl"
    partial.write_text("\n".join(lines[:5] + lines[6:]) + "\n")
    code = cli_main(["train", *as_flags(student_values(tiny_data, tmp_path / "run", teacher=str(partial),
                                                       num_epochs=1, max_steps=None))])
    err = capsys.readouterr().err
    assert code == 1
    assert f"has no prediction for video {dropped!r}" in err and str(partial) in err
    assert "(record at byte" in err and "train-" in err
    assert latest_checkpoint(str(tmp_path / "run")) is None
    assert not (tmp_path / "run").exists()  # nothing of the failed start is left: no config.yaml, events, sizes


def test_a_top_k_file_warns_that_missing_classes_count_as_zero(tmp_path, caplog):
    path = tmp_path / "top2.jsonl"
    path.write_text(json.dumps({"video_id": "a", "class_indexes": [3, 1], "predictions": [0.9, 0.2]}) + "\n")
    with caplog.at_level(logging.WARNING, logger="yt8m.tasks.teacher"):
        teacher = StoredTeacher(str(path), NUM_CLASSES)
    assert "at most 2 of the 12 classes" in caplog.text
    logits = teacher.logits(Batch(video_ids=["a"], features=torch.zeros(1, 3), labels=None))
    teacher.close()
    assert torch.sigmoid(logits[0, 3]).item() == pytest.approx(0.9) and torch.sigmoid(logits[0, 1]).item() == \
        pytest.approx(0.2)
    assert torch.isneginf(logits[0, [0, 2, 4]]).all()


@pytest.mark.skipif(not available("onnx", "the ONNX teacher is not tested"), reason="needs the onnx extra")
def test_an_onnx_export_teaches_as_its_checkpoint(tiny_data, trained_dir, tmp_path, capsys):
    export = tmp_path / "teacher_onnx"
    assert cli_main(["export", "--train_dir", str(trained_dir), "--output", str(export)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert locate_teacher(str(export)) == ("onnx", str(export))
    batch = Batch(features=torch.rand(5, 24), video_ids=list("abcde"), labels=None)
    from_onnx = OnnxTeacher(str(export), "cpu").logits(batch)
    from_checkpoint = CheckpointTeacher(latest_checkpoint(str(trained_dir)), torch.device("cpu")).logits(batch)
    torch.testing.assert_close(from_onnx, from_checkpoint, rtol=1e-4, atol=1e-5)
    assert train_cli(student_values(tiny_data, tmp_path / "onnx", teacher=str(export)), capsys)["global_step"] == 4


def test_a_run_teaches_with_its_best_export_when_it_has_one(tiny_data, trained_dir, tmp_path):
    train_dir = tmp_path / "evaluated"
    train(tiny_train_config(tiny_data, train_dir, eval_data_pattern=tiny_data["validate_pattern"], num_epochs=2))
    assert "/export/best/" in run_checkpoint(str(train_dir))
    assert run_checkpoint(str(trained_dir)) == latest_checkpoint(str(trained_dir))


def test_config_problems_are_listed_together(tiny_data, trained_dir, tmp_path):
    with pytest.raises(ConfigError) as raised:
        config_from_dict(TrainConfig, student_values(tiny_data, tmp_path, teacher=str(tmp_path / "nowhere"),
                                                     distill_weight=1.5, distill_temperature=0), checks=train_config_problems)
    problems = "\n".join(raised.value.problems)
    assert "--distill_weight must be at most 1" in problems and "--distill_temperature must be above 0" in problems
    assert "nowhere: no such file or directory" in problems

    with pytest.raises(ConfigError) as raised:
        config_from_dict(TrainConfig, student_values(tiny_data, tmp_path, teacher=str(trained_dir), num_classes=13,
                                                     feature_names="mean_rgb", feature_sizes="16"), checks=train_config_problems)
    problems = "\n".join(raised.value.problems)
    assert "predicts 12 classes, the student --num_classes 13" in problems
    assert "reads video-level mean_rgb,mean_audio (16,8), the student's batches carry video-level mean_rgb (16)" \
        in problems and "--output_format jsonl" in problems

    with pytest.raises(ConfigError, match="--distill_temperature without --teacher: distillation needs a teacher"):
        config_from_dict(TrainConfig, student_values(tiny_data, tmp_path, distill_temperature=2), checks=train_config_problems)


def test_resuming_with_another_teacher_or_weight_is_refused(tiny_data, trained_dir, teacher_jsonl, tmp_path, capsys):
    values = student_values(tiny_data, tmp_path / "run", teacher=str(trained_dir))
    train_cli(values, capsys)
    for changed in ({"distill_weight": 0.2}, {"teacher": teacher_jsonl}, {"teacher": None}):
        flags = as_flags({**values, "max_steps": 8, **changed})
        assert cli_main(["train", *flags]) == 1
        err = capsys.readouterr().err
        assert "was trained with different distillation settings" in err
        assert f"--{next(iter(changed))}: checkpoint has" in err
    assert train_cli({**values, "max_steps": 8}, capsys)["global_step"] == 8


def test_distillation_losses_vanish_in_gradient_where_student_matches_teacher():
    torch.manual_seed(0)
    teacher = torch.randn(4, NUM_CLASSES)
    for kind in ("binary", "softmax"):
        for temperature in (1.0, 3.0):
            student = teacher.clone().requires_grad_(True)
            distillation_loss(student, teacher, temperature, kind).backward()
            assert student.grad.abs().max() < 1e-6
    # A teacher logit of -inf (a class a top-k file leaves out) is probability 0: the loss stays finite.
    teacher[:, 0] = float("-inf")
    for kind in ("binary", "softmax"):
        assert torch.isfinite(distillation_loss(torch.randn(4, NUM_CLASSES), teacher, 2.0, kind))


def test_the_task_mixes_the_losses_by_weight_and_keeps_the_label_metrics():
    class FixedTeacher:
        source, mode = "fixed", "streamed"

        def logits(self, batch):
            return torch.zeros(2, 3)

    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 1.0, -2.0]])
    output = {"logits": logits, "predictions": torch.sigmoid(logits)}
    batch = Batch(labels=torch.tensor([[True, False, False], [False, True, False]]), video_ids=["a", "b"],
                  features=torch.zeros(2, 3))
    label_task = VideoTask(create_loss("CrossEntropyLoss"), 3)
    label_loss = label_task.loss(output, batch)
    distill = distillation_loss(logits, torch.zeros(2, 3), 2.0)
    task = DistillationTask(label_task, FixedTeacher(), 0.25, 2.0)
    assert task.loss(output, batch).item() == pytest.approx(0.75 * label_loss.item() + 0.25 * distill.item())
    assert task.metric_names == label_task.metric_names
    scores = task.batch_metrics(output["predictions"], batch)
    assert scores["distill_loss"] == pytest.approx(distill.item()) and "gap" in scores
    assert probability_logits(torch.tensor([0.0, 0.5, 1.0])).tolist()[:2] == [float("-inf"), 0.0]


@pytest.mark.integration
def test_two_torchrun_processes_distill_from_a_run(tiny_data, trained_dir, tmp_path):
    values = student_values(tiny_data, tmp_path / "run", teacher=str(trained_dir), batch_size=32)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "yt8m",
               "train", *as_flags(values)]
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["processes"] == 2 and summary["global_step"] == 4
    assert "distilling from" in done.stderr


def test_a_teacher_task_on_the_shared_head_trains_as_single_task_distillation(tiny_data, teacher_jsonl, tmp_path,
                                                                               capsys):
    """tasks [main (weight 1 - W), a teacher task (weight W) on main's head] is --teacher with --distill_weight W:
    the same weights after training, through the CLI; the teacher task is validated on the records' labels."""
    single = train_cli(student_values(tiny_data, tmp_path / "single", teacher=teacher_jsonl, distill_weight=0.7,
                                      distill_temperature=2), capsys)
    config = student_values(tiny_data, tmp_path / "tasks", eval_data_pattern=tiny_data["validate_pattern"], tasks=[
        {"name": "main", "weight": 0.3},
        {"name": "soft", "label_source": "teacher", "teacher": teacher_jsonl, "head": "shared", "weight": 0.7,
         "distill_temperature": 2, "validate": True}])
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump(config))
    assert cli_main(["train", "--config", str(tmp_path / "tasks.yaml")]) == 0, capsys.readouterr().err
    tasks = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert tasks["global_step"] == single["global_step"] == 4
    single_weights = load_checkpoint(final_checkpoint(str(tmp_path / "single"))).model
    task_weights = load_checkpoint(final_checkpoint(str(tmp_path / "tasks"))).model
    assert [tensor.shape for tensor in single_weights.values()] == [tensor.shape for tensor in task_weights.values()]
    for single_tensor, task_tensor in zip(single_weights.values(), task_weights.values()):
        torch.testing.assert_close(task_tensor, single_tensor, rtol=1e-5, atol=1e-6)
    metrics = json.loads(next((tmp_path / "tasks" / "eval").glob("metrics-*.json")).read_text())
    assert metrics["soft/gap"] == metrics["main/gap"]  # one head, judged on the same labels


def test_teacher_task_problems_are_named(tiny_data, trained_dir, tmp_path, capsys):
    base = student_values(tiny_data, tmp_path / "run", num_epochs=1, max_steps=None)
    for tasks, expected in [
            ([{"name": "main"}, {"name": "soft", "label_source": "teacher"}], "label_source teacher needs teacher"),
            ([{"name": "main"}, {"name": "soft", "teacher": str(trained_dir)}], "but label_source is 'labels'"),
            ([{"name": "main"}, {"name": "soft", "label_source": "teacher", "teacher": str(trained_dir),
              "num_classes": NUM_CLASSES + 1}],
             f"task soft: teacher {trained_dir} predicts {NUM_CLASSES} classes, the student num_classes "
             f"{NUM_CLASSES + 1}"),
            ([{"name": "main"}, {"name": "soft", "label_source": "teacher", "teacher": str(tmp_path / "nowhere")}],
             f"task soft: teacher {tmp_path / 'nowhere'}: no such file or directory")]:
        (tmp_path / "tasks.yaml").write_text(yaml.safe_dump({**base, "tasks": tasks}))
        assert cli_main(["train", "--config", str(tmp_path / "tasks.yaml")]) == 1
        assert expected in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    flags = as_flags(student_values(tiny_data, tmp_path / "run", teacher=str(trained_dir)))
    assert cli_main(["train", *flags, "--aux_vertical_weight", "0.1", "--vocabulary_file", "v.csv"]) == 1
    assert "with tasks, the teacher is a task of its own (label_source: teacher" in capsys.readouterr().err

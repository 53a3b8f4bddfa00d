"""The Python API with components given as objects (classes, functions, instances) and configs given as objects,
YAML paths or dicts: what config.yaml records, what other processes find, and the one-line refusals."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import yt8m
from yt8m.models.registry import MODELS
from yt8m.tasks.metrics import METRICS
from yt8m.training.config import ScheduleConfig, TrainConfig

MYRESEARCH = '''
"""A user's research module: a BaseModel, a loss with an argument and a metric with one."""

from dataclasses import dataclass

import torch
from torch import nn

import yt8m


@dataclass(frozen=True)
class ResearchHParams:
    l2_penalty: float = 1e-8
    research_width: int = 8


class ResearchMLP(yt8m.BaseModel):
    def __init__(self, feature_size: int, num_classes: int, hparams: ResearchHParams):
        super().__init__(feature_size, num_classes, hparams)
        self.hidden = nn.Linear(feature_size, hparams.research_width)
        self.out = nn.Linear(hparams.research_width, num_classes)

    def compute_logits(self, features, num_frames=None):
        return self.out(torch.relu(self.hidden(features)))

    def penalized_weights(self):
        return [self.out.weight]


def scaled_loss(output, labels, label_weights=None, scale: float = 1.0):
    terms = nn.functional.binary_cross_entropy_with_logits(output["logits"].float(), labels.float(), reduction="none")
    return scale * terms.sum(dim=1).mean()


class Coverage:
    """The share of videos whose top class is one of their labels above `threshold`."""

    higher_is_better = True

    def __init__(self, num_classes: int, threshold: float = 0.5):
        self.threshold, self.hits, self.videos = threshold, 0, 0

    def update(self, predictions, labels):
        top = predictions.argmax(axis=1)
        rows = range(len(predictions))
        self.hits += int(((predictions[rows, top] >= self.threshold) & (labels[rows, top] > 0)).sum())
        self.videos += len(predictions)

    def compute(self):
        return self.hits / self.videos if self.videos else 0.0

    def merge(self, other):
        self.hits, self.videos = self.hits + other.hits, self.videos + other.videos
'''
FEATURES = {"feature_names": "clip", "feature_sizes": "8", "num_classes": 2}


def write_shards(folder: Path) -> dict[str, str]:
    """Tiny separable data: train and validate shards of 2 classes, 8 features."""
    rng = np.random.default_rng(0)
    patterns = {}
    for split, count in (("train", 64), ("validate", 32)):
        videos = [{"id": f"{split}{i}", "labels": [i % 2], "features": {"clip": rng.normal(3 * (i % 2), 1, 8)}}
                  for i in range(count)]
        patterns[split] = str(folder / f"{split}.tfrecord")
        yt8m.write_videos(patterns[split], videos)
    return patterns


@pytest.fixture
def myresearch(tmp_path, monkeypatch):
    """The user's module, importable here (sys.path) and in child processes (PYTHONPATH)."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "myresearch.py").write_text(MYRESEARCH)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    import myresearch as module
    yield module
    sys.modules.pop("myresearch", None)


@pytest.mark.integration
def test_objects_given_to_train_are_recorded_by_import_path_and_the_workflow_reads_them(myresearch, tmp_path):
    data = write_shards(tmp_path)
    run = str(tmp_path / "run")
    result = yt8m.train(model=myresearch.ResearchMLP, research_width=4,
                        label_loss=functools.partial(myresearch.scaled_loss, scale=0.5),
                        metrics=[myresearch.Coverage(num_classes=2, threshold=0.3)], best_metric=myresearch.Coverage,
                        train_data_pattern=data["train"], eval_data_pattern=data["validate"], train_dir=run,
                        num_epochs=2, batch_size=16, base_learning_rate=0.1, **FEATURES)
    recorded = yaml.safe_load(Path(run, "config.yaml").read_text())
    assert recorded["model"]["name"] == "myresearch:ResearchMLP"
    assert recorded["model"]["hparams"]["research_width"] == 4
    assert recorded["loss"] == {"name": "myresearch:scaled_loss", "hparams": {"scale": 0.5}}
    assert recorded["validation"]["metrics"] == ["myresearch:Coverage(threshold=0.3)"]
    assert recorded["validation"]["best_metric"] == "myresearch:Coverage"
    assert result["global_step"] == 8
    model = result.model()
    assert isinstance(model, myresearch.ResearchMLP) and model.hidden.out_features == 4

    metrics = yt8m.evaluate(train_dir=run, eval_data_pattern=data["validate"])
    assert metrics["myresearch:Coverage(threshold=0.3)"] > 0.9
    predictions = str(tmp_path / "predictions.csv")
    assert yt8m.predict(train_dir=run, input_data_pattern=data["validate"], output_file=predictions)["videos"] == 32
    assert yt8m.score(predictions=predictions, labels=data["validate"], num_classes=2)["hit_at_one"] > 0.9
    exported = yt8m.export(train_dir=run, output=str(tmp_path / "export"))
    assert os.path.exists(exported["model_file"])
    both = yt8m.ensemble(inputs=[run, str(tmp_path / "export")], input_data_pattern=data["validate"],
                         output_file=str(tmp_path / "ensemble.csv"))
    assert both["videos"] == 32

    study = str(tmp_path / "study")
    summary = yt8m.tune({"train": {"model": myresearch.ResearchMLP, "label_loss": myresearch.scaled_loss,
                                   "train_data_pattern": data["train"], "eval_data_pattern": data["validate"],
                                   "num_epochs": 1, "batch_size": 16, "num_readers": 0, **FEATURES},
                         "search": {"base_learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
                         "objective": {"metric": "gap", "direction": "maximize"},
                         "tune": {"study_dir": study, "n_startup_trials": 1}}, n_trials=2, n_jobs=2)
    assert summary["failed_jobs"] == [] and summary["best_value"] is not None
    trained = yaml.safe_load(Path(study, "tune.yaml").read_text())["train"]
    assert trained["model"] == "myresearch:ResearchMLP" and trained["label_loss"] == "myresearch:scaled_loss"
    assert sorted(yt8m.tune_report(study_dir=study)["best_params"]) == ["base_learning_rate"]


@pytest.mark.parametrize("form", ["object", "path", "dict"])
def test_config_is_an_object_a_yaml_path_or_a_dict_alike(form, tmp_path):
    settings = {"num_epochs": -1, "batch_size": 8}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(settings))
    config = {"object": TrainConfig(schedule=ScheduleConfig(num_epochs=-1, batch_size=8)), "path": str(path),
              "dict": settings}[form]
    with pytest.raises(ValueError) as raised:
        yt8m.train(config, modle="MoeModel")
    for problem in ("--num_epochs must be at least 1, got -1", "unknown field 'modle'"):
        assert problem in str(raised.value)


def test_a_config_of_another_kind_names_what_config_takes():
    with pytest.raises(ValueError, match="config must be a PredictConfig, a YAML file's path or a dict, got int"):
        yt8m.predict(3)


def test_tune_takes_a_dict_and_names_its_problems_as_one_error():
    with pytest.raises(ValueError, match=r"tune.yaml \(the config dict\): .*unknown section 'serach'"):
        yt8m.tune({"train": {"num_classes": 2}, "serach": {}})


def test_a_component_known_to_this_process_only_is_warned_at_training_and_refused_for_jobs(tmp_path, caplog):
    data = write_shards(tmp_path)

    class LocalMLP(nn.Module):
        def __init__(self, feature_size: int, num_classes: int, local_width: int = 4):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(feature_size, local_width), nn.ReLU(),
                                        nn.Linear(local_width, num_classes))

        def forward(self, features):
            return self.layers(features)

    try:
        with caplog.at_level(logging.WARNING, logger="yt8m.api"):
            yt8m.train(model=LocalMLP, train_data_pattern=data["train"], train_dir=str(tmp_path / "run"),
                       num_epochs=1, batch_size=32, **FEATURES)
        warned = [record.getMessage() for record in caplog.records if record.name == "yt8m.api"]
        assert len(warned) == 1 and "model LocalMLP (defined in a function): known to this process only" in warned[0]
        assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["model"]["name"] == "LocalMLP"
        with pytest.raises(ValueError, match="model LocalMLP .* known to this process only, and n_jobs runs in 2 "
                                             "processes"):
            yt8m.tune({"train": {"model": LocalMLP}}, n_jobs=2)
    finally:
        MODELS.remove("LocalMLP")


def test_a_model_registered_in_main_is_warned_at_training_time(tmp_path):
    data = write_shards(tmp_path)
    script = tmp_path / "notebook.py"
    script.write_text(textwrap.dedent(f'''
        import logging
        from torch import nn
        import yt8m

        @yt8m.register_model
        class NotebookAttn(nn.Module):
            def __init__(self, feature_size: int, num_classes: int):
                super().__init__()
                self.out = nn.Linear(feature_size, num_classes)

            def forward(self, features):
                return self.out(features)

        logging.basicConfig(level=logging.WARNING)
        print("training", flush=True)
        yt8m.train(model="NotebookAttn", train_data_pattern={data["train"]!r}, train_dir={str(tmp_path / "run")!r},
                   num_epochs=1, batch_size=32, feature_names="clip", feature_sizes="8", num_classes=2)
    '''))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    at_training = [line for line in done.stderr.splitlines() if "the run records it by a name" in line]
    assert len(at_training) == 1 and "model NotebookAttn (defined in __main__)" in at_training[0]


def test_tune_jobs_from_a_script_without_a_main_guard_fail_in_one_line(tmp_path):
    script = tmp_path / "search.py"
    script.write_text(textwrap.dedent('''
        import yt8m

        yt8m.tune({"train": {"num_classes": 2}}, n_jobs=2)
    '''))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{script}:4" in lines[0] and 'if __name__ == "__main__":' in lines[0]


def test_a_guarded_call_is_not_refused(tmp_path):
    import ast

    from yt8m.api.main_guard import _is_main_guard

    guarded = ast.parse('if __name__ == "__main__":\n    pass\n').body[0]
    reversed_guard = ast.parse('if "__main__" == __name__:\n    pass\n').body[0]
    other = ast.parse('if __name__ == "other":\n    pass\n').body[0]
    assert _is_main_guard(guarded) and _is_main_guard(reversed_guard) and not _is_main_guard(other)


class Threshold:
    higher_is_better = True

    def __init__(self, num_classes: int, threshold: float = 0.5):
        self.cut = threshold

    def update(self, predictions, labels): ...

    def compute(self): return 0.0

    def merge(self, other): ...


def test_an_instance_whose_arguments_cannot_be_read_back_is_refused_in_one_line():
    with pytest.raises(ValueError, match="a Threshold instance: its arguments cannot be read back .*threshold"):
        METRICS.named(Threshold(num_classes=2, threshold=0.2))
    with pytest.raises(ValueError, match="a Linear instance as a model: a run builds its model afresh: pass the model"):
        MODELS.named(nn.Linear(2, 2))
    assert METRICS.named(Threshold) == (f"{__name__}:Threshold", {})


def test_train_returns_a_dict_with_the_model(tmp_path):
    data = write_shards(tmp_path)
    result = yt8m.train(train_data_pattern=data["train"], train_dir=str(tmp_path / "run"), num_epochs=1,
                        batch_size=32, **FEATURES)
    assert isinstance(result, dict) and result["global_step"] == 2
    assert result.model()(torch.rand(3, 8))["predictions"].shape == (3, 2)


def test_a_class_defined_again_in_main_replaces_the_old_one_under_its_name():
    def defined() -> type:
        return type("Cell", (Threshold,), {"__module__": "__main__"})

    first, second = defined(), defined()
    try:
        assert METRICS.named(first) == ("Cell", {})
        assert METRICS.named(second) == ("Cell", {}) and METRICS.get("Cell").cls is second
    finally:
        METRICS.remove("Cell")

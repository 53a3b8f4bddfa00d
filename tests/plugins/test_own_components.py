"""Components of one's own across process boundaries, none of them in the package: a module in the working directory
named by import path (`--model mymodels:MLP`), read back by `yt8m eval`, `predict` and `export` in new processes,
by tune's job processes and torchrun's ranks, beside reader workers on features of one's own; entry points of a
package found without pip; and a model registered from a script through the Python API.

Each `yt8m` runs in a subprocess whose working directory holds the module; PYTHONPATH is removed, so that the module
is found the way a user's is: by the `yt8m` script's working-directory entry, or `python -m`'s.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import yaml

from conftest import REPO_ROOT
from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, tiny_data  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

YT8M_SCRIPT = Path(sys.executable).parent / "yt8m"  # the console script: only it depends on the cwd entry
FEATURES = ["--feature_names", "mean_rgb,mean_audio", "--feature_sizes", ",".join(map(str, FEATURE_SIZES)),
            "--num_classes", str(NUM_CLASSES)]

MYMODELS = '''
"""A user's module: a model, a loss with an argument and a metric, none of them importing yt8m."""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, feature_size: int, num_classes: int, mlp_hidden: int = 32):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(feature_size, mlp_hidden), nn.ReLU(), nn.Linear(mlp_hidden, num_classes))

    def forward(self, features):
        return self.layers(features)


def my_loss(output, labels, label_weights=None, my_arg: float = 1.0):
    """my_arg times the binary cross-entropy summed over classes, averaged over videos."""
    terms = nn.functional.binary_cross_entropy_with_logits(output["logits"].float(), labels.float(), reduction="none")
    return my_arg * terms.sum(dim=1).mean()


class MicroF1:
    higher_is_better = True

    def __init__(self, num_classes: int, threshold: float = 0.5):
        self.threshold, self.tp, self.fp, self.fn = threshold, 0, 0, 0

    def update(self, predictions, labels):
        predicted, labelled = predictions >= self.threshold, labels > 0
        self.tp += int((predicted & labelled).sum())
        self.fp += int((predicted & ~labelled).sum())
        self.fn += int((~predicted & labelled).sum())

    def compute(self):
        total = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / total if total else 0.0

    def merge(self, other):
        self.tp, self.fp, self.fn = self.tp + other.tp, self.fp + other.fp, self.fn + other.fn
'''
OWN = ["--model", "mymodels:MLP", "--mlp_hidden", "16", "--label_loss", "mymodels:my_loss", "--my_arg", "0.5",
       "--metrics", "mymodels:MicroF1", "--best_metric", "mymodels:MicroF1"]
METRIC = "mymodels:MicroF1"


def environment(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def run(args: list[str], cwd: Path, script: bool = False, env: Optional[dict] = None,
        prefix: Optional[list[str]] = None) -> subprocess.CompletedProcess:
    """`yt8m ARGS` in `cwd`: the console script, `python -m yt8m`, or under `prefix` (torchrun)."""
    command = [str(YT8M_SCRIPT)] if script else [*(prefix or [sys.executable]), "-m", "yt8m"]
    return subprocess.run(command + args, cwd=cwd, env=env or environment(), capture_output=True, text=True,
                          timeout=300)


def succeeded(done: subprocess.CompletedProcess) -> dict:
    """The one JSON line a command prints."""
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    return json.loads(lines[0])


def metrics_file(train_dir: Path, step: int) -> dict:
    return json.loads((train_dir / "eval" / f"metrics-{step:08d}.json").read_text())


@pytest.fixture
def user_dir(tmp_path) -> Path:
    (tmp_path / "mymodels.py").write_text(MYMODELS)
    return tmp_path


@pytest.fixture(scope="module")
def trained_run(tiny_data, tmp_path_factory) -> dict:  # noqa: F811  (tiny_data: the fixture)
    """A run of the user's model, loss and metric, trained by the console script in the module's folder, and the
    metrics of its final validation (read before anything else writes the file)."""
    user_dir = tmp_path_factory.mktemp("user")
    (user_dir / "mymodels.py").write_text(MYMODELS)
    summary = succeeded(run(["train", "--train_data_pattern", tiny_data["train_pattern"], "--eval_data_pattern",
                             tiny_data["validate_pattern"], "--train_dir", "run", *FEATURES, *OWN,
                             "--batch_size", "64", "--num_epochs", "3", "--num_readers", "0", "--seed", "1"],
                            user_dir, script=True))
    train_dir = user_dir / "run"
    return {"dir": user_dir, "train_dir": train_dir, "summary": summary,
            "validation": metrics_file(train_dir, summary["global_step"])}


def test_the_run_records_the_import_paths_and_a_new_process_evaluates_it_as_trained(tiny_data, trained_run):  # noqa: F811
    summary, validation = trained_run["summary"], trained_run["validation"]
    assert summary["best_metric"] == METRIC and summary["best_value"] == validation[METRIC]
    config = yaml.safe_load((trained_run["train_dir"] / "config.yaml").read_text())
    assert config["model"]["name"] == "mymodels:MLP" and config["model"]["hparams"]["mlp_hidden"] == 16
    assert config["loss"] == {"name": "mymodels:my_loss", "hparams": {"my_arg": 0.5}}
    assert config["validation"]["metrics"] == [METRIC] and config["validation"]["best_metric"] == METRIC

    evaluated = succeeded(run(["eval", "--train_dir", "run", "--eval_data_pattern", tiny_data["validate_pattern"],
                               "--run_once"], trained_run["dir"]))
    assert evaluated["global_step"] == summary["global_step"]
    for key in ("gap", "loss", METRIC):
        assert evaluated[key] == pytest.approx(validation[key], abs=1e-6), key

    succeeded(run(["predict", "--train_dir", "run", "--input_data_pattern", tiny_data["validate_pattern"],
                   "--output_format", "jsonl", "--top_k", str(NUM_CLASSES), "--output_file", "validate.jsonl"],
                  trained_run["dir"]))
    probabilities, labels = predicted_and_labelled(trained_run["dir"] / "validate.jsonl", tiny_data["validate_pattern"])
    # The metric and the loss's argument reached the new process: MicroF1 recounted from the predictions, and half
    # the cross-entropy (my_arg 0.5, not its default 1).
    predicted, labelled = probabilities >= 0.5, labels
    tp, fp, fn = (predicted & labelled).sum(), (predicted & ~labelled).sum(), (~predicted & labelled).sum()
    assert evaluated[METRIC] == pytest.approx(2 * tp / (2 * tp + fp + fn), abs=1e-12)
    cross_entropy = -(labels * np.log(probabilities) + ~labels * np.log1p(-probabilities)).sum(axis=1).mean()
    assert evaluated["loss"] == pytest.approx(0.5 * cross_entropy, rel=1e-4)


def predicted_and_labelled(jsonl: Path, pattern: str) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, labels) [videos, classes] of `predict --output_format jsonl` over every class, videos in the
    order of the shards' labels."""
    import yt8m

    rows = {}
    for line in jsonl.read_text().splitlines():
        row = json.loads(line)
        dense = np.zeros(NUM_CLASSES)
        dense[row["class_indexes"]] = row["predictions"]
        rows[row["video_id"]] = dense
    ids, labels = [], []
    for batch in yt8m.read_videos(pattern, feature_names="mean_rgb,mean_audio",
                                  feature_sizes=",".join(map(str, FEATURE_SIZES)), num_classes=NUM_CLASSES):
        ids += batch.video_ids
        labels.append(batch.labels.numpy())
    assert sorted(ids) == sorted(rows)
    return np.stack([rows[video] for video in ids]), np.concatenate(labels)


def test_the_run_exports_and_its_export_predicts(tiny_data, trained_run):  # noqa: F811
    pytest.importorskip("onnxruntime", reason="yt8m export and predict --model need the onnx extra")
    pytest.importorskip("onnx", reason="yt8m export needs the onnx extra")
    exported = succeeded(run(["export", "--train_dir", "run", "--output", "serving"], trained_run["dir"]))
    # export runs the ONNX graph against the user's module on sample inputs: its largest difference
    assert exported["model"] == "mymodels:MLP" and exported["verified_max_abs_diff"] < 1e-5
    predicted = succeeded(run(["predict", "--model", "serving", "--input_data_pattern", tiny_data["test_pattern"],
                               "--output_file", "onnx.csv"], trained_run["dir"]))
    assert predicted["videos"] == 48 and predicted["global_step"] == trained_run["summary"]["global_step"]
    rows = (trained_run["dir"] / "onnx.csv").read_text().splitlines()[1:]
    assert len(rows) == 48 and all(len(row.split(",")[1].split()) == 2 * NUM_CLASSES for row in rows)


def test_tune_jobs_search_the_models_hyper_parameter_for_the_metric(tiny_data, user_dir):  # noqa: F811
    tuning = {"train": {"train_data_pattern": tiny_data["train_pattern"], "eval_data_pattern":
                        tiny_data["validate_pattern"], "model": "mymodels:MLP", "label_loss": "mymodels:my_loss",
                        "my_arg": 0.5, "feature_names": "mean_rgb,mean_audio",
                        "feature_sizes": ",".join(map(str, FEATURE_SIZES)), "num_classes": NUM_CLASSES,
                        "batch_size": 64, "num_epochs": 1, "num_readers": 0},
              "search": {"mlp_hidden": {"type": "categorical", "choices": [8, 24]}},
              "objective": {"metric": METRIC},
              "tune": {"study_dir": "study", "n_trials": 2, "n_jobs": 2, "pruner": "none",
                       "enqueue": [{"mlp_hidden": 8}, {"mlp_hidden": 24}]}}
    (user_dir / "tune.yaml").write_text(yaml.safe_dump(tuning))
    summary = succeeded(run(["tune", "--config", "tune.yaml"], user_dir, script=True))
    assert summary["metric"] == METRIC and summary["failed_jobs"] == []
    assert summary["n_trials"]["complete"] == 2
    values = {}
    for trial in sorted((user_dir / "study" / "trials").iterdir()):
        config = yaml.safe_load((trial / "config.yaml").read_text())
        assert config["model"]["name"] == "mymodels:MLP" and config["loss"]["hparams"] == {"my_arg": 0.5}
        step = max(int(path.stem.split("-")[1]) for path in (trial / "eval").glob("metrics-*.json"))
        values[config["model"]["hparams"]["mlp_hidden"]] = metrics_file(trial, step)[METRIC]
    assert set(values) == {8, 24}  # each job trained its own trial's model
    best = max(values, key=values.__getitem__)
    assert summary["best_value"] == pytest.approx(values[best]) and summary["best_params"] == {"mlp_hidden": best}


def own_videos(count: int, first: int, seed: int) -> list[dict]:
    """Videos with one feature of one's own, a 12-d `clip_embedding`: the sum of its classes' centers, plus noise."""
    centers = np.random.default_rng(0).normal(0, 1, (4, 12))
    rng = np.random.default_rng(seed)
    videos = []
    for index in range(count):
        labels = sorted(rng.choice(4, size=int(rng.integers(1, 3)), replace=False).tolist())
        embedding = centers[labels].sum(axis=0) + rng.normal(0, 0.3, 12)
        videos.append({"id": f"v{first + index}", "labels": labels,
                       "features": {"clip_embedding": embedding.astype(np.float32)}})
    return videos


def test_reader_workers_read_features_of_ones_own_for_the_users_model(user_dir):
    import yt8m

    for name, count, first, seed in (("train-0", 96, 0, 1), ("train-1", 96, 96, 2), ("validate-0", 64, 192, 3)):
        assert yt8m.write_videos(str(user_dir / "own" / f"{name}.tfrecord"), own_videos(count, first, seed)) == count
    done = run(["train", "--train_data_pattern", "own/train-*", "--eval_data_pattern", "own/validate-*",
                "--train_dir", "run", "--feature_names", "clip_embedding", "--feature_sizes", "12", "--num_classes",
                "4", *OWN, "--batch_size", "32", "--num_epochs", "4", "--base_learning_rate", "0.05",
                "--num_readers", "2", "--seed", "1"], user_dir)
    summary = succeeded(done)
    assert "reading with 2 worker processes (as asked)" in done.stderr
    assert summary["examples"] == 4 * 192  # every video once an epoch, from the two workers together
    assert summary["best_metric"] == METRIC and summary["best_value"] > 0.9  # the classes are learnable


def test_torchrun_ranks_train_the_users_model_and_merge_its_metric(tiny_data, user_dir):  # noqa: F811
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    summary = succeeded(run(["train", "--train_data_pattern", tiny_data["train_pattern"], "--eval_data_pattern",
                             tiny_data["validate_pattern"], "--train_dir", "run", *FEATURES, *OWN,
                             "--batch_size", "32", "--num_epochs", "2", "--num_readers", "0"],
                            user_dir, prefix=torchrun))
    assert summary["processes"] == 2 and summary["best_metric"] == METRIC
    validation = metrics_file(user_dir / "run", summary["global_step"])  # rank 0's, over every validation video
    # Each rank evaluates one of the two shards; rank 0 merges the other's MicroF1 (pickled) into its own.
    merged = succeeded(run(["eval", "--train_dir", "run", "--eval_data_pattern", tiny_data["validate_pattern"],
                            "--run_once", "--num_readers", "0"], user_dir, prefix=torchrun))
    assert merged["num_videos"] == 64
    assert merged[METRIC] == pytest.approx(validation[METRIC], abs=1e-12)
    assert merged["gap"] == pytest.approx(validation["gap"], abs=1e-6)


FAKE_PLUGINS = '''
import torch
from torch import nn


class EntryPointModel(nn.Module):
    def __init__(self, feature_size: int, num_classes: int, ep_width: int = 8):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(feature_size, ep_width), nn.ReLU(), nn.Linear(ep_width, num_classes))

    def forward(self, features):
        return self.layers(features)


def ep_loss(output, labels, ep_scale: float = 1.0):
    return ep_scale * nn.functional.binary_cross_entropy_with_logits(output["logits"], labels.float())


class EpMetric:
    """The share of videos whose best guess is a label (Hit@1), as a metric of one's own."""

    higher_is_better = True

    def __init__(self, num_classes: int):
        self.hits, self.videos = 0, 0

    def update(self, predictions, labels):
        self.hits += int(labels[range(len(labels)), predictions.argmax(axis=1)].sum())
        self.videos += len(labels)

    def compute(self):
        return self.hits / self.videos

    def merge(self, other):
        self.hits, self.videos = self.hits + other.hits, self.videos + other.videos
'''


def installed_without_pip(folder: Path, name: str, groups: dict[str, dict[str, str]]) -> None:
    """A package's metadata as pip would leave it beside its modules: NAME-0.1.dist-info with its entry points."""
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{point} = {path}\n" for point, path in points.items()) + "\n"
        for group, points in groups.items()))


def test_entry_points_of_a_package_are_names_flags_and_known_names(tiny_data, tmp_path):  # noqa: F811
    site = tmp_path / "site"
    site.mkdir()
    (site / "fake_plugins.py").write_text(FAKE_PLUGINS)
    installed_without_pip(site, "fake_plugins", {"yt8m.models": {"EntryPointModel": "fake_plugins:EntryPointModel"},
                                                 "yt8m.losses": {"ep_loss": "fake_plugins:ep_loss"},
                                                 "yt8m.metrics": {"ep_metric": "fake_plugins:EpMetric"}})
    env = environment(PYTHONPATH=str(site))
    work = tmp_path / "work"  # the package is found through its metadata, not the working directory
    work.mkdir()
    shown = run(["train", "--model", "EntryPointModel", "--label_loss", "ep_loss", "--help"], work, env=env)
    assert shown.returncode == 0 and "--model.ep_width INT" in shown.stdout and "--loss.ep_scale FLOAT" in shown.stdout
    unknown = run(["train", "--model", "EntryPointModl", "--train_data_pattern", "x"], work, env=env)
    assert unknown.returncode == 1
    assert "did you mean 'EntryPointModel'?" in unknown.stderr
    known = unknown.stderr.split("(known: ", 1)[1].split(";")[0].split(", ")
    assert "EntryPointModel" in known and "MoeModel" in known

    summary = succeeded(run(["train", "--train_data_pattern", tiny_data["train_pattern"], "--eval_data_pattern",
                             tiny_data["validate_pattern"], "--train_dir", "run", *FEATURES,
                             "--model", "EntryPointModel", "--ep_width", "4", "--label_loss", "ep_loss",
                             "--ep_scale", "2", "--best_metric", "ep_metric", "--batch_size", "64",
                             "--num_epochs", "1", "--num_readers", "0"], work, env=env))
    config = yaml.safe_load((work / "run" / "config.yaml").read_text())
    assert config["model"]["name"] == "EntryPointModel" and config["model"]["hparams"]["ep_width"] == 4
    assert config["loss"] == {"name": "ep_loss", "hparams": {"ep_scale": 2.0}}
    validation = metrics_file(work / "run", summary["global_step"])
    assert summary["best_metric"] == "ep_metric" and summary["best_value"] == validation["ep_metric"]
    assert validation["ep_metric"] == pytest.approx(validation["hit_at_one"])  # the metric computed what it says


def test_the_example_package_trains_frames_by_its_entry_point_names(tmp_path):
    """examples/plugins through its own pyproject.toml's entry points (as `pip install examples/plugins` declares
    them): AttentionPooling on frames, asymmetric_loss with an argument, micro_f1 picking the best model."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib (Python 3.11+) reads pyproject.toml")
    from yt8m.data.making.synthetic import write_synthetic

    example = REPO_ROOT / "examples" / "plugins"
    with open(example / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    site = tmp_path / "site"
    site.mkdir()
    installed_without_pip(site, "yt8m_example_plugins", project["entry-points"])
    env = environment(PYTHONPATH=os.pathsep.join([str(site), str(example)]))
    write_synthetic(str(tmp_path / "data"), kind="frame", num_classes=NUM_CLASSES, train_videos=96,
                    validate_videos=32, test_videos=8, shards=1, feature_sizes=FEATURE_SIZES, min_frames=4,
                    max_frames=12, seed=5)
    summary = succeeded(run(["train", "--train_data_pattern", "data/frame/train-*", "--eval_data_pattern",
                             "data/frame/validate-*", "--train_dir", "run", "--frame_features", "--feature_names",
                             "rgb,audio", "--feature_sizes", ",".join(map(str, FEATURE_SIZES)), "--num_classes",
                             str(NUM_CLASSES), "--model", "AttentionPooling", "--attention_hidden", "8",
                             "--label_loss", "asymmetric_loss", "--asl_gamma_neg", "2", "--best_metric",
                             "micro_f1(threshold=0.3)", "--batch_size", "32", "--num_epochs", "1",
                             "--num_readers", "0"], tmp_path, env=env))
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["model"] == {"name": "AttentionPooling", "hparams": {"l2_penalty": 1e-8, "attention_hidden": 8},
                               "trunk_hidden_sizes": [], "input_l2_normalize": True}
    assert config["loss"] == {"name": "asymmetric_loss",
                              "hparams": {"asl_gamma_neg": 2.0, "asl_gamma_pos": 0.0, "asl_clip": 0.05}}
    validation = metrics_file(tmp_path / "run", summary["global_step"])
    assert summary["best_metric"] == "micro_f1(threshold=0.3)"
    assert summary["best_value"] == validation["micro_f1(threshold=0.3)"] and 0 < summary["best_value"] <= 1
    assert math.isfinite(validation["loss"])


API_MODELS = '''
import yt8m
from torch import nn


@yt8m.register_model
class TinyNet(nn.Module):
    def __init__(self, feature_size: int, num_classes: int, tiny_hidden: int = 8):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(feature_size, tiny_hidden), nn.ReLU(),
                                    nn.Linear(tiny_hidden, num_classes))

    def forward(self, features):
        return self.layers(features)
'''


def test_a_model_registered_in_a_scripts_module_is_read_back_by_yt8m_eval(tiny_data, tmp_path):  # noqa: F811
    (tmp_path / "apimodels.py").write_text(API_MODELS)
    (tmp_path / "train_api.py").write_text(textwrap.dedent(f'''
        import json
        import yt8m
        import apimodels  # registers TinyNet

        print(json.dumps(yt8m.train(model="TinyNet", tiny_hidden=4, train_data_pattern={tiny_data["train_pattern"]!r},
                                    eval_data_pattern={tiny_data["validate_pattern"]!r}, train_dir="run",
                                    feature_names="mean_rgb,mean_audio", feature_sizes="16,8", num_classes=12,
                                    batch_size=64, num_epochs=2, num_readers=0)))
    '''))
    done = subprocess.run([sys.executable, "train_api.py"], cwd=tmp_path, env=environment(), capture_output=True,
                          text=True, timeout=300)
    summary = succeeded(done)
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["model"]["name"] == "apimodels:TinyNet" and config["model"]["hparams"]["tiny_hidden"] == 4
    validation = metrics_file(tmp_path / "run", summary["global_step"])
    evaluated = succeeded(run(["eval", "--train_dir", "run", "--eval_data_pattern", tiny_data["validate_pattern"],
                               "--run_once"], tmp_path))
    assert evaluated["gap"] == pytest.approx(validation["gap"], abs=1e-6)


def test_a_tuning_file_may_list_its_own_metric_in_train_metrics_and_as_the_objective(tmp_path, monkeypatch):
    from yt8m.tuning.space import load_tune_spec

    (tmp_path / "tunemetrics.py").write_text(MYMODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump({
        "train": {"train_data_pattern": "x-*", "eval_data_pattern": "y-*", "metrics": ["tunemetrics:MicroF1"]},
        "search": {"base_learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
        "objective": {"metric": "tunemetrics:MicroF1"}, "tune": {"study_dir": str(tmp_path / "study")}}))
    spec = load_tune_spec(str(path))
    assert spec.train.validation.metrics == ["tunemetrics:MicroF1"]  # listed once, whole

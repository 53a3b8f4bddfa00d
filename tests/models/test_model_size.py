"""Model size: what is counted, the same size measured on the meta device for every model, `yt8m train` logging it
and recording it in the train dir and its exports, `yt8m export` metadata, and --max_model_size_mb refusing a
model over the limit before the train dir is touched."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from torch import nn

from workflow_fixtures import (  # noqa: F401
    NUM_CLASSES,
    as_flags,
    tiny_data,
    tiny_train_config,
    train_config,
    trained_copy,
    trained_dir,
)
from yt8m.cli import main as cli_main
from yt8m.config import config_values
from yt8m.models import create_model
from yt8m.models.model_size import (
    BYTES_PER_MB,
    ModelSize,
    ModelTooLargeError,
    check_model_size,
    config_model_size,
    model_size,
)
from yt8m.training import TrainConfig


def test_parameters_and_buffers_count_four_bytes_each_and_shared_tensors_once():
    linear = nn.Linear(10, 6)
    model = nn.Sequential(linear, nn.BatchNorm1d(6), linear)  # the same Linear twice: its weights count once
    size = model_size(model)
    assert size == ModelSize(parameters=10 * 6 + 6 + 2 * 6, buffer_values=2 * 6 + 1)
    assert size.megabytes == (size.parameters + size.buffer_values) * 4 / 2 ** 20
    assert size.as_dict()["size_mb"] == round(size.megabytes, 6)


def config_for(name: str, **overrides) -> TrainConfig:
    return train_config(**{"model": name, "feature_sizes": "16,8", "num_classes": NUM_CLASSES,
                          "train_data_pattern": "unused", **overrides})


def size_of(config: TrainConfig):
    return config_model_size(config.model, config.features)


def checked_size(config: TrainConfig):
    return check_model_size(config.model, config.features, config.runtime.max_model_size_mb)


def test_the_limit_is_inclusive_and_zero_means_none():
    size = size_of(config_for("MoeModel"))
    assert checked_size(config_for("MoeModel", max_model_size_mb=size.megabytes)) == size
    assert checked_size(config_for("MoeModel", max_model_size_mb=0)) == size
    with pytest.raises(ModelTooLargeError, match=r"--model MoeModel has [\d,]+ parameters, [\d.]+ MB, over "
                                                 r"--max_model_size_mb 1e-05"):
        checked_size(config_for("MoeModel", max_model_size_mb=1e-5))


def test_a_huge_model_is_refused_without_being_built():
    """A MoeModel of 200,000 experts per class over 3,862 classes would take ~3.7 TB: measured in no time."""
    config = config_for("MoeModel", num_classes=3862, feature_sizes="1024,128", moe_num_mixtures=200_000,
                        max_model_size_mb=1024)
    with pytest.raises(ModelTooLargeError, match=r"over --max_model_size_mb 1024"):
        checked_size(config)
    assert size_of(config).megabytes > 3.5e6


def test_train_logs_and_records_the_size_and_the_exports_carry_it(tiny_data, tmp_path, caplog, capsys):
    train_dir = tmp_path / "run"
    config = tiny_train_config(tiny_data, train_dir, num_epochs=1, eval_data_pattern=tiny_data["validate_pattern"],
                               max_model_size_mb=1)
    with caplog.at_level(logging.INFO, logger="yt8m.train"):
        assert cli_main(["train", *as_flags(config_values(config))]) == 0
    size = size_of(config)
    assert f"training MoeModel ({size.describe()})" in caplog.text
    recorded = json.loads((train_dir / "model_size.json").read_text())
    assert recorded == {"model": "MoeModel", **size.as_dict()}
    assert recorded["parameters"] == 24 * NUM_CLASSES * 3 + (24 + 1) * NUM_CLASSES * 2  # gates, experts (2 mixtures)
    exports = [path.parent for path in (train_dir / "export").rglob("metrics.json")]
    assert {path.relative_to(train_dir / "export").parts[0] for path in exports} == {"best", "latest", "final"}
    for export in exports:
        assert json.loads((export / "model_size.json").read_text()) == recorded


def test_onnx_export_metadata_records_the_size(trained_dir, tmp_path, capsys):
    out = tmp_path / "onnx"
    assert cli_main(["export", "--train_dir", str(trained_dir), "--output", str(out)]) == 0
    metadata = json.loads((out / "metadata.json").read_text())
    model = create_model("MoeModel", 24, NUM_CLASSES)
    assert metadata["model_size"] == model_size(model).as_dict()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("existing", [False, True])
def test_a_model_over_the_limit_is_refused_before_the_train_dir_is_touched(tiny_data, trained_copy, tmp_path,
                                                                           capsys, existing):
    train_dir = trained_copy if existing else tmp_path / "new"
    before = snapshot(train_dir) if existing else None
    config = tiny_train_config(tiny_data, train_dir, max_model_size_mb=0.001, start_new_model=True)
    assert cli_main(["train", *as_flags(config_values(config))]) == 1
    error = capsys.readouterr().err
    size = size_of(config)
    assert (f"--model MoeModel has {size.describe()}, over --max_model_size_mb 0.001" in error
            and "Traceback" not in error)
    assert size.megabytes > 0.001
    if existing:
        assert snapshot(train_dir) == before
    else:
        assert not train_dir.exists()


def test_the_limit_is_off_by_default_and_a_negative_one_is_a_flag_error(capsys):
    assert train_config().runtime.max_model_size_mb == 0
    assert BYTES_PER_MB == 2 ** 20
    assert cli_main(["train", "--train_data_pattern", "x", "--max_model_size_mb", "-1"]) == 1
    assert "--max_model_size_mb must be at least 0, got -1.0" in capsys.readouterr().err

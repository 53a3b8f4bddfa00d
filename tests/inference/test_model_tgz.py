"""The starter kit's inference.py model archives: `predict --output_model_tgz` packs the model that predicts (a
checkpoint, or an ONNX export), `predict --input_model_tgz` predicts from such an archive the same bytes; and
train's --log_device_placement is accepted and logged."""

from __future__ import annotations

import json
import logging
import tarfile

import pytest

from workflow_fixtures import as_flags, tiny_data, tiny_train_config, trained_dir  # noqa: F401  (fixtures)
from yt8m import cli
from yt8m.config import config_values


def predict(capsys, data: dict, output, *model: str) -> dict:
    assert cli.main(["predict", "--input_data_pattern", data["test_pattern"], "--output_file", str(output),
                     "--num_readers", "0", *model]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_packed_checkpoint_predicts_the_same_csv(tiny_data, trained_dir, tmp_path, capsys):
    archive = tmp_path / "model.tgz"
    packed = predict(capsys, tiny_data, tmp_path / "direct.csv", "--train_dir", str(trained_dir),
                     "--output_model_tgz", str(archive))
    assert packed["output_model_tgz"] == str(archive)
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["checkpoints/ckpt-00000012.pt", "config.yaml", "model_size.json"]
    unpacked = predict(capsys, tiny_data, tmp_path / "unpacked.csv", "--input_model_tgz", str(archive),
                       "--untar_model_dir", str(tmp_path / "untarred"))
    assert unpacked["checkpoint"] == str(tmp_path / "untarred" / "checkpoints" / "ckpt-00000012.pt")
    assert (tmp_path / "unpacked.csv").read_bytes() == (tmp_path / "direct.csv").read_bytes()
    # The same archive again into the same folder is the same model: allowed.
    predict(capsys, tiny_data, tmp_path / "again.csv", "--input_model_tgz", str(archive),
            "--untar_model_dir", str(tmp_path / "untarred"))


def test_a_packed_onnx_export_predicts_its_csv(tiny_data, trained_dir, tmp_path, capsys):
    assert cli.main(["export", "--train_dir", str(trained_dir), "--output", str(tmp_path / "onnx")]) == 0
    capsys.readouterr()
    archive = tmp_path / "onnx.tgz"
    predict(capsys, tiny_data, tmp_path / "direct.csv", "--model", str(tmp_path / "onnx"),
            "--output_model_tgz", str(archive))
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["metadata.json", "model.onnx"]
    unpacked = predict(capsys, tiny_data, tmp_path / "unpacked.csv", "--input_model_tgz", str(archive),
                       "--untar_model_dir", str(tmp_path / "untarred"))
    assert unpacked["model_file"] == str(tmp_path / "untarred" / "model.onnx")
    assert (tmp_path / "unpacked.csv").read_bytes() == (tmp_path / "direct.csv").read_bytes()


@pytest.mark.parametrize("flags, message", [
    (["--train_dir", "run"], "give exactly one of --train_dir (a checkpoint), --model (an ONNX export) and "
                             "--input_model_tgz"),
    (["--untar_model_dir", "{other}"], "--untar_model_dir {other} holds files the archive does not "
                                       "(checkpoints/ckpt-00000099.pt): give an empty or new folder"),
])
def test_an_archive_is_refused_where_another_model_would_be_read(flags, message, tiny_data, trained_dir, tmp_path,
                                                                  capsys):
    archive, other = tmp_path / "model.tgz", tmp_path / "other"
    (other / "checkpoints").mkdir(parents=True)
    (other / "checkpoints" / "ckpt-00000099.pt").write_bytes(b"an earlier model")
    predict(capsys, tiny_data, tmp_path / "direct.csv", "--train_dir", str(trained_dir), "--output_model_tgz",
            str(archive))
    flags = [flag.format(other=other) for flag in flags]
    assert cli.main(["predict", "--input_data_pattern", tiny_data["test_pattern"], "--output_file",
                     str(tmp_path / "refused.csv"), "--input_model_tgz", str(archive), *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith("yt8m predict: error: ") and message.format(other=other) in err
    assert not (tmp_path / "refused.csv").exists()


def test_log_device_placement_is_accepted_and_logged(tiny_data, tmp_path, caplog):
    config = tiny_train_config(tiny_data, tmp_path / "run", max_steps=1)
    flags = as_flags({name: config_values(config)[name] for name in (
        "train_data_pattern", "train_dir", "model", "feature_names", "feature_sizes", "num_classes", "batch_size",
        "max_steps", "num_readers")})
    with caplog.at_level(logging.INFO, logger="yt8m.train"):
        assert cli.main(["train", *flags, "--log_device_placement"]) == 0
    assert "--log_device_placement is the starter kit's TensorFlow flag: it has no effect here" in caplog.text

"""`yt8m export` and `yt8m predict --model`: ONNX parity with torch for every model (dynamic batch and
frames, padded videos), the metadata, predictions equal to the checkpoint's, and the errors of a bad export."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from workflow_fixtures import NUM_CLASSES, predict_config, tiny_data, train_config, trained_dir  # noqa: F401  (fixtures)
from yt8m.cli import main as cli_main
from yt8m.commands.export import main as export_main
from yt8m.data.making.synthetic import write_synthetic
from yt8m.eval.score import read_predictions_csv, score_files
from yt8m.inference.onnx_export import ExportError, export_onnx, load_exported
from yt8m.inference.predict import run_predict
from yt8m.models import create_model, list_models
from yt8m.models.registry import registered_model
from yt8m.training import train

FEATURE_SIZE = 24
TINY = dict(dbof_cluster_size=32, dbof_hidden_size=16, iterations=5, lstm_cells=16, lstm_layers=2,
            netvlad_cluster_size=4, fv_cluster_size=4, softdbof_cluster_size=16, willow_hidden_size=16,
            nextvlad_cluster_size=4, nextvlad_hidden_size=16, nextvlad_groups=4, deep_hidden_size=16,
            transformer_hidden_size=16, transformer_heads=2, transformer_max_frames=6)
MODEL_CASES = [(name, {}) for name in list_models()] + [
    ("DbofModel", dict(sample_random_frames=False, dbof_add_batch_norm=False, dbof_pooling_method="average")),
    ("LstmModel", dict(video_level_classifier_model="LogisticModel", lstm_layers=1)),
    ("DeepClassifierModel", dict(video_level_classifier_model="GatedMoeModel", deep_hidden_layers=3)),
    ("DeepClassifierModel", dict(video_level_classifier_model="LogisticModel", deep_hidden_layers=0)),
    ("TransformerModel", dict(transformer_pooling="first")),
]
SHAPES = [(1, 1), (2, 9), (7, 40), (6, 5)]  # (batch, frames): neither is fixed in the graph; 5: 2019 segments


def random_inputs(model, batch: int, frames: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Raw features (not normalized); frame-level: uint8 frames as stored, zero-padded videos of random lengths, one
    full, one empty."""
    if not model.frame_level:
        return (torch.randn(batch, FEATURE_SIZE, generator=generator) * 3,)
    num_frames = torch.randint(0, frames + 1, (batch,), generator=generator)
    num_frames[0] = frames
    if batch > 1:
        num_frames[1] = 0
    features = torch.randint(0, 256, (batch, frames, FEATURE_SIZE), generator=generator, dtype=torch.uint8)
    return features * (torch.arange(frames) < num_frames[:, None]).unsqueeze(-1), num_frames


def randomize_batch_norm(model) -> None:
    """Trained-looking running statistics, so that an export in training mode (batch statistics) shows."""
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.normal_()
            module.bias.data.normal_()


@pytest.mark.parametrize("name,hparams", MODEL_CASES, ids=[f"{n}{'-' + '-'.join(h) if h else ''}" for n, h in MODEL_CASES])
def test_onnx_predictions_match_torch_for_every_model(name, hparams, tmp_path):
    torch.manual_seed(0)
    model = create_model(name, FEATURE_SIZE, NUM_CLASSES, **{**TINY, **hparams})
    randomize_batch_norm(model)
    path = str(tmp_path / "model.onnx")
    export_onnx(model.train(), path)  # DbofModel must export its deterministic eval-mode sampling
    onnx.checker.check_model(path, full_check=True)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [value.name for value in session.get_inputs()]
    assert names == (["features", "num_frames"] if model.frame_level else ["features"])
    assert [value.name for value in session.get_outputs()] == ["logits", "predictions"]
    generator = torch.Generator().manual_seed(1)
    model.eval()
    for batch, frames in SHAPES:
        inputs = random_inputs(model, batch, frames, generator)
        with torch.no_grad():
            expected = model(*inputs)
        logits, predictions = session.run(["logits", "predictions"],
                                          {n: t.numpy() for n, t in zip(names, inputs)})
        assert predictions.shape == (batch, NUM_CLASSES)
        assert np.abs(predictions - expected["predictions"].numpy()).max() <= 1e-5
        assert np.abs(logits - expected["logits"].numpy()).max() <= 1e-4


class AttentionPooling(torch.nn.Module):
    """A plain module of one's own: attention over the real frames. `clamped` reads one (zero) frame of a video
    without frames, as yt8m's models do; unclamped, its softmax over no frames (every score -inf) is nan."""

    clamped = True

    def __init__(self, feature_size: int, num_classes: int):
        super().__init__()
        self.score = torch.nn.Linear(feature_size, 1)
        self.out = torch.nn.Linear(feature_size, num_classes)

    def forward(self, features, num_frames):
        counts = num_frames.clamp(min=1) if self.clamped else num_frames
        real = torch.arange(features.shape[1]) < counts[:, None]
        weights = torch.softmax(self.score(features).squeeze(-1).masked_fill(~real, float("-inf")), dim=1)
        return self.out((weights.unsqueeze(-1) * features).sum(dim=1))


class UnmaskedAttentionPooling(AttentionPooling):
    clamped = False


def test_a_frame_model_of_ones_own_masking_its_frames_exports(tmp_path):
    torch.manual_seed(0)
    with registered_model(AttentionPooling):
        model = create_model("AttentionPooling", FEATURE_SIZE, NUM_CLASSES)
    assert export_onnx(model, str(tmp_path / "model.onnx"))["verified_max_abs_diff"] <= 1e-5


def test_an_export_giving_nan_for_the_check_video_without_frames_names_that_video(tmp_path):
    torch.manual_seed(0)
    with registered_model(UnmaskedAttentionPooling):
        model = create_model("UnmaskedAttentionPooling", FEATURE_SIZE, NUM_CLASSES)
    path = tmp_path / "model.onnx"
    with pytest.raises(ExportError) as raised:
        export_onnx(model, str(path))
    message = str(raised.value)
    assert message.startswith(f"{path}: onnxruntime's predictions differ from torch's by nan (tolerance 1e-05) on "
                              "the check's video with 0 frames (video 3 of 4, num_frames 0); torch's own predictions "
                              "for it are nan: a model must give finite outputs for a video without frames: mask "
                              "with num_frames"), message
    assert "\n" not in message


@pytest.fixture(scope="module")
def exported(trained_dir, tmp_path_factory):
    """The trained MoeModel run exported to a directory (OUT/model.onnx, OUT/metadata.json)."""
    output = tmp_path_factory.mktemp("exported") / "moe"
    assert export_main(["--train_dir", str(trained_dir), "--output", str(output)]) == 0
    return output


def read_metadata(path) -> dict:
    with open(path) as fh:
        return json.load(fh)


def test_export_writes_a_checked_model_and_its_metadata(exported, trained_dir):
    assert sorted(p.name for p in exported.iterdir()) == ["metadata.json", "model.onnx"]
    onnx.checker.check_model(str(exported / "model.onnx"), full_check=True)
    meta = read_metadata(exported / "metadata.json")
    assert meta["model"] == meta["model_config"]["model"] == "MoeModel"
    assert meta["model_config"]["moe_num_mixtures"] == 2
    assert (meta["feature_names"], meta["feature_sizes"]) == (["mean_rgb", "mean_audio"], [16, 8])
    assert (meta["frame_features"], meta["max_frames"], meta["num_classes"]) == (False, 300, NUM_CLASSES)
    assert meta["global_step"] == 12
    assert meta["source_checkpoint"] == str(trained_dir / "checkpoints" / "ckpt-00000012.pt")
    assert meta["inputs"] == [{"name": "features", "dtype": "float32", "shape": ["batch", 24]}]
    assert [o["name"] for o in meta["outputs"]] == ["logits", "predictions"]
    assert meta["outputs"][1]["shape"] == ["batch", NUM_CLASSES]
    assert meta["yt8m_version"] and meta["opset"] >= 18


def test_export_of_a_chosen_checkpoint_to_an_onnx_file(trained_dir, tmp_path, capsys):
    checkpoint = trained_dir / "checkpoints" / "ckpt-00000004.pt"
    output = tmp_path / "serving" / "moe_v1.onnx"
    assert cli_main(["export", "--checkpoint", str(checkpoint), "--output", str(output)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model_file"] == str(output) and summary["bytes"] == output.stat().st_size
    assert summary["verified_max_abs_diff"] <= 1e-5
    assert read_metadata(f"{output}.json")["global_step"] == 4


def predict(data: dict, split: str, output, *, model=None, train_dir=None, **options) -> dict:
    return run_predict(predict_config(input_data_pattern=data[f"{split}_pattern"], model=str(model or ""),
                                     train_dir=str(train_dir or ""), output_file=str(output), num_readers=0,
                                     **{"batch_size": 20, **options}))


def assert_same_predictions(onnx_csv, torch_csv, labels) -> None:
    """Same videos in the same order, the same classes, confidences and scores within 1e-5."""
    by_onnx, by_torch = read_predictions_csv(str(onnx_csv), NUM_CLASSES), read_predictions_csv(str(torch_csv), NUM_CLASSES)
    assert list(by_onnx) == list(by_torch)
    for video_id, (classes, confidences) in by_torch.items():
        np.testing.assert_array_equal(by_onnx[video_id][0], classes)
        np.testing.assert_allclose(by_onnx[video_id][1], confidences, atol=1e-5)
    onnx_scores, torch_scores = (score_files(str(path), labels, num_classes=NUM_CLASSES) for path in (onnx_csv, torch_csv))
    assert onnx_scores.keys() == torch_scores.keys()
    for key, value in torch_scores.items():
        assert onnx_scores[key] == pytest.approx(value, abs=1e-5)


def test_predict_with_the_onnx_model_writes_the_checkpoints_csv(exported, trained_dir, tiny_data, tmp_path):
    result = predict(tiny_data, "validate", tmp_path / "onnx.csv", model=exported)
    predict(tiny_data, "validate", tmp_path / "torch.csv", train_dir=trained_dir)
    assert result["videos"] == 64 and result["global_step"] == 12
    assert result["providers"] == ["CPUExecutionProvider"]
    assert_same_predictions(tmp_path / "onnx.csv", tmp_path / "torch.csv", tiny_data["validate_labels"])


def test_jsonl_from_the_onnx_model_converts_to_its_csv(exported, tiny_data, tmp_path, capsys):
    predict(tiny_data, "test", tmp_path / "p.jsonl", model=exported, output_format="jsonl", top_k=5)
    predict(tiny_data, "test", tmp_path / "p.csv", model=exported, top_k=5)
    records = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(records) == 48
    assert all(len(r["class_indexes"]) == len(r["predictions"]) == 5 for r in records)
    capsys.readouterr()
    assert cli_main(["convert-predictions", "--input", str(tmp_path / "p.jsonl"), "--output",
                     str(tmp_path / "converted.csv"), "--top_k", "5"]) == 0
    assert json.loads(capsys.readouterr().out) == {"output_file": str(tmp_path / "converted.csv"), "videos": 48}
    assert (tmp_path / "converted.csv").read_text() == (tmp_path / "p.csv").read_text()


def test_frame_level_lstm_predicts_the_same_through_onnx(tmp_path):
    """The LSTM's export-friendly graph on real padded batches (frame counts 3-20, padded per batch)."""
    written = write_synthetic(str(tmp_path / "data"), kind="frame", num_classes=NUM_CLASSES, train_videos=32,
                              validate_videos=24, test_videos=8, shards=1, feature_sizes=(16, 8),
                              min_frames=3, max_frames=20)
    pattern = str(tmp_path / "data" / "frame" / "{}-*.tfrecord")
    train_dir = tmp_path / "run"
    train(train_config(train_data_pattern=pattern.format("train"), train_dir=str(train_dir), model="LstmModel",
                      frame_features=True, feature_names="rgb,audio", feature_sizes="16,8", num_classes=NUM_CLASSES,
                      batch_size=16, num_epochs=1, num_readers=0, lstm_cells=16, metrics_every_steps=2))
    assert export_main(["--train_dir", str(train_dir), "--output", str(tmp_path / "lstm.onnx")]) == 0
    data = {"validate_pattern": pattern.format("validate")}
    predict(data, "validate", tmp_path / "onnx.csv", model=tmp_path / "lstm.onnx", batch_size=7)
    predict(data, "validate", tmp_path / "torch.csv", train_dir=train_dir, batch_size=7)
    assert_same_predictions(tmp_path / "onnx.csv", tmp_path / "torch.csv", written["validate_labels"])


def test_export_without_a_checkpoint_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match=f"no checkpoint in {tmp_path}"):
        export_main(["--train_dir", str(tmp_path), "--output", str(tmp_path / "out")])
    assert cli_main(["export", "--checkpoint", str(tmp_path / "ckpt-1.pt"), "--output", str(tmp_path / "out")]) == 1
    assert f"checkpoint not found: {tmp_path / 'ckpt-1.pt'}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.fixture
def exported_copy(exported, tmp_path):
    copy = tmp_path / "exported"
    shutil.copytree(exported, copy)
    return copy


def edit_metadata(folder, **changes) -> None:
    meta = read_metadata(folder / "metadata.json")
    meta.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del meta[key]
    (folder / "metadata.json").write_text(json.dumps(meta))


def test_missing_metadata_is_a_clear_error(exported_copy):
    (exported_copy / "metadata.json").unlink()
    with pytest.raises(FileNotFoundError, match=f"export metadata not found: {exported_copy / 'metadata.json'}"):
        load_exported(str(exported_copy))


@pytest.mark.parametrize("changes,message", [
    (dict(feature_sizes=[16, 9]), r"field 'feature_sizes' \[16, 9\] adds up to 25, but the model's input 'features' has 24"),
    (dict(num_classes=NUM_CLASSES + 1), "field 'num_classes' is 13, but the model's output 'predictions'"),
    (dict(frame_features=True), "field 'frame_features' is True, so the model should take inputs"),
    (dict(num_classes=None), "field 'num_classes' is missing"),
    (dict(max_frames="300"), "field 'max_frames' must be int, got '300'"),
    (dict(feature_sizes=["16", "8"]), r"field 'feature_sizes' must list positive integers, got \['16', '8'\]"),
    (dict(feature_names=["rgb"]), r"field 'feature_names' \['rgb'\] must list one name per feature size \[16, 8\]"),
    (dict(format="yt8m-onnx-0"), "field 'format' is 'yt8m-onnx-0'"),
])
def test_mismatched_metadata_is_refused_naming_the_field(exported_copy, tiny_data, tmp_path, changes, message):
    edit_metadata(exported_copy, **changes)
    with pytest.raises(ExportError, match=message) as raised:
        predict(tiny_data, "test", tmp_path / "p.csv", model=exported_copy)
    assert str(exported_copy / "metadata.json") in str(raised.value)
    assert not (tmp_path / "p.csv").exists()


def test_an_unreadable_model_file_is_a_clear_error(exported_copy):
    (exported_copy / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(ExportError, match=f"{exported_copy / 'model.onnx'}: onnxruntime cannot load it"):
        load_exported(str(exported_copy))

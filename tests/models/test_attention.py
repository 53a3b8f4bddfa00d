"""TransformerModel: which frames it reads, that padding is never attended, its pooling and hidden-size checks,
and `yt8m train` with it on synthetic frames (--compile, --mixed_precision, torchrun), and on the real 2018 video."""

from __future__ import annotations

import json

import pytest
import torch
from model_helpers import export_then_predict, tiny_model, train_frames, write_eight_frame_data

from yt8m.cli import main as cli_main
from yt8m.models import create_model

TRANSFORMER = ["--model", "TransformerModel", "--transformer_hidden_size", "16", "--transformer_heads", "2",
               "--transformer_max_frames", "8"]


def test_evaluation_reads_every_real_frame_or_evenly_spaced_ones():
    model = tiny_model("TransformerModel", 6, 3).eval()
    index, real = model.frame_indices(torch.tensor([3, 12]), frames=12)
    assert index.tolist() == [[0, 1, 2, 2, 2, 2], [1, 3, 5, 7, 9, 11]]
    assert real.tolist() == [[True] * 3 + [False] * 3, [True] * 6]


def test_training_samples_distinct_real_frames_in_order():
    torch.manual_seed(0)
    model = tiny_model("TransformerModel", 6, 3).train()
    counts = torch.tensor([4, 20, 9])
    index, real = model.frame_indices(counts, frames=20)
    assert index.shape == real.shape == (3, 6)
    assert real.tolist() == [[True] * 4 + [False] * 2, [True] * 6, [True] * 6]
    for row, count in zip(index, counts):
        assert (row[:min(count, 6)] < count).all() and (row.diff() > 0).all()
    assert model.frame_indices(counts, frames=5)[0].shape == (3, 5)  # no more slots than frames


@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_padding_frames_are_never_attended(pooling):
    """Whatever the padding holds, no output moves: it is masked as attention keys and left out of the pooling."""
    torch.manual_seed(0)
    model = tiny_model("TransformerModel", 6, 3, transformer_pooling=pooling, transformer_max_frames=10).eval()
    features, num_frames = torch.randn(2, 10, 6), torch.tensor([4, 7])
    garbage = features.clone()
    garbage[0, 4:], garbage[1, 7:] = 1e3, -1e3
    torch.testing.assert_close(model(garbage, num_frames)["logits"], model(features, num_frames)["logits"])


def test_hidden_size_must_split_into_the_heads():
    with pytest.raises(ValueError, match=r"--transformer_hidden_size \(10\) must be a multiple of --transformer_heads \(4\)"):
        create_model("TransformerModel", 6, 3, transformer_hidden_size=10, transformer_heads=4)


def test_defaults_are_the_entrys_bert_mean_l2h12():
    model = create_model("TransformerModel", 1152, 3862)
    assert (len(model.layers), model.layers[0].heads, model.embed.out_features) == (2, 12, 1152)
    assert model.pooling == "mean" and model.max_frames == 300 and model.first_token is None


@pytest.fixture(scope="module")
def frame_data(tmp_path_factory) -> dict:
    return write_eight_frame_data(tmp_path_factory.mktemp("frames"))


@pytest.mark.integration
def test_compiled_mixed_precision_training_and_the_onnx_export_predict(frame_data, tmp_path, capsys):
    """One shape to compile (every video 8 frames, 8 slots); several minutes of compiling on a busy 2-core VM."""
    summary = train_frames(*TRANSFORMER, "--train_data_pattern", frame_data["train"], "--train_dir",
                           str(tmp_path / "run"), "--num_epochs", "2", "--compile", "--mixed_precision")
    assert summary["global_step"] == 8 and summary["loss"] > 0
    assert len(export_then_predict(tmp_path / "run", frame_data["validate"], tmp_path, capsys)) == 1 + 16


@pytest.mark.integration
def test_training_under_torchrun(frame_data, tmp_path):
    summary = train_frames(*TRANSFORMER, "--train_data_pattern", frame_data["train"], "--train_dir",
                           str(tmp_path / "run"), "--num_epochs", "1", torchrun=True)
    assert summary["global_step"] == 2  # 64 videos, 2 processes of 16 a step


def test_trains_and_predicts_on_the_real_2018_frame_level_video(realdata_dir, tmp_path, capsys):
    """SjJ3's 170 real frames (rgb 1024 + audio 128, 3862 classes), a batch of one: nothing depends on the batch."""
    shard = str(realdata_dir / "yt8m_2018_frame_tfrecord" / "SjJ3_derived_from_paddlevideo_example.tfrecord")
    train_dir = tmp_path / "run"
    flags = ["--frame_features", "--feature_names", "rgb,audio", "--feature_sizes", "1024,128", "--num_classes",
             "3862", "--model", "TransformerModel", "--transformer_hidden_size", "32", "--transformer_heads", "4",
             "--transformer_max_frames", "64", "--batch_size", "1", "--num_readers", "0", "--export_model_steps", "100"]
    assert cli_main(["train", *flags, "--train_data_pattern", shard, "--train_dir", str(train_dir),
                     "--num_epochs", "3", "--base_learning_rate", "0.01"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["global_step"] == 3
    output = tmp_path / "predictions.csv"
    assert cli_main(["predict", "--train_dir", str(train_dir), "--input_data_pattern", shard,
                     "--output_file", str(output), "--top_k", "3"]) == 0
    header, row = output.read_text().splitlines()
    assert row.startswith("SjJ3,") and " 11 " in f" {row.split(',')[1]} "

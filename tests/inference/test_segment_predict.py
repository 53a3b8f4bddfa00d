"""`yt8m predict --segment_labels`: every segment of every video a candidate (the last one zero-padded), each
whitelisted class's best segments first, capped, from a checkpoint or its ONNX export; the per-class store stays
bounded; bad whitelists and models are clear errors that leave no output."""

from __future__ import annotations

import csv
import json
import shutil
import time

import numpy as np
import pytest
import torch

from workflow_fixtures import train_config
from yt8m.cli import main as cli_main
from yt8m.data.format.decode import decode_frame, dequantize
from yt8m.data.format.encode import encode_frame_example
from yt8m.data.format.tfrecord import TFRecordWriter, expand_pattern, read_records
from yt8m.data.making.synthetic import write_synthetic
from yt8m.inference.segment_predict import (
    TopSegments,
    VideoTable,
    class_row_text,
    read_segment_label_ids,
    split_segments,
)
from yt8m.io.checkpoints import latest_checkpoint
from yt8m.models.checkpoints import build_model_from_checkpoint
from yt8m.training import TrainConfig, train

NUM_CLASSES = 12
FEATURE_SIZES = (8, 4)
NAMES = ("rgb", "audio")
SEGMENT = 5


@pytest.fixture(scope="module")
def segment_data(tmp_path_factory) -> dict:
    """Segment-rated synthetic shards: 64 train videos, 11 test videos of 7-23 frames in 2 files."""
    root = tmp_path_factory.mktemp("segment_data")
    write_synthetic(str(root), kind="segment", num_classes=NUM_CLASSES, train_videos=64, validate_videos=0,
                    test_videos=11, shards=2, feature_sizes=FEATURE_SIZES, min_frames=7, max_frames=23, seed=5)
    return {split: str(root / "segment" / f"{split}-*.tfrecord") for split in ("train", "test")}


@pytest.fixture(scope="module")
def run_dir(segment_data, tmp_path_factory):
    """A frame-level logistic model trained for 4 steps."""
    train_dir = tmp_path_factory.mktemp("segment_run") / "run"
    train(train_config(train_data_pattern=segment_data["train"], train_dir=str(train_dir),
                      model="FrameLevelLogisticModel", frame_features=True, feature_names=",".join(NAMES),
                      feature_sizes=",".join(map(str, FEATURE_SIZES)), num_classes=NUM_CLASSES, batch_size=16,
                      max_steps=4, num_readers=0, seed=1))
    return train_dir


@pytest.fixture
def vocabulary(tmp_path):
    """A whitelist in the 2019 segment_vocabulary.csv layout, classes out of order."""
    path = tmp_path / "vocabulary.csv"
    path.write_text("Index,KnowledgeGraphId,Name\n7,/m/07,Seven\n2,/m/02,Two\n\n10,/m/10,Ten\n")
    return path


def predict_cli(capsys, pattern: str, output, *flags: str) -> tuple[int, dict, str]:
    code = cli_main(["predict", "--segment_labels", "--input_data_pattern", pattern, "--output_file", str(output),
                     "--num_readers", "0", *flags])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


def read_rows(path) -> tuple[list[str], dict[int, list[str]]]:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], {int(class_id): segments.split(" ") if segments else [] for class_id, segments in rows[1:]}


def brute_force_scores(pattern: str, train_dir) -> dict[str, np.ndarray]:
    """Segment id -> the checkpoint's probabilities, one segment at a time: its frames zero-padded to SEGMENT."""
    model = build_model_from_checkpoint(latest_checkpoint(str(train_dir))).network
    scores = {}
    for path in expand_pattern(pattern):
        for _, payload in read_records(path):
            video_id, _, frames, count = decode_frame(payload, NAMES, FEATURE_SIZES, NUM_CLASSES, 10_000)
            for start in range(0, count, SEGMENT):
                segment = np.zeros((1, SEGMENT, sum(FEATURE_SIZES)), np.float32)
                real = frames[start:start + SEGMENT]
                segment[0, :len(real)] = dequantize(real)
                with torch.no_grad():
                    output = model(torch.from_numpy(segment), torch.tensor([len(real)]))["predictions"]
                scores[f"{video_id}:{start}"] = output[0].numpy()
    return scores


def assert_best_first(row: list[str], scores: dict[str, np.ndarray], class_id: int, kept: int) -> None:
    """The row holds `kept` distinct segments in descending score, none beaten by a segment left out."""
    assert len(row) == len(set(row)) == kept
    values = [float(scores[segment_id][class_id]) for segment_id in row]
    assert all(a >= b - 1e-6 for a, b in zip(values, values[1:]))
    left_out = [float(value[class_id]) for segment_id, value in scores.items() if segment_id not in set(row)]
    assert not left_out or max(left_out) <= values[-1] + 1e-6


def test_every_segment_of_every_video_is_ranked_for_each_listed_class(segment_data, run_dir, vocabulary, tmp_path,
                                                                       capsys):
    output = tmp_path / "segments.csv"
    started = time.perf_counter()
    code, summary, _ = predict_cli(capsys, segment_data["test"], output, "--train_dir", str(run_dir),
                                   "--segment_label_ids_file", str(vocabulary), "--batch_size", "7")
    elapsed = time.perf_counter() - started
    assert code == 0
    scores = brute_force_scores(segment_data["test"], run_dir)
    header, rows = read_rows(output)
    assert header == ["Class", "Segments"]
    assert list(rows) == [2, 7, 10]  # the file's classes, ascending
    for class_id, row in rows.items():
        assert set(row) == set(scores)  # each segment, the last partial ones too
        assert_best_first(row, scores, class_id, len(scores))
    assert summary["videos"] == 11 and summary["segments"] == len(scores) and summary["classes"] == 3
    assert summary["output_format"] == "segments"
    assert 0 < summary["scoring_seconds"] <= summary["seconds"] <= elapsed


def test_a_videos_last_segment_is_zero_padded_and_fed_its_real_frames(segment_data):
    """The starter kit's rule: ceil(frames / 5) segments at 0, 5, ...; a 7-frame video's second one holds frames 5
    and 6, then zeros, with num_frames 2. A video without frames has none."""
    counts = [decode_frame(payload, NAMES, FEATURE_SIZES, NUM_CLASSES, 10_000)[3]
              for path in expand_pattern(segment_data["test"]) for _, payload in read_records(path)]
    assert any(count % SEGMENT for count in counts)  # the CLI tests meet partial last segments
    features = torch.zeros(3, 12, 2)
    features[0, :7], features[1, :10] = 1.0, 2.0
    segments, real_frames, per_video = split_segments(features, torch.tensor([7, 10, 0]), SEGMENT)
    assert per_video.tolist() == [2, 2, 0] and real_frames.tolist() == [5, 2, 5, 5]
    assert segments.shape == (4, SEGMENT, 2)
    assert segments[1, :2].eq(1).all() and segments[1, 2:].eq(0).all() and segments[3].eq(2).all()


def test_at_most_segment_max_pred_per_class_exactly_the_best(segment_data, run_dir, vocabulary, tmp_path, capsys):
    output = tmp_path / "top3.csv"
    code, _, _ = predict_cli(capsys, segment_data["test"], output, "--train_dir", str(run_dir),
                             "--segment_label_ids_file", str(vocabulary), "--segment_max_pred", "3",
                             "--batch_size", "4")
    assert code == 0
    scores = brute_force_scores(segment_data["test"], run_dir)
    _, rows = read_rows(output)
    for class_id, row in rows.items():
        assert_best_first(row, scores, class_id, 3)


def test_videos_past_300_frames_are_read_whole(run_dir, tmp_path, capsys):
    rng = np.random.default_rng(0)
    frames = {name: rng.integers(0, 256, (312, size), dtype=np.uint8) for name, size in zip(NAMES, FEATURE_SIZES)}
    with TFRecordWriter(str(tmp_path / "long.tfrecord")) as writer:
        writer.write(encode_frame_example("long", None, frames))
    (tmp_path / "one.csv").write_text("3\n")
    code, summary, _ = predict_cli(capsys, str(tmp_path / "long.tfrecord"), tmp_path / "out.csv", "--train_dir",
                                   str(run_dir), "--segment_label_ids_file", str(tmp_path / "one.csv"))
    assert code == 0 and summary["segments"] == 63
    _, rows = read_rows(tmp_path / "out.csv")
    assert sorted(int(s.split(":")[1]) for s in rows[3]) == list(range(0, 315, 5))


def test_the_onnx_export_writes_the_checkpoints_rows(segment_data, run_dir, vocabulary, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    assert cli_main(["export", "--train_dir", str(run_dir), "--output", str(tmp_path / "export")]) == 0
    capsys.readouterr()
    flags = ["--segment_label_ids_file", str(vocabulary), "--segment_max_pred", "4", "--batch_size", "9"]
    assert predict_cli(capsys, segment_data["test"], tmp_path / "onnx.csv", "--model", str(tmp_path / "export"),
                       *flags)[0] == 0
    assert predict_cli(capsys, segment_data["test"], tmp_path / "torch.csv", "--train_dir", str(run_dir), *flags)[0] == 0
    scores = brute_force_scores(segment_data["test"], run_dir)
    _, onnx_rows = read_rows(tmp_path / "onnx.csv")
    _, torch_rows = read_rows(tmp_path / "torch.csv")
    assert list(onnx_rows) == list(torch_rows)
    for class_id, row in onnx_rows.items():
        assert_best_first(row, scores, class_id, 4)  # the same rows up to scores within float tolerance
        torch_values = [scores[segment_id][class_id] for segment_id in torch_rows[class_id]]
        onnx_values = [scores[segment_id][class_id] for segment_id in row]
        assert np.allclose(onnx_values, torch_values, atol=1e-6)


def test_the_packaged_whitelist_is_the_2019_classes(tmp_path):
    classes = read_segment_label_ids("", 3862)
    assert len(classes) == 1000 and classes[:2].tolist() == [3, 7] and (np.diff(classes) > 0).all()
    (tmp_path / "vocabulary.csv").write_text("Index,Name\n3,Concert\n7,Car\n")
    assert read_segment_label_ids(str(tmp_path / "vocabulary.csv"), 3862).tolist() == [3, 7]


@pytest.mark.parametrize("text,message", [
    ("Index\n3\nx7\n", "ids.csv:3: expected a class index as the first field, found 'x7'"),
    ("Index\n3\n12\n", "ids.csv:3: class 12 is not one of the model's classes [0, 12)"),
    ("3\n5\n3\n", "ids.csv:3: class 3 is already listed on line 1"),
    ("Index\n", "ids.csv: lists no class index"),
])
def test_a_bad_whitelist_is_an_error_naming_file_and_line(segment_data, run_dir, tmp_path, capsys, text, message):
    (tmp_path / "ids.csv").write_text(text)
    code, _, err = predict_cli(capsys, segment_data["test"], tmp_path / "out.csv", "--train_dir", str(run_dir),
                               "--segment_label_ids_file", str(tmp_path / "ids.csv"))
    assert code == 1 and message in err
    assert not (tmp_path / "out.csv").exists()


def test_the_default_whitelist_needs_a_model_of_the_2019_classes(segment_data, run_dir, tmp_path, capsys):
    code, _, err = predict_cli(capsys, segment_data["test"], tmp_path / "out.csv", "--train_dir", str(run_dir))
    assert code == 1 and "segment_label_ids.csv (packaged with yt8m):" in err
    assert "class 12 is not one of the model's classes [0, 12)" in err


def test_an_id_the_segments_field_cannot_hold_is_refused(segment_data, run_dir, tmp_path, capsys):
    rng = np.random.default_rng(1)
    frames = {name: rng.integers(0, 256, (6, size), dtype=np.uint8) for name, size in zip(NAMES, FEATURE_SIZES)}
    with TFRecordWriter(str(tmp_path / "spaced.tfrecord")) as writer:
        writer.write(encode_frame_example("a b", None, frames))
    (tmp_path / "one.csv").write_text("3\n")
    code, _, err = predict_cli(capsys, str(tmp_path / "spaced.tfrecord"), tmp_path / "out.csv", "--train_dir",
                               str(run_dir), "--segment_label_ids_file", str(tmp_path / "one.csv"))
    assert code == 1 and "cannot write segments of video 'a b'" in err and "whitespace" in err
    assert not (tmp_path / "out.csv").exists()


def test_a_video_read_twice_is_refused(run_dir, tmp_path, capsys):
    rng = np.random.default_rng(2)
    for name in ("a", "b"):
        frames = {feature: rng.integers(0, 256, (6, size), dtype=np.uint8)
                  for feature, size in zip(NAMES, FEATURE_SIZES)}
        with TFRecordWriter(str(tmp_path / f"{name}.tfrecord")) as writer:
            writer.write(encode_frame_example("same", None, frames))
    (tmp_path / "one.csv").write_text("3\n")
    code, _, err = predict_cli(capsys, str(tmp_path / "*.tfrecord"), tmp_path / "out.csv", "--train_dir",
                               str(run_dir), "--segment_label_ids_file", str(tmp_path / "one.csv"))
    assert code == 1 and "video 'same' is read twice" in err and "a.tfrecord" in err and "b.tfrecord" in err


def test_the_store_stays_bounded_and_keeps_the_best_with_ties_by_id():
    """Scores rounded to 0.1 tie often, at the cut too: the kept segments and their order are the best by (score, id, start),
    whatever order the videos come in, and no class ever holds more than its capacity."""
    rng = np.random.default_rng(3)
    ids = [f"v{number:04d}" for number in range(1500)]
    per_video = rng.integers(1, 6, len(ids))  # about 4,500 segments: cut back twice past 40 + 2048
    total = int(per_video.sum())
    scores = np.round(rng.random((4, total)), 1).astype(np.float32)
    owner = np.repeat(np.arange(len(ids)), per_video)
    starts = np.concatenate([np.arange(count) * SEGMENT for count in per_video])
    expected = {}
    for index in range(4):
        order = sorted(range(total), key=lambda s: (-scores[index, s], ids[owner[s]], starts[s]))[:40]
        expected[index] = [f"{ids[owner[s]]}:{starts[s]}" for s in order]
    for video_order in (np.arange(len(ids)), rng.permutation(len(ids))):  # reading order must not matter
        table = VideoTable(SEGMENT)
        top = TopSegments(4, 40, table.id_order)
        table.add([ids[v] for v in video_order], per_video[video_order])
        segment_order = np.concatenate([np.flatnonzero(owner == v) for v in video_order])
        for start in range(0, total, 37):
            top.add(np.ascontiguousarray(scores[:, segment_order[start:start + 37]]), start)
            assert top.counts.max() <= top.capacity == 40 + 2048
        ranks = table.id_ranks()
        for index in range(4):
            assert class_row_text(top, table, index, ranks).split(" ") == expected[index]


def test_the_store_cuts_back_past_its_capacity():
    table = VideoTable(SEGMENT)
    table.add(["x"], np.array([100_000]))
    top = TopSegments(1, 3000, table.id_order)
    rng = np.random.default_rng(4)
    scores = rng.random((1, 100_000)).astype(np.float32)
    for start in range(0, 100_000, 1000):
        top.add(scores[:, start:start + 1000], start)
        assert top.counts[0] <= top.capacity == 3000 + 2048
    assert top.thresholds[0] > 0.9  # newcomers below the 3000th best score are turned away
    row = class_row_text(top, table, 0, table.id_ranks()).split(" ")
    assert row == [f"x:{number * SEGMENT}" for number in np.argsort(-scores[0], kind="stable")[:3000]]


def test_segment_ids_are_video_id_colon_start_frame():
    table = VideoTable(SEGMENT)
    table.add(["ab", "élan", "Z"], np.array([1, 202, 3]))
    numbers = np.array([0, 1, 2, 3, 21, 201, 203, 205])
    assert table.segment_ids(numbers) == ["ab:0", "élan:0", "élan:5", "élan:10", "élan:100", "élan:1000", "Z:0",
                                          "Z:10"]
    assert table.segment_ids(np.array([], np.int64)) == []


def test_scores_that_are_not_finite_are_an_error_naming_the_segment_and_nothing_is_written(segment_data, run_dir,
                                                                                             vocabulary, tmp_path,
                                                                                             capsys):
    copy = tmp_path / "nan_run"
    shutil.copytree(run_dir, copy)
    path = latest_checkpoint(str(copy))
    payload = torch.load(path, weights_only=True)
    payload["model"] = {name: torch.full_like(value, float("nan")) for name, value in payload["model"].items()}
    torch.save(payload, path)
    output = tmp_path / "out.csv"
    code, _, err = predict_cli(capsys, segment_data["test"], output, "--train_dir", str(copy),
                               "--segment_label_ids_file", str(vocabulary))
    assert code == 1 and "predictions are not finite (NaN or infinity) for videos '" in err
    assert ":0'" in err and "(record at byte 0)" in err and f"{output} is not written" in err
    assert not output.exists()


def test_a_video_level_model_is_refused(tmp_path, capsys):
    from workflow_fixtures import FEATURE_SIZES as VIDEO_FEATURE_SIZES
    from workflow_fixtures import tiny_train_config, train_config

    data = write_synthetic(str(tmp_path), kind="video", num_classes=NUM_CLASSES, train_videos=32, validate_videos=0,
                           test_videos=4, shards=1, feature_sizes=VIDEO_FEATURE_SIZES, seed=1)
    train(tiny_train_config({"train_pattern": data["train"][0]}, tmp_path / "video_run", max_steps=1, num_epochs=1))
    code, _, err = predict_cli(capsys, data["test"][0], tmp_path / "out.csv", "--train_dir",
                               str(tmp_path / "video_run"))
    assert code == 1 and "the model must be frame-level" in err


def test_the_2019_segment_vocabulary_reads_as_is_and_lists_the_packaged_classes(realdata_dir):
    listed = read_segment_label_ids(str(realdata_dir / "segment_vocabulary.csv"), 3862)
    assert listed.tolist() == read_segment_label_ids("", 3862).tolist()

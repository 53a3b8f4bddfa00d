"""Tests of `yt8m synth`: layout, ground truth, label statistics, determinism, learnability, localized evidence."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from yt8m.commands.synth import main
from yt8m.data.format.decode import decode_frame, dequantize
from yt8m.data.format.example_parse import parse_record
from yt8m.data.format.tfrecord import read_records
from yt8m.data.making.synthetic import write_synthetic
from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset, make_loader

NUM_CLASSES = 20
SIZES = {"train": 1500, "validate": 500, "test": 200}
VIDEO_SPEC = FeatureSpec(["mean_rgb", "mean_audio"], [1024, 128], frame_features=False, num_classes=NUM_CLASSES)


@pytest.fixture(scope="module")
def video_data(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("synth")
    return write_synthetic(str(folder), kind="video", num_classes=NUM_CLASSES, train_videos=SIZES["train"],
                           validate_videos=SIZES["validate"], test_videos=SIZES["test"], shards=3, seed=7)


def records_of(paths: list[str]) -> list[dict]:
    return [parse_record(payload)["features"] for path in paths for _, payload in read_records(path)]


def read_truth(path: str) -> list[tuple[str, list[int]]]:
    lines = Path(path).read_text().splitlines()
    assert lines[0] == "VideoId,Labels"
    assert all(re.fullmatch(r"[0-9A-Za-z]{4},(\d+( \d+)*)?", line) for line in lines[1:])
    return [(video_id, [int(label) for label in labels.split()])
            for video_id, labels in (line.split(",") for line in lines[1:])]


def read_batches(pattern: str, spec: FeatureSpec) -> tuple[torch.Tensor, torch.Tensor]:
    batches = list(make_loader(YT8MDataset(pattern, spec, batch_size=512), num_workers=0))
    return torch.cat([b.features for b in batches]), torch.cat([b.labels for b in batches]).float()


def test_layout_and_sizes(video_data):
    for split, count in SIZES.items():
        names = [Path(path).name for path in video_data[split]]
        assert names == [f"{split}-{shard:05d}-of-00003.tfrecord" for shard in range(3)]
        assert sum(1 for path in video_data[split] for _ in read_records(path)) == count
    assert Path(video_data["validate_labels"]).name == "validate_labels.csv"
    assert Path(video_data["test_labels"]).name == "test_labels.csv"
    assert "train_labels" not in video_data


def test_ground_truth_matches_records_and_test_has_no_labels(video_data):
    validate = records_of(video_data["validate"])
    truth = read_truth(video_data["validate_labels"])
    assert [video_id for video_id, _ in truth] == [r["id"][0].decode() for r in validate]
    assert [labels for _, labels in truth] == [r["labels"].tolist() for r in validate]
    test = records_of(video_data["test"])
    assert all("labels" not in r for r in test)
    test_truth = read_truth(video_data["test_labels"])
    assert [video_id for video_id, _ in test_truth] == [r["id"][0].decode() for r in test]
    assert sum(len(labels) for _, labels in test_truth) > len(test_truth)
    train_ids = [r["id"][0].decode() for r in records_of(video_data["train"])]
    all_ids = [video_id for video_id, _ in truth + test_truth] + train_ids
    assert len(set(all_ids)) == len(all_ids)


def test_label_statistics_are_youtube8m_like(video_data):
    labels = [r["labels"] for r in records_of(video_data["train"] + video_data["validate"])]
    per_video = np.array([len(video_labels) for video_labels in labels])
    assert 2.6 < per_video.mean() < 3.4
    assert (per_video >= 1).mean() > 0.95
    assert all(len(set(video_labels.tolist())) == len(video_labels) for video_labels in labels)
    counts = np.bincount(np.concatenate(labels), minlength=NUM_CLASSES)
    assert counts.min() > 0
    rank_correlation = np.corrcoef(np.arange(NUM_CLASSES), np.log(counts))[0, 1]
    assert rank_correlation < -0.9, counts  # frequent classes first, a Zipf-like decay
    assert counts[0] > 4 * counts[-1]


def test_features_stay_in_the_youtube8m_range(video_data):
    features, _ = read_batches(video_data["validate"][0], VIDEO_SPEC)
    assert features.min() >= -2.0 and features.max() <= 2.0 and features.std() > 0.1


def average_precision_at_20(scores: np.ndarray, labels: np.ndarray) -> float:
    """Global average precision over each video's top 20 predictions (the YT8M GAP)."""
    top = np.argsort(-scores, axis=1)[:, :20]
    confidences = np.take_along_axis(scores, top, axis=1).ravel()
    hits = np.take_along_axis(labels, top, axis=1).ravel()[np.argsort(-confidences, kind="stable")]
    precision = np.cumsum(hits) / np.arange(1, hits.size + 1)
    return float((precision * hits).sum() / labels.sum())


def test_a_logistic_model_learns_but_is_far_from_perfect(video_data):
    train_x, train_y = read_batches(",".join(video_data["train"]), VIDEO_SPEC)
    valid_x, valid_y = read_batches(",".join(video_data["validate"]), VIDEO_SPEC)
    torch.manual_seed(0)
    model = torch.nn.Linear(train_x.shape[1], NUM_CLASSES)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    inputs = torch.nn.functional.normalize(train_x, dim=1)
    for _ in range(8):
        for batch in torch.randperm(len(inputs)).split(128):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(inputs[batch]), train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        scores = torch.sigmoid(model(torch.nn.functional.normalize(valid_x, dim=1))).numpy()
    frequency = np.tile(train_y.mean(0).numpy(), (len(valid_y), 1))
    model_gap = average_precision_at_20(scores, valid_y.numpy())
    baseline_gap = average_precision_at_20(frequency, valid_y.numpy())
    assert model_gap > baseline_gap + 0.15, (model_gap, baseline_gap)
    assert 0.4 < model_gap < 0.9, model_gap


def test_same_seed_writes_the_same_bytes(tmp_path):
    def files(seed: int, folder: str) -> dict:
        for kind in ("video", "segment"):
            write_synthetic(str(tmp_path / folder), kind=kind, num_classes=6, train_videos=8, validate_videos=4,
                            test_videos=3, shards=2, seed=seed, feature_sizes=(16, 8), min_frames=5, max_frames=20)
        return {p.relative_to(tmp_path / folder): p.read_bytes() for p in sorted((tmp_path / folder).rglob("*.*"))}

    first = files(1, "a")
    assert len(first) == 2 * 8 + 3 and first == files(1, "b")  # shards, labels CSVs, vocabularies
    changed = files(2, "c")
    assert all(changed[name] != content for name, content in first.items() if name.suffix == ".tfrecord")


def segment_deviation(video: dict, frames: np.ndarray) -> tuple[list[float], list[float]]:
    """How far each rated segment's frames lie from the video's mean frame, for positive and negative ratings."""
    deviation = np.linalg.norm(frames - frames.mean(axis=0), axis=1)
    positive, negative = [], []
    for start, score in zip(video["segment_start_times"].tolist(), video["segment_scores"].tolist()):
        (positive if score == 1.0 else negative).append(float(deviation[start:start + 5].mean()))
    return positive, negative


def test_frame_evidence_is_localized_where_segments_are_rated(tmp_path):
    written = write_synthetic(str(tmp_path), kind="segment", num_classes=8, train_videos=0, validate_videos=40,
                              test_videos=2, shards=1, seed=3, feature_sizes=(48, 16), min_frames=40, max_frames=80)
    positive, negative = [], []
    for _, payload in read_records(written["validate"][0]):
        context = parse_record(payload)["context"]
        _, labels, frames, num_frames = decode_frame(payload, ["rgb", "audio"], [48, 16], 8, max_frames=1000)
        starts = context["segment_start_times"]
        assert len(starts) == len(context["segment_labels"]) == len(context["segment_scores"])
        assert all(start % 5 == 0 and start + 5 <= num_frames for start in starts.tolist())
        assert set(context["segment_labels"].tolist()) <= set(labels.tolist())
        assert set(context["segment_scores"].tolist()) <= {0.0, 1.0}
        found = segment_deviation(context, dequantize(frames))
        positive += found[0]
        negative += found[1]
    assert len(positive) > 20 and len(negative) > 10
    assert np.mean(positive) > 1.5 * np.mean(negative), (np.mean(positive), np.mean(negative))
    (_, test_payload), *_ = read_records(written["test"][0])
    assert "segment_start_times" not in parse_record(test_payload)["context"]


def test_cli_writes_every_kind_gzipped_with_2017_ids(tmp_path, capsys):
    argv = ["--output_dir", str(tmp_path), "--kind", "all", "--num_classes", "5", "--train_videos", "6",
            "--validate_videos", "3", "--test_videos", "2", "--shards", "2", "--gzip", "--id_key", "video_id",
            "--feature_sizes", "8,4", "--min_frames", "3", "--max_frames", "12"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)  # one JSON line, each kind's files under its name
    assert list(printed) == ["kind", "video", "frame", "segment"] and printed["kind"] == "all"
    for entry in (printed[kind] for kind in ("video", "frame", "segment")):
        assert [Path(p).name for p in entry["train"]] == ["train-00000-of-00002.tfrecord.gz",
                                                         "train-00001-of-00002.tfrecord.gz"]
        assert Path(entry["train"][0]).read_bytes()[:2] == b"\x1f\x8b"
        (_, payload), *_ = read_records(entry["validate"][0])
        record = parse_record(payload)
        assert "video_id" in record.get("context", record.get("features"))
    frame_spec = FeatureSpec(["rgb", "audio"], [8, 4], frame_features=True, num_classes=5)
    features, labels = read_batches(str(tmp_path / "frame" / "train-*"), frame_spec)
    assert features.shape[0] == 6 and features.shape[2] == 12 and 3 <= features.shape[1] <= 12


def test_bad_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        write_synthetic(str(tmp_path), kind="audio")
    with pytest.raises(ValueError, match="min_frames"):
        write_synthetic(str(tmp_path), kind="frame", min_frames=10, max_frames=5)
    with pytest.raises(ValueError, match="feature_sizes"):
        main(["--output_dir", str(tmp_path), "--feature_sizes", "1024,x"])


def test_the_vocabulary_lists_every_class_as_the_2018_file_does(video_data):
    with open(video_data["vocabulary"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["Index", "TrainVideoCount", "KnowledgeGraphId", "Name", "WikiUrl", "Vertical1",
                             "Vertical2", "Vertical3", "WikiDescription"]
    assert sorted(int(row["Index"]) for row in rows) == list(range(NUM_CLASSES))
    counts = [int(row["TrainVideoCount"]) for row in rows]
    assert counts == sorted(counts, reverse=True) and [row["Index"] for row in rows] != sorted(
        (row["Index"] for row in rows), key=int)  # ordered by count, as the real file: look rows up by Index
    train = records_of(video_data["train"])
    labelled = np.bincount([label for record in train for label in record["labels"].tolist()], minlength=NUM_CLASSES)
    assert {int(row["Index"]): int(row["TrainVideoCount"]) for row in rows} == dict(enumerate(labelled.tolist()))
    assert len({row["Vertical1"] for row in rows}) > 1


def test_the_segment_vocabulary_lists_the_rated_classes_with_their_counts(tmp_path):
    written = write_synthetic(str(tmp_path), kind="segment", num_classes=NUM_CLASSES, train_videos=40,
                              validate_videos=20, test_videos=4, shards=2, feature_sizes=(8, 4), seed=2)
    rated = np.zeros((NUM_CLASSES, 2), np.int64)
    for path in written["train"] + written["validate"]:
        for _, payload in read_records(path):
            context = parse_record(payload)["context"]
            np.add.at(rated, (context["segment_labels"], 0), context["segment_scores"].astype(np.int64))
            np.add.at(rated, (context["segment_labels"], 1), 1)
    with open(written["segment_vocabulary"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["Index", "KnowledgeGraphId", "Name", "PositiveSegmentCount", "TotalSegmentCount"]
    assert [int(row["Index"]) for row in rows] == np.flatnonzero(rated[:, 1]).tolist()
    assert [[int(row["PositiveSegmentCount"]), int(row["TotalSegmentCount"])] for row in rows] == \
        rated[rated[:, 1] > 0].tolist()

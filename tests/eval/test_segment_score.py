"""`yt8m score --segment_labels` against the TensorFlow-written segment fixtures: mAP@K of hand-written submissions
equals a brute-force computation from the fixtures' sidecars, label CSVs score as the shards do, and every malformed
input is an error naming its file and line (or record)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import load_sidecar
from yt8m.cli import main as cli_main
from yt8m.data.format.encode import encode_frame_example
from yt8m.data.format.tfrecord import TFRecordWriter
from yt8m.eval.segment_score import read_rated_segments, score_segment_submission

SHARDS = ("validate00.tfrecord", "validate01.tfrecord")
# Rated pairs of the fixtures: class 1962 (wG1j) 3 positives, 3 negatives; 407 (eGkT) 1+, 1-; 993 (YmLL) 1+, 1-;
# 3861 only a negative; 0, 36, 319, 1551, 2656 only positives. Unrated ids (zzzz:5, wG1j:0) are dropped.
SUBMISSION = ("Class,Segments\n"
              "1962,wG1j:355 zzzz:5 wG1j:50 wG1j:120 wG1j:85 wG1j:0 wG1j:130\n"
              "407,eGkT:145 eGkT:40\n"
              "3861,eGkT:40\n"
              "\n"
              "993,YmLL:0\n"
              "1551,B6J3:80 B6J3:75\n"
              "2656,\n")


def sidecar_ratings(fixtures_dir) -> dict[tuple[str, int], bool]:
    """(segment id, class) -> rating, from the sidecars' per-record lists."""
    ratings = {}
    for shard in SHARDS:
        for record in load_sidecar(fixtures_dir / "segment" / shard)["records"]:
            for start, label, score in zip(record["segment_start_times"], record["segment_labels"],
                                           record["segment_scores"]):
                ratings[(f"{record['id']}:{start}", label)] = score == 1.0
    return ratings


def brute_force_map(submission: str, ratings: dict[tuple[str, int], bool], top_n: int) -> float:
    positives: dict[int, int] = {}
    for (_, label), positive in ratings.items():
        positives[label] = positives.get(label, 0) + positive
    aps = {label: 0.0 for label, count in positives.items() if count}
    for line in submission.splitlines()[1:]:
        if not line:
            continue
        label, segments = line.split(",")
        label = int(label)
        ranked = [ratings[(s, label)] for s in segments.split()[:top_n] if (s, label) in ratings]
        found, total = 0, 0.0
        for rank, positive in enumerate(ranked, start=1):
            found += positive
            total += found / rank if positive else 0.0
        if label in aps:
            aps[label] = total / min(positives[label], top_n)
    return sum(aps.values()) / len(aps)


def shards(fixtures_dir) -> str:
    return ",".join(str(fixtures_dir / "segment" / shard) for shard in SHARDS)


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run_score(capsys, predictions: str, labels: str, *flags: str):
    code = cli_main(["score", "--segment_labels", "--predictions", predictions, "--labels", labels, *flags])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


@pytest.mark.parametrize("top_n", [100000, 3, 1])
def test_fixture_map_equals_the_brute_force(capsys, caplog, tmp_path, fixtures_dir, top_n):
    code, result, err = run_score(capsys, write(tmp_path, "sub.csv", SUBMISSION), shards(fixtures_dir),
                                  "--top_n", str(top_n))
    assert code == 0, err
    assert result["segment_map"] == pytest.approx(brute_force_map(SUBMISSION, sidecar_ratings(fixtures_dir), top_n),
                                                  rel=1e-12)
    assert result["num_rated_pairs"] == 17 and result["num_positive_pairs"] == 11  # wG1j:320 rated twice alike
    assert result["num_classes_with_positives"] == 8 and result["num_classes_submitted"] == 6
    assert result["num_classes_missing"] == 3 and result["num_submitted_segments"] == 13
    assert "3 classes with positive rated segments have no row" in caplog.text and "(0, 36, 319)" in caplog.text


def test_fixture_map_by_hand(capsys, tmp_path, fixtures_dir):
    _, result, _ = run_score(capsys, write(tmp_path, "sub.csv", SUBMISSION), shards(fixtures_dir))
    # 1962: + - + - + over 3 positives; 407: - +; 993: +; 1551: + +; 3861 has no positive: left out;
    # 2656 listed empty, 0, 36, 319 not listed: 0. Mean over the 8 classes with positives.
    expected = ((1 + 2 / 3 + 3 / 5) / 3 + 1 / 2 + 1 + 1) / 8
    assert result["segment_map"] == pytest.approx(expected, rel=1e-12)


def test_top_n_cuts_the_list_before_unrated_ids_are_dropped(capsys, tmp_path, fixtures_dir):
    submission = "Class,Segments\n1962,zzzz:5 wG1j:0 wG1j:355 wG1j:120\n"
    _, two, _ = run_score(capsys, write(tmp_path, "sub.csv", submission), shards(fixtures_dir), "--top_n", "2")
    _, three, _ = run_score(capsys, write(tmp_path, "sub.csv", submission), shards(fixtures_dir), "--top_n", "3")
    assert two["segment_map"] == 0.0
    assert three["segment_map"] == pytest.approx((1 / 1) / 3 / 8)  # 1 found of min(3 positives, 3)


def test_a_submission_of_other_videos_is_an_error_not_a_zero(capsys, tmp_path, fixtures_dir):
    """Predictions of the test split scored against the validate split's ratings used to print segment_map 0.0."""
    submission = write(tmp_path, "sub.csv", "Class,Segments\n1962,tst1:0 tst1:5\n407,tst2:40\n")
    code, _, err = run_score(capsys, submission, shards(fixtures_dir))
    assert code == 1
    assert err.splitlines() == [f"yt8m score: error: no video of {submission} has rated segments in the labels: its "
                                "segments are of other videos (the test split's, while the ratings are the validate "
                                "split's?) and would score 0; predict the rated split's segments to score them"]


def test_label_csv_scores_as_the_shards_and_can_be_written_from_them(capsys, tmp_path, fixtures_dir):
    submission = write(tmp_path, "sub.csv", SUBMISSION)
    cache = str(tmp_path / "labels.csv")
    code, from_shards, _ = run_score(capsys, submission, shards(fixtures_dir), "--write_labels_csv", cache)
    assert code == 0
    lines = open(cache).read().splitlines()
    assert lines[0] == "segment_id,class,score" and len(lines) == 18 and "wG1j:355,1962,1" in lines
    _, from_cache, _ = run_score(capsys, submission, cache)
    assert from_cache == from_shards
    by_hand = ("segment_id,class,score\n" + "\n".join(f"{s},{c},{float(r)}" for (s, c), r in
                                                      sidecar_ratings(fixtures_dir).items()) + "\nwG1j:355,1962,1\n")
    _, from_hand_written, _ = run_score(capsys, submission, write(tmp_path, "hand.csv", by_hand))
    assert from_hand_written == from_shards


def test_python_api_reads_either_source(tmp_path, fixtures_dir):
    rated = read_rated_segments(shards(fixtures_dir), 3862)
    assert rated.class_ratings(1962) == {"wG1j:50": False, "wG1j:85": False, "wG1j:120": True, "wG1j:130": True,
                                    "wG1j:320": False, "wG1j:355": True}
    result = score_segment_submission(write(tmp_path, "sub.csv", "Class,Segments\n319,AJ57:0\n"), rated, top_n=5)
    assert result["segment_map"] == pytest.approx(1 / 8)


@pytest.mark.parametrize("submission, message", [
    ("Class,Segment\n1962,wG1j:355\n", "sub.csv:1: expected the header 'Class,Segments'"),
    ("Class,Segments\n1962 wG1j:355\n", "sub.csv:2: expected 'Class,<space-separated"),
    ("Class,Segments\n1962,wG1j:355,wG1j:120\n", "sub.csv:2: expected 'Class,<space-separated"),
    ("Class,Segments\n407,eGkT:40\nx,wG1j:355\n", "sub.csv:3: the class must be an integer, got 'x'"),
    ("Class,Segments\n3862,wG1j:355\n", "sub.csv:2: class 3862 is outside \\[0, 3862\\)"),
    ("Class,Segments\n-1,wG1j:355\n", "sub.csv:2: class -1 is outside"),
    ("Class,Segments\n407,eGkT:40\n\n407,eGkT:145\n", "sub.csv:4: class 407 is already on line 2"),
    ("Class,Segments\n1962,wG1j:355 wG1j\n", "sub.csv:2: malformed segment id 'wG1j'"),
    ("Class,Segments\n1962,wG1j:355 wG1j:x5\n", "sub.csv:2: malformed segment id 'wG1j:x5'"),
    ("Class,Segments\n1962,wG1j:355 wG1j:055\n", "sub.csv:2: malformed segment id 'wG1j:055'"),
    ("Class,Segments\n1962,wG1j:355 :5\n", "sub.csv:2: malformed segment id ':5'"),
    ("Class,Segments\n1962,wG1j:355 wG1j:120 zzzz:5 wG1j:355\n",
     "sub.csv:2: segment wG1j:355 is listed twice \\(positions 1 and 4\\)"),
])
def test_malformed_submissions_are_errors_naming_the_line(capsys, tmp_path, fixtures_dir, submission, message):
    code, _, err = run_score(capsys, write(tmp_path, "sub.csv", submission), shards(fixtures_dir))
    assert code == 1
    assert re.search(message, err), err


@pytest.mark.parametrize("labels, message", [
    ("segment,class,score\n", "labels.csv:1: expected the header 'segment_id,class,score'"),
    ("segment_id,class,score\nwG1j:355,1962,1\nwG1j:355,1962\n", "labels.csv:3: expected 'VIDEOID:START,class,score'"),
    ("segment_id,class,score\nwG1j:355,1962,0.5\n", "labels.csv:2: expected 'VIDEOID:START,class,score' with score"),
    ("segment_id,class,score\nwG1j,1962,1\n", "labels.csv:2: expected 'VIDEOID:START"),
    ("segment_id,class,score\nwG1j:355,x,1\n", "labels.csv:2: the class must be an integer"),
    ("segment_id,class,score\nwG1j:355,5000,1\n", "labels.csv:2: class 5000 is outside"),
    ("segment_id,class,score\nwG1j:355,1962,1\nwG1j:355,1962,1.0\nwG1j:355,1962,0\n",
     "labels.csv:4: segment wG1j:355 class 1962 is rated 0 here and 1 on an earlier line"),
    ("segment_id,class,score\n\n", "labels.csv holds no rated segments"),
])
def test_malformed_label_csvs_are_errors_naming_the_line(capsys, tmp_path, labels, message):
    submission = write(tmp_path, "sub.csv", "Class,Segments\n1962,wG1j:355\n")
    code, _, err = run_score(capsys, submission, write(tmp_path, "labels.csv", labels))
    assert code == 1
    assert re.search(message, err), err


def segment_record(video_id: str, start: int, label: int, score: float) -> bytes:
    frames = {"rgb": np.zeros((start + 5, 4), np.uint8)}
    segments = {"segment_start_times": (start,), "segment_labels": (label,), "segment_scores": (score,)}
    return encode_frame_example(video_id, (label,), frames, segments)


def test_a_pair_rated_differently_in_two_records_is_an_error_naming_the_record(capsys, tmp_path):
    shard = str(tmp_path / "rated.tfrecord")
    with TFRecordWriter(shard) as writer:
        writer.write(segment_record("abcd", 10, 3, 1.0))
        writer.write(segment_record("abcd", 10, 3, 0.0))
    code, _, err = run_score(capsys, write(tmp_path, "sub.csv", "Class,Segments\n3,abcd:10\n"), shard)
    assert code == 1
    assert re.search(r"rated.tfrecord: record at byte offset \d+: segment abcd:10 class 3 is rated 0 here and 1 in an "
                     "earlier record", err), err


def test_a_bad_record_and_a_missing_shard_are_errors_naming_them(capsys, tmp_path):
    shard = str(tmp_path / "bad.tfrecord")
    with TFRecordWriter(shard) as writer:
        writer.write(segment_record("abcd", 10, 3, 1.0))
        writer.write(segment_record("abcd", 15, 3, 0.5))
    code, _, err = run_score(capsys, write(tmp_path, "sub.csv", "Class,Segments\n3,abcd:10\n"), shard)
    assert code == 1 and re.search(r"bad.tfrecord: record at byte offset \d+: .*segment_scores", err), err
    code, _, err = run_score(capsys, write(tmp_path, "sub.csv", "Class,Segments\n3,abcd:10\n"),
                             str(tmp_path / "none*.tfrecord"))
    assert code == 1 and "no files match" in err


def test_segment_score_through_the_cli_as_a_user_runs_it(tmp_path, fixtures_dir):
    submission = write(tmp_path, "sub.csv", SUBMISSION)
    result = subprocess.run([sys.executable, "-m", "yt8m", "score", "--segment_labels", "--predictions", submission,
                             "--labels", str(fixtures_dir / "segment" / "validate*.tfrecord")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["segment_map"] == pytest.approx(
        brute_force_map(SUBMISSION, sidecar_ratings(fixtures_dir), 100000), rel=1e-12)
    write(tmp_path, "sub.csv", SUBMISSION + "407,eGkT:40\n")
    result = subprocess.run([sys.executable, "-m", "yt8m", "score", "--segment_labels", "--predictions", submission,
                             "--labels", str(fixtures_dir / "segment" / "validate*.tfrecord")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (f"yt8m score: error: {submission}:9: class 407 is already on "
                                                      "line 3")


def test_the_label_store_holds_what_dicts_of_the_pairs_hold(tmp_path):
    """Random pairs (ids of several lengths, repeats alike) through the label CSV and a shard: the array store's
    ratings per class and its look-ups equal dicts built from the pairs, as the store was before."""
    rng = np.random.default_rng(3)
    videos = [f"v{index}{'x' * (index % 4)}" for index in range(40)]
    pairs = {}
    for _ in range(400):
        pairs[(f"{videos[rng.integers(40)]}:{5 * int(rng.integers(0, 80))}", int(rng.integers(0, 50)))] = \
            int(rng.integers(0, 2))
    listed = list(pairs.items()) + list(pairs.items())[:30]  # the repeats rate alike
    csv = "segment_id,class,score\n" + "".join(f"{segment},{class_id},{rating}\n"
                                               for (segment, class_id), rating in listed)
    shard = str(tmp_path / "rated.tfrecord")
    with TFRecordWriter(shard) as writer:
        for (segment, class_id), rating in listed:
            video_id, start = segment.split(":")
            writer.write(segment_record(video_id, int(start), class_id, float(rating)))
    expected: dict[int, dict[str, bool]] = {}
    for (segment, class_id), rating in pairs.items():
        expected.setdefault(class_id, {})[segment] = bool(rating)
    queries = [segment for segment, _ in pairs] + ["zzz:5", "v1:7", "v1x:0", "v1:05", "v1", ":5"]
    for rated in (read_rated_segments(write(tmp_path, "labels.csv", csv), 50), read_rated_segments(shard, 50)):
        assert len(rated) == len(pairs)
        assert rated.num_positives().tolist() == [sum(found.values()) for found in
                                                  (expected.get(class_id, {}) for class_id in range(50))]
        for class_id in range(50):
            by_class = expected.get(class_id, {})
            assert rated.class_ratings(class_id) == by_class
            looked_up = rated.ratings_of(class_id, queries).tolist()
            assert looked_up == [int(by_class[query]) if query in by_class else -1 for query in queries]

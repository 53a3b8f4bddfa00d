"""`yt8m score` (video and segment submissions) against hostile CSVs: a 5 MB bad line, bytes that are not UTF-8,
class fields that Python's int() reads but a CSV should not hold (`1_0`, Arabic-Indic digits), and a one-row
segment submission of tens of megabytes (its memory must not grow with the row)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_outcome import Outcome, record, yt8m_env, yt8m_here  # noqa: F401  (fixtures)

pytestmark = pytest.mark.hostile

HUGE = 5 << 20
LABELS = "VideoId,Labels\nv1,1 2\nv2,3\n"
RATED = "segment_id,class,score\nv1:0,3,1\nv1:5,3,0\nv2:0,10,1\n"


def write(path: Path, text: str | bytes) -> str:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def score(yt8m_here, tmp_path: Path, predictions: str | bytes, labels: str | bytes = LABELS, *flags: str):
    return yt8m_here("score", "--predictions", write(tmp_path / "predictions.csv", predictions), "--labels",
                write(tmp_path / "labels.csv", labels), "--num_classes", "20", *flags)


def segment_score(yt8m_here, tmp_path: Path, submission: str | bytes, *flags: str):
    return yt8m_here("score", "--segment_labels", "--predictions", write(tmp_path / "submission.csv", submission),
                "--labels", write(tmp_path / "rated.csv", RATED), "--num_classes", "20", *flags)


@pytest.mark.parametrize("line", [
    "v1" + " 1 0.5" * (HUGE // 6),  # no comma
    "v1,1 0.5 " + "x " * (HUGE // 2),  # a class id that is not one
    "v1,1 0.5 2 " + "y" * HUGE,  # a confidence that is not one
], ids=["no comma", "bad class", "bad confidence"])
def test_a_huge_bad_line_is_quoted_in_part(yt8m_here, tmp_path, line):
    outcome = score(yt8m_here, tmp_path, f"VideoId,LabelConfidencePairs\n{line}\n")
    error = outcome.assert_clean_error(f"{tmp_path / 'predictions.csv'}:2: ")
    assert len(error) < 600, len(error)


def test_a_huge_bad_segment_row_is_quoted_in_part(yt8m_here, tmp_path):
    outcome = segment_score(yt8m_here, tmp_path, "Class,Segments\n3,v1:0 " + "v1:x" * (HUGE // 4) + "\n")
    error = outcome.assert_clean_error(f"{tmp_path / 'submission.csv'}:2: malformed segment id")
    assert len(error) < 600, len(error)


@pytest.mark.parametrize("file", ["predictions", "labels"])
def test_bytes_that_are_not_utf8_are_named_by_file_and_line(yt8m_here, tmp_path, file):
    bad = b"VideoId,Labels\nv1,1 2\nv2,\xff3\n" if file == "labels" else \
        b"VideoId,LabelConfidencePairs\nv1,1 0.5\nv2,3 0.\xe95\n"
    outcome = score(yt8m_here, tmp_path, bad) if file == "predictions" else \
        score(yt8m_here, tmp_path, "VideoId,LabelConfidencePairs\nv1,1 0.5\n", bad)
    outcome.assert_clean_error(f"{tmp_path / f'{file}.csv'}:3: ", "UTF-8")


def test_a_segment_submission_that_is_not_utf8_is_named_by_file_and_line(yt8m_here, tmp_path):
    outcome = segment_score(yt8m_here, tmp_path, b"Class,Segments\n3,v1:0\n10,v2:0 \xffv2:5\n")
    outcome.assert_clean_error(f"{tmp_path / 'submission.csv'}:3: ", "UTF-8")


@pytest.mark.parametrize("field", ["1_0", "\u0663", "+3", "\uff13"], ids=["underscore", "arabic-indic", "plus",
                                                                            "fullwidth"])
def test_a_segment_class_must_be_ascii_digits(yt8m_here, tmp_path, field):
    outcome = segment_score(yt8m_here, tmp_path, f"Class,Segments\n{field},v1:0 v1:5\n")
    outcome.assert_clean_error(f"{tmp_path / 'submission.csv'}:2: the class must be an integer", repr(field))


def test_a_one_row_segment_submission_is_streamed(tmp_path, request):
    """A 29 MB row of 2.6 million ids, cut at --top_n 1000: the peak memory stays near that of the smallest one."""
    ids = " ".join(f"v{index}:{5 * (index % 7)}" for index in range(2_600_000))
    submission = write(tmp_path / "submission.csv", f"Class,Segments\n3,v1:0 {ids}\n10,v2:0\n")
    rated = write(tmp_path / "rated.csv", RATED)
    # VmHWM: this process's peak RSS (ru_maxrss would carry over the forking test process's).
    measure = ("import sys; from yt8m import cli; status = cli.main(sys.argv[1:]); "
               "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')), "
               "file=sys.stderr); sys.exit(status)")
    argv = ["score", "--segment_labels", "--predictions", submission, "--labels", rated, "--num_classes", "20",
            "--top_n", "1000"]
    peaks = {}
    for name, path in (("huge", submission), ("small", write(tmp_path / "small.csv", "Class,Segments\n3,v1:0\n"))):
        argv[3] = path
        done = subprocess.run([sys.executable, "-c", measure, *argv], capture_output=True, text=True, timeout=120,
                              env=yt8m_env())
        *log_lines, peak = done.stderr.splitlines()
        outcome = record(request.node.nodeid, Outcome("score", done.returncode, done.stdout, "\n".join(log_lines)))
        peaks[name] = int(peak) / 1024  # MB
        result = outcome.assert_success()
        if name == "huge":
            assert result["num_submitted_segments"] == 2_600_001 + 1 and result["segment_map"] == 1.0
    assert peaks["huge"] < peaks["small"] + 60, peaks  # parsed whole, the row took 430 MB more


@pytest.fixture(scope="module")
def frame_run(tmp_path_factory) -> dict:
    """A frame-level model trained a few steps on tiny segment shards: what `predict --segment_labels` needs."""
    from yt8m import cli

    root = tmp_path_factory.mktemp("frame_run")
    assert cli.main(["synth", "--output_dir", str(root), "--kind", "segment", "--num_classes", "6", "--train_videos",
                     "16", "--validate_videos", "4", "--test_videos", "0", "--shards", "1", "--feature_sizes", "4,2",
                     "--min_frames", "10", "--max_frames", "12", "--seed", "1"]) == 0
    assert cli.main(["train", "--frame_features", "--feature_names", "rgb,audio", "--feature_sizes", "4,2",
                     "--num_classes", "6", "--model", "FrameLevelLogisticModel", "--batch_size", "8",
                     "--num_readers", "0", "--num_epochs", "1", "--train_data_pattern",
                     str(root / "segment" / "train-*.tfrecord"), "--train_dir", str(root / "run")]) == 0
    return {"train_dir": str(root / "run"), "validate": str(root / "segment" / "validate-*.tfrecord")}


@pytest.mark.parametrize("field", ["\u0663", "\uff13"], ids=["arabic-indic", "fullwidth"])
def test_a_segment_class_list_must_be_ascii_digits(yt8m_here, frame_run, tmp_path, field):
    classes = write(tmp_path / "classes.csv", f"Index\n1\n{field}\n")
    output = tmp_path / "segments.csv"
    outcome = yt8m_here("predict", "--segment_labels", "--train_dir", frame_run["train_dir"], "--input_data_pattern",
                        frame_run["validate"], "--segment_label_ids_file", classes, "--output_file", str(output),
                        "--num_readers", "0")
    outcome.assert_clean_error(f"{classes}:3: expected a class index", repr(field))
    assert not output.exists()


def test_a_segment_class_list_that_is_not_utf8_is_named_by_line(yt8m_here, frame_run, tmp_path):
    classes = write(tmp_path / "classes.csv", b"Index\n1\n\xff2\n")
    outcome = yt8m_here("predict", "--segment_labels", "--train_dir", frame_run["train_dir"], "--input_data_pattern",
                        frame_run["validate"], "--segment_label_ids_file", classes, "--output_file",
                        str(tmp_path / "segments.csv"), "--num_readers", "0")
    outcome.assert_clean_error(f"{classes}:3: not UTF-8")

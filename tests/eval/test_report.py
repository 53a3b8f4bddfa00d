"""`yt8m eval --report FILE.html`'s streamed computations: the confusions and calibration against brute force, and
the TensorBoard event reader."""

from __future__ import annotations

import math
import pickle
from collections import Counter

import numpy as np
import pytest

from yt8m.data.tfrecord import TFRecordWriter
from yt8m.eval.curves import read_scalars
from yt8m.eval.diagnostics import Calibration, Confusions, Diagnostics


# --- the streamed computations against brute force ---------------------------------------------------------------

def example(seed: int, videos: int = 60, classes: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Scores with many ties (one decimal), some not predicted (-inf), bin edges and values outside [0, 1]; labels
    with videos of none and of every class."""
    rng = np.random.default_rng(seed)
    scores = np.round(rng.random((videos, classes)), 1).astype(np.float32)
    scores[rng.random(scores.shape) < 0.1] = -np.inf
    scores[0] = [0.0, 0.05, 0.5, 1.0, 1.3, -0.2, 0.95][:classes]
    labels = (rng.random((videos, classes)) < 0.3).astype(np.float32)
    labels[1] = 0
    labels[2] = 1
    scores[3] = -np.inf
    labels[3, 0] = 1
    return scores, labels


def brute_confusions(scores: np.ndarray, labels: np.ndarray) -> Counter:
    counts: Counter = Counter()
    for row, labelled in zip(scores.tolist(), labels.tolist()):
        others = [c for c in range(len(row)) if not labelled[c] and row[c] > -math.inf]
        if not any(labelled) or not others:
            continue
        confused = max(others, key=lambda c: (row[c], -c))  # the highest score, the lowest class among equals
        counts.update((true, confused) for true in range(len(row)) if labelled[true])
    return counts


def brute_calibration(scores: np.ndarray, labels: np.ndarray, bins: int) -> tuple[list, list, list, float]:
    pairs, positives, sums = [0] * bins, [0] * bins, [0.0] * bins
    for p, y in zip(scores.ravel().tolist(), labels.ravel().tolist()):
        p = min(max(p, 0.0), 1.0)
        index = min(int(p * bins), bins - 1)
        pairs[index] += 1
        positives[index] += int(y > 0)
        sums[index] += p
    ece = sum(abs(positives[b] / pairs[b] - sums[b] / pairs[b]) * pairs[b] for b in range(bins) if pairs[b])
    return pairs, positives, sums, ece / sum(pairs)


def test_confusions_count_each_labels_strongest_false_positive_as_brute_force_does():
    scores, labels = example(1)
    whole = Confusions(7)
    whole.update(scores, labels)
    expected = brute_confusions(scores, labels)
    true, confused, counts = whole.pairs()
    assert dict(zip(zip(true.tolist(), confused.tolist()), counts.tolist())) == dict(expected)
    # In batches, buffered and compacted often, merged from two accumulators (one pickled, as torchrun sends it):
    # the same counts.
    first, second = Confusions(7, compact_after=5), Confusions(7, compact_after=5)
    for start in range(0, 30, 7):
        first.update(scores[start:min(start + 7, 30)], labels[start:min(start + 7, 30)])
    second.update(scores[30:], labels[30:])
    first.merge(pickle.loads(pickle.dumps(second)))
    assert [array.tolist() for array in first.pairs()] == [array.tolist() for array in whole.pairs()]
    for cls in range(7):
        ranked = sorted(((count, -other) for (true_cls, other), count in expected.items() if true_cls == cls),
                        reverse=True)
        assert whole.most_confused(cls, 3) == [(-other, count) for count, other in ranked[:3]]


def test_calibration_bins_count_as_brute_force_does():
    scores, labels = example(2)
    for bins in (1, 10, 20):
        calibration = Calibration(bins)
        calibration.update(scores[:25], labels[:25])
        other = Calibration(bins)
        other.update(scores[25:], labels[25:])
        calibration.merge(pickle.loads(pickle.dumps(other)))
        pairs, positives, sums, ece = brute_calibration(scores, labels, bins)
        assert calibration.counts.tolist() == pairs and calibration.positives.tolist() == positives
        assert calibration.probability_sums == pytest.approx(sums, abs=1e-12)
        assert calibration.expected_calibration_error() == pytest.approx(ece, abs=1e-12)
    # The edges: 0.05 opens bin 1 of 20, 1.0 (and above) closes the top bin, below 0 counts as 0.
    calibration = Calibration(20)
    calibration.update(np.array([[0.0, 0.05, 0.5, 1.0, 1.3, -0.2]], np.float32), np.zeros((1, 6)))
    assert np.flatnonzero(calibration.counts).tolist() == [0, 1, 10, 19]
    assert calibration.counts[[0, 1, 10, 19]].tolist() == [2, 1, 1, 2]
    assert Calibration(4).expected_calibration_error() == 0.0


def test_diagnostics_refuse_mismatched_shapes():
    with pytest.raises(ValueError, match="equal"):
        Diagnostics(3).update(np.zeros((2, 3), np.float32), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="expected 3"):
        Confusions(3).update(np.zeros((2, 4), np.float32), np.zeros((2, 4)))


# --- the TensorBoard event files, read without tensorboard --------------------------------------------------------

def test_tensor_scalars_and_a_cut_record(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

    def event(step: int, tag: str, tensor) -> bytes:
        value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
        return event_pb2.Event(wall_time=float(step), step=step, summary=summary_pb2.Summary(value=[value])
                               ).SerializeToString()

    path = tmp_path / "events.out.tfevents.1.host.1.0"
    with TFRecordWriter(str(path)) as writer:
        writer.write(event_pb2.Event(wall_time=0.0, file_version="brain.Event:2").SerializeToString())
        writer.write(event(1, "f", tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[0.25])))
        writer.write(event(2, "d", tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE,
                                                          tensor_content=np.float64(0.125).tobytes())))
        writer.write(event(3, "text", tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"x"])))
        writer.write(event(4, "many", tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.0, 2.0])))
    with open(path, "ab") as fh:  # a writer still at work: half a record
        fh.write(b"\x40\x00\x00\x00\x00\x00\x00\x00abc")
    assert read_scalars(str(tmp_path)) == {"d": [(2, 0.125)], "f": [(1, 0.25)]}
    assert read_scalars(str(tmp_path / "nothing_here")) == {}

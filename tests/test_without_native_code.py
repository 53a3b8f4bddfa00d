"""Without the compiled extensions (an install without a C compiler; here YT8M_NATIVE=0), the commands run the Python
fallbacks, log which path runs, and give what the native code gives. The switches are read once, from the
environment, so each case is a process of its own."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, tiny_data  # noqa: F401  (a fixture)
from yt8m import kernels
from yt8m.data.format import tfrecord

needs_native = pytest.mark.skipif(tfrecord.native is None or kernels.native is None,
                                  reason="compares with the native code, which is not built (or YT8M_NATIVE=0)")


def run(environment: dict[str, str], *args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **environment})


def predictions(path) -> dict[str, dict[int, float]]:
    with open(path) as fh:
        rows = list(csv.reader(fh))[1:]
    return {video_id: {int(label): float(confidence) for label, confidence in zip(pairs.split()[::2],
                                                                                 pairs.split()[1::2])}
            for video_id, pairs in rows}


@needs_native
def test_train_and_predict_give_the_same_results_without_native_code(tiny_data, tmp_path):  # noqa: F811
    results = {}
    for environment in ({}, {"YT8M_NATIVE": "0"}):
        train_dir = tmp_path / f"run{len(results)}"
        train = run(environment, "-m", "yt8m", "train", "--train_data_pattern", tiny_data["train_pattern"],
                    "--train_dir", train_dir, "--model", "MoeModel", "--feature_names", "mean_rgb,mean_audio",
                    "--feature_sizes", ",".join(map(str, FEATURE_SIZES)), "--num_classes", NUM_CLASSES,
                    "--batch_size", 64, "--num_epochs", 2, "--num_readers", 0, "--seed", 7)
        assert train.returncode == 0, train.stderr
        predict = run(environment, "-m", "yt8m", "predict", "--input_data_pattern", tiny_data["test_pattern"],
                      "--train_dir", train_dir, "--output_file", train_dir / "predictions.csv", "--top_k", 5)
        assert predict.returncode == 0, predict.stderr
        results[json.dumps(environment)] = (json.loads(train.stdout.splitlines()[-1]), train.stderr,
                                            predictions(train_dir / "predictions.csv"))
    (native, native_log, native_predictions), (fallback, fallback_log, fallback_predictions) = results.values()
    assert "native TFRecord decoding: on" in native_log and "fused CPU training kernels: on" in native_log
    assert "native TFRecord decoding: off (YT8M_NATIVE=0)" in fallback_log
    assert "fused CPU training kernels: off (YT8M_NATIVE=0)" in fallback_log
    assert fallback["global_step"] == native["global_step"] == 8
    assert fallback["loss"] == pytest.approx(native["loss"], abs=1e-5)
    assert fallback_predictions.keys() == native_predictions.keys() and len(native_predictions) == 48
    for video_id, confidences in native_predictions.items():
        assert fallback_predictions[video_id] == pytest.approx(confidences, abs=2e-6), video_id


@needs_native
@pytest.mark.parametrize("value, expected", [("", "dbof,moe"), ("1", "dbof,moe"), ("0", ""), (" moe, ", "moe")])
def test_the_fused_kernels_switch_is_read_from_the_environment(value, expected):
    code = "from yt8m import kernels; print(','.join(kernels.enabled_kernels()))"
    result = run({"YT8M_FUSED_KERNELS": value}, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_an_unknown_kernel_in_the_switch_is_an_error_naming_the_known_ones():
    result = run({"YT8M_FUSED_KERNELS": "moe,adam"}, "-c", "from yt8m import kernels; kernels.enabled_kernels()")
    assert "ValueError: YT8M_FUSED_KERNELS: unknown fused kernel adam; known: moe, dbof" in result.stderr

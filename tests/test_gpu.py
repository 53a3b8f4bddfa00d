"""The CUDA path, run where a GPU is (`pytest -m gpu`; skipped elsewhere): training with and without mixed precision,
evaluation and prediction on the GPU, the CPU-only fused kernels' eager fallback, and NCCL across two GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from workflow_fixtures import as_flags, tiny_data, tiny_train_config  # noqa: F401
from yt8m.config import config_values
from yt8m.models import create_model

pytestmark = pytest.mark.gpu


def yt8m(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yt8m", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("mixed_precision", [False, True])
def test_train_evaluate_and_predict_on_the_gpu(tiny_data, tmp_path, mixed_precision):
    train_dir = tmp_path / "run"
    flags = as_flags({**config_values(tiny_train_config(tiny_data, train_dir)), "device": "cuda",
                      "mixed_precision": mixed_precision})
    trained = yt8m("train", *flags)
    assert trained.returncode == 0, trained.stderr
    assert "on cuda" in trained.stderr
    evaluated = yt8m("eval", "--train_dir", train_dir, "--run_once", "--device", "cuda",
                     "--eval_data_pattern", tiny_data["validate_pattern"])
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["gap"] > 0.3
    on_gpu, on_cpu = tmp_path / "gpu.csv", tmp_path / "cpu.csv"
    for device, output in (("cuda", on_gpu), ("cpu", on_cpu)):
        predicted = yt8m("predict", "--train_dir", train_dir, "--input_data_pattern", tiny_data["test_pattern"],
                         "--output_file", output, "--output_format", "jsonl", "--device", device)
        assert predicted.returncode == 0, predicted.stderr
    for gpu_line, cpu_line in zip(on_gpu.read_text().splitlines(), on_cpu.read_text().splitlines()):
        gpu_row, cpu_row = json.loads(gpu_line), json.loads(cpu_line)
        assert gpu_row["video_id"] == cpu_row["video_id"]
        assert gpu_row["predictions"] == pytest.approx(cpu_row["predictions"], abs=1e-4)


@pytest.mark.parametrize("name", ["MoeModel", "DbofModel"])
def test_models_with_cpu_kernels_run_their_eager_path_on_the_gpu(name):
    """The fused kernels are CPU float32 only: on CUDA the same model runs eager PyTorch, with the same outputs
    and gradients as the CPU (where the kernels run)."""
    torch.manual_seed(0)
    hparams = {"dbof_cluster_size": 64, "dbof_hidden_size": 32, "iterations": 8}
    model = create_model(name, 24, 10, **hparams)
    frames = name == "DbofModel"
    features = torch.randn(16, 12, 24) if frames else torch.randn(16, 24)
    num_frames = torch.full((16,), 12) if frames else None
    cpu = model.eval()(features, num_frames)["predictions"]
    gpu_model = model.to("cuda")
    gpu = gpu_model(features.cuda(), None if num_frames is None else num_frames.cuda())["predictions"]
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-5)
    gpu.sum().backward()
    assert all(p.grad is None or p.grad.is_cuda for p in gpu_model.parameters())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL across processes needs two GPUs")
def test_two_processes_train_over_nccl(tiny_data, tmp_path):
    flags = as_flags({**config_values(tiny_train_config(tiny_data, tmp_path / "run", batch_size=32)), "device": "cuda"})
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "-m", "yt8m", "train", *flags], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert "joined the nccl process group" in result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["processes"] == 2

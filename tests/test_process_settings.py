"""Process-wide settings: the training commands' (malloc keeps freed blocks, denormals flush to 0, idle OpenMP threads
sleep) and the streaming commands' (large blocks stay mapped); `import yt8m` makes none, and no command's printed
values depend on them: they come out as stored or computed."""

import ctypes
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import as_float32, load_sidecar

MALLOC_PROBE = """
import ctypes, sys
import numpy as np
import yt8m
from yt8m.process_settings import map_frame_batch_blocks, map_large_blocks, reuse_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

if sys.argv[1] == "reuse":
    reuse_freed_memory()
if sys.argv[1] == "map":
    map_large_blocks()
if sys.argv[1] == "frames":  # a frame-level training process
    reuse_freed_memory()
    map_frame_batch_blocks()
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
size = int(sys.argv[2])
if len(sys.argv) > 3:  # free a mapped block of this size first: glibc raises its threshold to it by default
    np.ones(int(sys.argv[3]), np.uint8)
block = np.ones(size, np.uint8)
print(mallinfo2().hblkhd >= size)
"""


def mapped_on_its_own(mode: str, size: int = 64 << 20, freed_before: int = 0) -> bool:
    argv = [sys.executable, "-c", MALLOC_PROBE, mode, str(size), *([str(freed_before)] if freed_before else [])]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip() == "True"


def skip_without_mallinfo2() -> None:
    try:
        ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError, TypeError):
        pytest.skip("not glibc 2.33+: no mallinfo2 to look with")


def test_large_blocks_come_from_the_heap_after_reuse_freed_memory_only():
    skip_without_mallinfo2()
    assert mapped_on_its_own("default")  # 64 MB: mapped on its own by default; importing yt8m did not change malloc
    assert not mapped_on_its_own("reuse")


def test_batch_sized_blocks_stay_mapped_after_map_large_blocks():
    """glibc's adjusted threshold served blocks of a batch's size from the heap, which then grew with the batches."""
    skip_without_mallinfo2()
    assert not mapped_on_its_own("default", 4 << 20, freed_before=16 << 20)
    assert mapped_on_its_own("map", 4 << 20, freed_before=16 << 20)


def test_frame_batch_sized_blocks_are_mapped_in_frame_level_training_and_smaller_ones_reused():
    """A frame batch's float32 copies (1.4 GB at batch 1024) left the reusing heap split and growing every step."""
    skip_without_mallinfo2()
    assert mapped_on_its_own("frames", 64 << 20) and not mapped_on_its_own("reuse", 64 << 20)
    assert not mapped_on_its_own("frames", 16 << 20)  # a video-level batch's tensors: still from the heap


DENORMAL_PROBE = """
import sys, threading
import torch
import yt8m
from yt8m.process_settings import configure_training_process

if sys.argv[1] == "configured":
    configure_training_process()
product = lambda: (torch.tensor([1e-30]) * torch.tensor([1e-10])).item()  # 1e-40: a float32 denormal
in_thread = []
thread = threading.Thread(target=lambda: in_thread.append(product()))  # started after the setting: inherits it
thread.start()
thread.join()
print(product(), in_thread[0])
"""


def denormal_products(mode: str) -> list[float]:
    result = subprocess.run([sys.executable, "-c", DENORMAL_PROBE, mode], capture_output=True, text=True, check=True)
    return [float(value) for value in result.stdout.split()]


def test_denormals_flush_only_after_configure_training_process():
    assert all(0 < value < 1e-38 for value in denormal_products("default"))  # importing yt8m did not flush them
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush denormals")
    assert denormal_products("configured") == [0.0, 0.0]


def openmp_wait_policy(env: dict, configure: bool) -> str:
    """OMP_WAIT_POLICY as torch's OpenMP runtime would read it, in a fresh process."""
    setup = "from yt8m.process_settings import configure_training_process; configure_training_process(); " \
        if configure else ""
    probe = f"import os, yt8m; {setup}import torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


def test_idle_openmp_threads_sleep_in_training_processes_unless_the_user_chose():
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    assert openmp_wait_policy(env, configure=False) == "None"  # a library import sets nothing
    assert openmp_wait_policy(env, configure=True) == "PASSIVE"
    assert openmp_wait_policy({**env, "OMP_WAIT_POLICY": "ACTIVE"}, configure=True) == "ACTIVE"


def yt8m(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yt8m", *args], capture_output=True, text=True)


def bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("name", ["train00", "train02"])
def test_inspect_prints_extreme_floats_as_stored_bit_for_bit(fixtures_dir, name):
    path = fixtures_dir / "video" / f"{name}.tfrecord"
    sidecar = load_sidecar(path)
    extreme = [case["index"] for case in sidecar["edge_cases"] if case["what"].startswith("extreme floats")]
    assert extreme, "the fixture lists its extreme-float records"
    result = yt8m("inspect", str(path), "--json")
    assert result.returncode == 0, result.stderr
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(printed) == len(sidecar["records"])
    for record, expected in zip(printed, sidecar["records"]):
        for feature in ("mean_rgb", "mean_audio"):
            np.testing.assert_array_equal(bits(record["features"][feature]), bits(as_float32(expected[feature])),
                                          err_msg=f"{name} record {expected['index']} {feature}")
    subnormal = [value for index in extreme for value in printed[index]["features"]["mean_rgb"]
                 if 0 < abs(value) < np.finfo(np.float32).tiny]
    assert subnormal, "the extreme-float records hold subnormals, which a flushing process prints as 0.0"


def test_score_ranks_denormal_confidences_as_computed(tmp_path):
    """Two videos whose confidences differ only as denormals: flushed to zero they would tie, and the tie order
    (video order) would put the wrong video first."""
    labels = tmp_path / "labels.csv"
    labels.write_text("VideoId,Labels\na,1\nb,0\n")
    predictions = tmp_path / "predictions.csv"
    predictions.write_text("VideoId,LabelConfidencePairs\na,0 2e-40 1 1e-40\nb,0 3e-40 1 4e-45\n")
    result = yt8m("score", "--predictions", str(predictions), "--labels", str(labels), "--num_classes", "2",
                  "--top_k", "1")
    assert result.returncode == 0, result.stderr
    scores = json.loads(result.stdout)
    # a's top-1 is class 0 (2e-40 > 1e-40): a miss; b's is class 0 (3e-40): a hit. Flushed, both would tie
    # (class 0 first by index) with the same hits, but the pooled ranking must put b's 3e-40 above a's 2e-40.
    assert scores["hit_at_one"] == 0.5
    assert scores["gap"] == 0.5  # pooled: b (3e-40, positive) first, then a (2e-40, negative): AP = 1/1 / 2 labels

"""Process settings of the `yt8m` command: malloc keeps freed blocks of every size for reuse, denormals flush to 0,
idle OpenMP threads sleep."""

import ctypes
import os
import subprocess
import sys

import pytest
import torch

PROBE = """
import ctypes, sys
import numpy as np
from yt8m.runtime import map_large_blocks, reuse_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

if sys.argv[1] == "reuse":
    reuse_freed_memory()
if sys.argv[1] == "map":
    map_large_blocks()
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
size = int(sys.argv[2])
if len(sys.argv) > 3:  # free a mapped block of this size first: glibc raises its threshold to it by default
    np.ones(int(sys.argv[3]), np.uint8)
block = np.ones(size, np.uint8)
print(mallinfo2().hblkhd >= size)
"""


def mapped_on_its_own(mode: str, size: int = 64 << 20, freed_before: int = 0) -> bool:
    argv = [sys.executable, "-c", PROBE, mode, str(size), *([str(freed_before)] if freed_before else [])]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip() == "True"


def skip_without_mallinfo2() -> None:
    try:
        ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError, TypeError):
        pytest.skip("not glibc 2.33+: no mallinfo2 to look with")


def test_large_blocks_come_from_the_heap_after_reuse_freed_memory():
    skip_without_mallinfo2()
    assert mapped_on_its_own("default")  # 64 MB: mapped on its own by default
    assert not mapped_on_its_own("reuse")


def test_batch_sized_blocks_stay_mapped_after_map_large_blocks():
    """glibc's adjusted threshold served blocks of a batch's size from the heap, which then grew with the batches."""
    skip_without_mallinfo2()
    assert not mapped_on_its_own("default", 4 << 20, freed_before=16 << 20)
    assert mapped_on_its_own("map", 4 << 20, freed_before=16 << 20)


DENORMAL_PROBE = """
import sys, threading
import torch
from yt8m.runtime import configure_process

if sys.argv[1] == "configured":
    configure_process()
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


def test_configure_process_flushes_denormals_in_this_thread_and_later_ones():
    assert all(0 < value < 1e-38 for value in denormal_products("default"))
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush denormals")
    assert denormal_products("configured") == [0.0, 0.0]


def openmp_wait_policy(env: dict) -> str:
    """OMP_WAIT_POLICY as torch's OpenMP runtime would read it after `import yt8m`, in a fresh process."""
    probe = "import os, yt8m, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


def test_importing_yt8m_first_makes_idle_openmp_threads_sleep_unless_the_user_chose():
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    assert openmp_wait_policy(env) == "PASSIVE"
    assert openmp_wait_policy({**env, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"

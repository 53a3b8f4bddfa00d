"""Process settings of the `yt8m` command: malloc keeps freed blocks of every size for reuse."""

import ctypes
import subprocess
import sys

import pytest

PROBE = """
import ctypes, sys
import numpy as np
from yt8m.runtime import reuse_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

if sys.argv[1] == "reuse":
    reuse_freed_memory()
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
block = np.ones(64 << 20, np.uint8)  # 64 MB: mapped on its own by default
print(mallinfo2().hblkhd >= 64 << 20)
"""


def mapped_on_its_own(mode: str) -> bool:
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return result.stdout.strip() == "True"


def test_large_blocks_come_from_the_heap_after_reuse_freed_memory():
    try:
        ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError, TypeError):
        pytest.skip("not glibc 2.33+: no mallinfo2 to look with")
    assert mapped_on_its_own("default")
    assert not mapped_on_its_own("reuse")

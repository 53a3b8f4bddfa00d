"""Inference: predictions from checkpoints and ONNX exports (video and 2019 segment), the ONNX export, and
ensembles of runs, exports and prediction files."""

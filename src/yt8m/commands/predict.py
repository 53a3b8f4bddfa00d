"""`yt8m predict` (the starter kit's inference.py flags): each video's top-k classes as a Kaggle CSV or JSON lines, or
with --segment_labels each class's best 2019 segments (Class,Segments), from a train dir's newest readable checkpoint
or an ONNX export; prints one JSON summary line. Under torchrun (`torchrun --nproc_per_node N -m yt8m predict ...`)
the processes split the shards and rank 0 writes the one output file."""

from __future__ import annotations

import json
import logging
from typing import Sequence

from yt8m.commands.command_line import read_command
from yt8m.distributed.ranks import env_rank, exit_without_teardown, launched_by_torchrun
from yt8m.inference.config import PredictConfig
from yt8m.inference.predict import run_predict
from yt8m.runtime import setup_logging


def main(argv: Sequence[str]) -> int:
    config = read_command(PredictConfig, argv, "yt8m predict", __doc__)
    setup_logging(logging.INFO if env_rank() == 0 else logging.WARNING)
    summary = run_predict(config)
    if env_rank() == 0:
        print(json.dumps(summary), flush=True)
    if launched_by_torchrun():
        exit_without_teardown(0)
    return 0

"""`yt8m export`: a train dir's newest readable checkpoint (or a given one) as an ONNX model with its metadata JSON,
for serving and `yt8m predict --model`; prints one JSON line."""

from __future__ import annotations

import json
import logging
from typing import Sequence

from yt8m.commands.command_line import read_command
from yt8m.inference.exporting import ExportConfig, run_export
from yt8m.inference.onnx_export import GRAPH_NOTES
from yt8m.runtime import setup_logging


def main(argv: Sequence[str]) -> int:
    config = read_command(ExportConfig, argv, "yt8m export", __doc__, epilog=GRAPH_NOTES)
    setup_logging()
    for chatty in ("onnxscript", "onnx_ir"):  # their INFO lines narrate every optimizer pass
        logging.getLogger(chatty).setLevel(logging.WARNING)
    print(json.dumps(run_export(config)), flush=True)
    return 0

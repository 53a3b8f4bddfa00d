"""`yt8m score`: a Kaggle-format submission (`VideoId,LabelConfidencePairs`) scored against a ground-truth file
(`VideoId,Labels`) or labelled shards with the starter kit's metrics, or with --segment_labels a 2019 segment submission
(`Class,Segments`) scored against rated segments with mAP@K; prints one JSON object."""

from __future__ import annotations

import json
from typing import Sequence

from yt8m.commands.command_line import read_command
from yt8m.eval.scoring import ScoreConfig, run_score
from yt8m.runtime import setup_logging


def main(argv: Sequence[str]) -> int:
    config = read_command(ScoreConfig, argv, "yt8m score", __doc__)
    setup_logging()
    print(json.dumps(run_score(config)))
    return 0

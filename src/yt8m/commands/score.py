"""`yt8m score`: a Kaggle-format submission (`VideoId,LabelConfidencePairs`) scored against a ground-truth file
(`VideoId,Labels`) or labelled shards with the starter kit's metrics, or with --segment_labels a 2019 segment submission
(`Class,Segments`) scored against rated segments with mAP@K; prints one JSON object."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Sequence

from yt8m.commands.command_line import read_command
from yt8m.eval.score import score_class_count, score_files
from yt8m.eval.segment_metrics import DEFAULT_TOP_N
from yt8m.eval.segment_score import score_segment_files
from yt8m.fields import setting
from yt8m.runtime import setup_logging


@dataclass(frozen=True)
class ScoreConfig:
    """What `yt8m score` scores against what."""

    predictions: str = setting("", "Kaggle CSV: VideoId,LabelConfidencePairs (with --segment_labels: Class,Segments).",
                               required=True)
    labels: str = setting("", "The ground truth: a CSV (.csv: VideoId,Labels, space-separated; `yt8m inspect "
                              "--write_labels_csv` writes it) or the labelled TFRecord shards themselves "
                              "(comma-separated paths or globs). With --segment_labels: shards or a label CSV "
                              "(segment_id,class,score).", required=True)
    top_k: int = setting(20, "Predictions per video that count.", at_least=1)
    num_classes: Optional[int] = setting(None, "Number of classes, those map_all_classes averages over (default: "
                                               "the --train_dir run's, else --vocabulary_file's, else 3862, the 2018 "
                                               "vocabulary's, with a log line saying so).", at_least=1)
    train_dir: str = setting("", "The run that made the predictions: its config.yaml gives --num_classes.")
    vocabulary_file: str = setting("", "A vocabulary CSV (an Index column, the 2018 vocabulary.csv's): its largest "
                                       "Index + 1 gives --num_classes.")
    allow_missing: bool = setting(False, "Score labelled videos without predictions as predicting nothing and ignore "
                                         "predictions for unknown videos (with a warning) instead of failing.")
    segment_labels: bool = setting(False, "The 2019 segment task: score a Class,Segments submission with mAP@K over "
                                          "classes.")
    top_n: int = setting(DEFAULT_TOP_N, "With --segment_labels: segments per class that count, K.", at_least=1)
    write_labels_csv: str = setting("", "With --segment_labels: also write the rated segments read as a label CSV, "
                                        "faster to read next time.")


def main(argv: Sequence[str]) -> int:
    config = read_command(ScoreConfig, argv, "yt8m score", __doc__)
    setup_logging()
    num_classes = score_class_count(config.num_classes, config.train_dir, config.vocabulary_file)
    if config.segment_labels:
        result = score_segment_files(config.predictions, config.labels, top_n=config.top_n,
                                     num_classes=num_classes, write_labels_csv=config.write_labels_csv)
    else:
        result = score_files(config.predictions, config.labels, top_k=config.top_k, num_classes=num_classes,
                             allow_missing=config.allow_missing)
    print(json.dumps(result))
    return 0

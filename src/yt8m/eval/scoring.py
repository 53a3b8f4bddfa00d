"""What `yt8m score` scores against what (ScoreConfig), and the scoring: a Kaggle submission against its ground
truth with the starter kit's metrics, or a 2019 segment submission with mAP@K; the command and the Python API run
this."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from yt8m.eval.score import score_class_count, score_files
from yt8m.eval.segment_metrics import DEFAULT_TOP_N
from yt8m.eval.segment_score import score_segment_files
from yt8m.fields import setting


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


def run_score(config: ScoreConfig) -> dict[str, Any]:
    """The scores `yt8m score` prints, over the classes --num_classes, the run or the vocabulary says."""
    num_classes = score_class_count(config.num_classes, config.train_dir, config.vocabulary_file)
    if config.segment_labels:
        return score_segment_files(config.predictions, config.labels, top_n=config.top_n,
                                   num_classes=num_classes, write_labels_csv=config.write_labels_csv)
    return score_files(config.predictions, config.labels, top_k=config.top_k, num_classes=num_classes,
                       allow_missing=config.allow_missing)

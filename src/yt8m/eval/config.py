"""`EvalConfig`, everything `yt8m eval` needs, in sections: the shards it reads, the run's features, model and loss
(the train dir's where not given), which checkpoints it evaluates, and what it reports."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from yt8m.config import STARTER_TRAIN_DIR
from yt8m.data.reading.spec import FeatureSpec, num_readers_setting, skip_corrupt_setting
from yt8m.distributed.ranks import device_setting
from yt8m.eval.reference import reference_problem
from yt8m.eval.segment_metrics import top_n_setting
from yt8m.fields import setting
from yt8m.models.config import ModelConfig
from yt8m.tasks.losses import LossConfig
from yt8m.tasks.metrics import metrics_problem


@dataclass(frozen=True)
class ModelReading:
    """How a command that runs a model over shards (eval, predict) reads them, and where the model runs."""

    batch_size: int = setting(1024, "Examples per batch.", at_least=1)
    num_readers: str = num_readers_setting()
    skip_corrupt: bool = skip_corrupt_setting()
    device: str = device_setting()


@dataclass(frozen=True)
class EvalDataConfig(ModelReading):
    """The `data` section of eval: the shards evaluated on, and how they are read."""

    eval_data_pattern: str = setting("", "File glob(s) of the shards to evaluate on; comma-separated for several.",
                                     required=True)


@dataclass(frozen=True)
class WatchConfig:
    """The `checkpoints` section of eval: whose checkpoints, the latest once or each new one as it comes."""

    train_dir: str = setting(STARTER_TRAIN_DIR, "The train dir whose checkpoints are evaluated.", required=True)
    run_once: bool = setting(False, "Evaluate the latest checkpoint and exit, instead of watching for new ones.")
    poll_interval_secs: float = setting(10.0, "Watch mode: seconds between looks for a new checkpoint.", above=0)


@dataclass(frozen=True)
class ReportConfig:
    """The `report` section of eval: the metrics' depths, the per-class CSV and the HTML report."""

    top_k: int = setting(20, "Predictions per video counted by GAP.", at_least=1)
    top_n: int = top_n_setting()
    metrics: list[str] = setting([], "Metrics of one's own to report beside the task's own (NAME, import path "
                                     "package.module:Name, or NAME(arg=value)); default: those the run validated "
                                     "with (its --metrics and --best_metric).", check=metrics_problem, resolves=True)
    per_class: str = setting("", "Also write each class's AP, positives and training videos, with its name and "
                                 "vertical, to this CSV (which classes are hard); with the plots extra, plots beside "
                                 "it: AP against training frequency, AP by vertical.")
    report: str = setting("", "Also write an evaluation report to this HTML file (needs the plots extra): one "
                              "self-contained page (figures inside it, nothing fetched from the network) with what "
                              "was evaluated (train dir, step, model and hyper-parameters, features, data), the "
                              "metrics and what each means, AP against training frequency and by vertical, the "
                              "classes of lowest AP with the classes each is most taken for, a reliability plot "
                              "with the expected calibration error, and the run's training and validation curves "
                              "(its TensorBoard event files). Watching, it is rewritten for each new checkpoint.")
    compare_to: str = setting("", "With --report: what the report's headline is compared with: figures stated "
                                  "elsewhere (gap=0.7035,map=0.331, a recipe's; a bare number is a GAP), another "
                                  "run's train dir (its latest evaluation, eval/metrics-<step>.json), or a metrics "
                                  "JSON file (eval's JSON line).", check=reference_problem, resolves=True)
    vocabulary_file: str = setting("", "With --per_class or --report: the label vocabulary CSV (the 2018 "
                                       "vocabulary.csv: Index, Name, Vertical1, TrainVideoCount) naming the classes; "
                                       "default: the train dir's. Its TrainVideoCount, where present, is the training "
                                       "frequency; else the train dir's training shards are counted.")


@dataclass(frozen=True)
class EvalConfig:
    """Everything `yt8m eval` needs; the features, model and loss not given are the train dir's (its checks are
    yt8m.eval.evaluate's)."""

    data: EvalDataConfig = dataclasses.field(default_factory=EvalDataConfig)
    features: FeatureSpec = dataclasses.field(default_factory=FeatureSpec)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    checkpoints: WatchConfig = dataclasses.field(default_factory=WatchConfig)
    report: ReportConfig = dataclasses.field(default_factory=ReportConfig)

    def problems(self) -> list[str]:
        flags = [f"--{name}" for name in ("per_class", "report") if getattr(self.report, name)]
        if flags and self.features.segment_labels:
            return [f"{' and '.join(flags)} {'reports' if len(flags) == 1 else 'report'} the classes of video "
                    "labels: it does not take --segment_labels"]
        return []

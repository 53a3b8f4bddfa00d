"""`TrainConfig`, everything `yt8m train` needs, in sections: each a frozen dataclass of settings owned by the
component it configures (the data, features, model, loss, optimizer, learning-rate schedule, schedule, checkpoints,
validation, tasks, distillation and runtime), each handed only to what it configures. Flags and flat YAML name the
settings directly."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from yt8m.config import STARTER_TRAIN_DIR
from yt8m.data.reading.spec import DataConfig, FeatureSpec
from yt8m.distributed.ranks import device_setting
from yt8m.fields import setting
from yt8m.models.config import ModelConfig
from yt8m.tasks.losses import LossConfig
from yt8m.tasks.spec import MainTask, TasksConfig
from yt8m.tasks.teacher import DistillationConfig
from yt8m.training.augment import AugmentConfig
from yt8m.training.optim import OptimizerConfig
from yt8m.training.schedules import LRScheduleConfig
from yt8m.training.validation import ValidationConfig


@dataclass(frozen=True)
class ScheduleConfig:
    """The `schedule` section: how long training runs and how examples make a step."""

    batch_size: int = setting(1024, "Examples per batch in each process; one optimizer step takes the global batch "
                                    "batch_size x processes x --numbatches_to_aggregate (4 torchrun processes with "
                                    "--batch_size 256 step on 1024 examples, as one process with 1024).", at_least=1)
    num_epochs: int = setting(5, "Passes over the training data.", at_least=1)
    max_steps: Optional[int] = setting(None, "Stop after this many steps (None: after --num_epochs; 0 writes the "
                                             "initialized model, e.g. from --init_from, as the step-0 checkpoint).",
                                       at_least=0)
    numbatches_to_aggregate: int = setting(1, "Accumulate gradients over this many batches per optimizer step: the "
                                              "same update as one batch this many times larger.", at_least=1)
    seed: int = setting(0, "Seed for initialization, shuffling and sampling.", at_least=0)

    def global_batch(self, world_size: int) -> int:
        """Examples in one optimizer step across `world_size` processes."""
        return self.batch_size * world_size * self.numbatches_to_aggregate


@dataclass(frozen=True)
class CheckpointConfig:
    """The `checkpoints` section: the train dir, how often and how many checkpoints are kept, and where a new run
    starts from."""

    train_dir: str = setting(STARTER_TRAIN_DIR, "Directory for checkpoints, logs and the resolved config.",
                             required=True)
    export_model_steps: int = setting(1000, "Write a checkpoint every this many steps (0: none by step count, only "
                                              "--checkpoint_every_epoch's and the last).", at_least=0)
    checkpoint_every_epoch: bool = setting(False, "Also write a checkpoint at the end of every epoch (evaluated with "
                                                  "--eval_data_pattern, as every checkpoint is).")
    checkpoint_at_examples: list[int] = setting([], "Also write a checkpoint (evaluated, as every checkpoint is) at "
                                                    "the first step end at or past each of these counts of training "
                                                    "examples, summed over processes (comma-separated; yt8m tune's "
                                                    "rungs with --resource examples).")
    keep_checkpoints: int = setting(5, "Keep only the newest N periodic checkpoints.", at_least=1)
    start_new_model: bool = setting(False, "Delete the train dir's checkpoints and start from scratch.")
    init_from: str = setting("", "A new run starts from the parameters of this checkpoint (or train dir) that match "
                                 "by name and shape; the log lists what was not loaded.")
    resume_with_changes: bool = setting(False, "Resume a checkpoint even where this run's hyper-parameters (the "
                                               "model's, the loss's, the optimizer's and its schedule's, the "
                                               "augmentation's, --best_metric) differ from those it was trained "
                                               "with: each change is logged and recorded in config.yaml "
                                               "(resume_changes). Without it such a resume is refused, naming "
                                               "each difference.")
    resume_changes: list[str] = setting([], "The record of the changes earlier resumes were allowed (`step N: --flag "
                                            "old -> new`), written by yt8m train into config.yaml; not for setting "
                                            "by hand (a resume keeps its checkpoint's record).")


MEMORY_CHECKS = ("refuse", "warn", "off")


@dataclass(frozen=True)
class RuntimeConfig:
    """The `runtime` section: the device and its numerics, compilation, logging, processes and the model-size
    limit: how a run executes, not what it learns."""

    device: str = device_setting()
    log_device_placement: bool = setting(False, "The starter kit's TensorFlow flag: accepted and logged, no effect "
                                                "(the log names the device every run trains on).")
    mixed_precision: bool = setting(False, "Train with autocast: CUDA bfloat16 (float16 with loss scaling where the "
                                           "GPU lacks it); CPU bfloat16, fast where the CPU has AMX or AVX512-BF16.")
    compile: bool = setting(False, "torch.compile the forward pass and loss: fused elementwise work, after a compile "
                                   "at start.")
    log_every_steps: int = setting(1, "Log the step's loss and examples/s every this many steps.", at_least=1)
    metrics_every_steps: int = setting(10, "Log and summarize the batch's Hit@1, PERR and GAP every this many steps.",
                                       at_least=1)
    num_gpu: int = setting(1, "GPUs to train on, one process each: above 1, `yt8m train` relaunches itself under "
                              "torchrun (--nproc_per_node N); under torchrun it is informational.", at_least=1)
    max_model_size_mb: float = setting(0.0, "Refuse, before training starts, a model whose parameters and buffers "
                                            "take more than this many MB as float32 (0: no limit; the Kaggle 2018 "
                                            "limit was 1 GB, --max_model_size_mb 1024).", at_least=0)
    memory_check: str = setting("refuse", "Where the run's reckoning of the memory it will take (gradients, optimizer "
                                          "state, batches, shuffle buffers) exceeds what its cgroup's limit leaves at "
                                          "the start: refuse (one line, before the kernel's kill), warn and train, or "
                                          "off. The machine's own memory, which other processes may free, is only "
                                          "warned of.", choices=lambda: MEMORY_CHECKS)


@dataclass(frozen=True)
class TrainConfig:
    """Everything `yt8m train` needs, in sections. Its checks across sections (the model against the features, the
    tasks, the teacher, what train-and-evaluate needs) are yt8m.training.checks'."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    features: FeatureSpec = dataclasses.field(default_factory=FeatureSpec)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    lr_schedule: LRScheduleConfig = dataclasses.field(default_factory=LRScheduleConfig)
    augment: AugmentConfig = dataclasses.field(default_factory=AugmentConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    checkpoints: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    validation: ValidationConfig = dataclasses.field(default_factory=ValidationConfig)
    tasks: TasksConfig = dataclasses.field(default_factory=TasksConfig)
    distillation: DistillationConfig = dataclasses.field(default_factory=DistillationConfig)
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)

    def main_task(self) -> MainTask:
        """What the run's tasks default to: its main data, features, loss, best metric and teacher."""
        return MainTask(self.data.train_data_pattern, self.validation.eval_data_pattern, self.features,
                        self.loss, self.validation.best_metric, self.distillation, tuple(self.validation.metrics))

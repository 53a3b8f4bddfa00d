"""`yt8m train`: the starter kit's train.py flags (or a YAML config) into `yt8m.training.train`; prints one JSON
summary line. Distributed: `torchrun --nproc_per_node N -m yt8m train ...`, or `--num_gpu N`, which relaunches
itself under torchrun."""

from __future__ import annotations

import json
import logging
from typing import Sequence

from yt8m.commands.command_line import read_command
from yt8m.distributed.ranks import env_rank, exit_without_teardown, launched_by_torchrun, relaunch_for_gpus
from yt8m.runtime import setup_logging
from yt8m.training import TrainConfig, train
from yt8m.training.checks import train_config_problems
from yt8m.training.stopping import raise_if_interrupted

log = logging.getLogger("yt8m.train")


def parse_args(argv: Sequence[str]) -> TrainConfig:
    """`yt8m train` flags, over `--config FILE.yaml` when given, as one typed and checked config (every problem of
    the file and the flags in one error, the components it names found); a model's hyper-parameters are its
    `--model.NAME` flags (and, for a built-in model, the starter kit's flat names)."""
    return read_command(TrainConfig, argv, "yt8m train", __doc__, checks=train_config_problems)


def main(argv: Sequence[str]) -> int:
    config = parse_args(argv)
    setup_logging(logging.INFO if env_rank() == 0 else logging.WARNING)
    if config.runtime.log_device_placement:
        log.info("--log_device_placement is the starter kit's TensorFlow flag: it has no effect here (the log names "
                 "the device this run trains on)")
    if config.runtime.num_gpu > 1 and not launched_by_torchrun():
        relaunch_for_gpus(argv, config.runtime.num_gpu)
    summary = train(config, checked=True)
    if env_rank() == 0:
        print(json.dumps(summary), flush=True)
    raise_if_interrupted(summary)
    if launched_by_torchrun():
        exit_without_teardown(0)
    return 0

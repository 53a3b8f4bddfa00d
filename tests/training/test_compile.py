"""`yt8m train --compile` end to end: torch.compile traces the model, the fused kernels' custom ops and the loss,
and trains to the eager run's losses (to float tolerance: compiled kernels may order sums differently)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workflow_fixtures import as_flags, tiny_data, tiny_train_config  # noqa: F401
from yt8m.config import config_values

pytestmark = pytest.mark.integration


def train_summary(data: dict, train_dir, *extra: str) -> dict:
    flags = as_flags(config_values(tiny_train_config(data, train_dir, num_epochs=2)))
    result = subprocess.run([sys.executable, "-m", "yt8m", "train", *flags, *extra], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_compiled_training_matches_eager_training(tiny_data, tmp_path):
    eager = train_summary(tiny_data, tmp_path / "eager")
    compiled = train_summary(tiny_data, tmp_path / "compiled", "--compile")
    assert compiled["global_step"] == eager["global_step"] == 8
    assert compiled["loss"] == pytest.approx(eager["loss"], rel=1e-4)

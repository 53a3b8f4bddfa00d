"""What every command's error line keeps, whatever raised it: one line of bounded length."""

from __future__ import annotations

import pytest
from cli_outcome import yt8m  # noqa: F401  (fixtures)

pytestmark = pytest.mark.hostile


def test_a_huge_flag_value_echoed_by_a_message_is_cut_in_the_middle(yt8m, tmp_path):
    huge = "1," * 50_000 + "x"  # 100 KB: about what one argument may hold
    outcome = yt8m("synth", "--output_dir", str(tmp_path), "--feature_sizes", huge)
    line = outcome.assert_clean_error("field 'feature_sizes' expects a comma-separated list of int", "...", ",x'")
    assert len(line) < 2200

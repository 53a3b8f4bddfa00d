"""A command line a command cannot take is one error line and exit status 1: an unknown flag names the nearest known
one, and a flag is never taken for a prefix of another (argparse's default: --num_epoch would be --num_epochs)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from yt8m import cli


def run_here(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_command_refuses_an_unknown_flag_in_one_line(command, capsys):
    status, out, err = run_here(capsys, command, "--no_such_flag=7")
    assert (status, out) == (1, "")
    assert err.splitlines() == [f"yt8m {command}: error: unknown flag --no_such_flag; `yt8m {command} --help` "
                                "lists the flags"]


def test_a_flag_prefix_is_refused_with_the_whole_name_suggested():
    # As a user runs it: a process of its own, its exit status and every line it prints.
    done = subprocess.run([sys.executable, "-m", "yt8m", "train", "--train_data_pattern", "data/*", "--num_epoch", "3"],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines() == ["yt8m train: error: unknown flag --num_epoch (did you mean --num_epochs?); "
                                        "`yt8m train --help` lists the flags"]


def test_several_unknown_flags_are_named_together(capsys):
    status, _, err = run_here(capsys, "eval", "--run_onse", "--top-k", "3", "--train_dir", "x")
    assert status == 1
    assert err.splitlines() == ["yt8m eval: error: unknown flags --run_onse (did you mean --run_once?), --top-k (did "
                                "you mean --top_k?); `yt8m eval --help` lists the flags"]


def test_a_sub_commands_flags_are_suggested(capsys):
    status, _, err = run_here(capsys, "bench", "read", "data/*", "--num_worker", "2")
    assert status == 1
    assert "unknown flag --num_worker (did you mean --num_workers?)" in err


@pytest.mark.parametrize("argv, message", [
    (["score", "--predictions", "p.csv"], "yt8m score: error: invalid config (flags): --labels is required"),
    (["synth", "--output_dir", "x", "--kind", "al"], "yt8m synth: error: invalid config (flags): --kind must be one "
                                                      "of video, frame, segment, all, got 'al'"),
    (["inspect", "data/*", "--limit", "ten"], "yt8m inspect: error: invalid config (flags): flags: field 'limit' "
                                             "expects int, got 'ten'"),
    (["export", "--output", "m.onnx", "--train_dir"], "yt8m export: error: argument --train_dir: expected one "
                                                      "argument; `yt8m export --help` lists the flags"),
])
def test_a_missing_or_malformed_value_is_one_line(argv, message, capsys):
    status, out, err = run_here(capsys, *argv)
    assert (status, out, err.splitlines()) == (1, "", [message])


def test_an_unknown_command_suggests_the_nearest_one(capsys):
    status, out, err = run_here(capsys, "trian", "--num_epochs", "3")
    assert (status, out) == (1, "")
    assert err.splitlines() == ["yt8m: error: unknown command 'trian' (did you mean train?); `yt8m --help` lists "
                                "the commands"]

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


# A setting of each command, given by its --config file: the file is read by the one config reader, whose errors
# name the file, the misspelt name and the nearest one. `yt8m tune`'s --config is its tuning file (tests/tune).
CONFIG_FILES = {"download": {"partition": "2/video/trian"}, "synth": {"output": {"kind": "vidoe"}},
                "inspect": {"pattern": "x", "limit": -1}, "bench read": {"pattern": "x", "batch_size": 0},
                "score": {"predictions": "p.csv", "labels": "l.csv", "top_k": 0},
                "train": {"train_data_pattern": "x", "num_epochs": 0}, "eval": {"train_dir": "nowhere", "run_once": True},
                "predict": {"input_data_pattern": "x", "output_file": "o.csv", "top_k": 0},
                "export": {"output": "m.onnx"}, "ensemble": {"inputs": ["a", "b"], "weights": [1.0]},
                "convert-predictions": {"input": "p.jsonl", "output": "p.csv", "top_k": 0},
                "demo": {"train_videos": 1}, "tune-report": {"study_dir": "s", "crossfit_folds": 1}}
EXPECTED = {"download": "expected VERSION/KIND/SPLIT", "synth": "--kind must be one of",
            "inspect": "--limit must be at least 0", "bench read": "--batch_size must be at least 1",
            "score": "--top_k must be at least 1", "train": "--num_epochs must be at least 1",
            "eval": "nowhere is not a yt8m train dir", "predict": "--top_k must be at least 1",
            "export": "give --train_dir (its latest checkpoint is exported) or --checkpoint",
            "ensemble": "--weights lists 1 weights for 2 inputs", "convert-predictions": "--top_k must be at least 1",
            "demo": "--train_videos must be at least 16", "tune-report": "--crossfit_folds must be 0 or at least 2"}


def test_every_command_but_tune_takes_its_flags_from_a_config_file():
    assert set(CONFIG_FILES) == {name for name in cli.COMMANDS if name != "tune"} - {"bench"} | {"bench read"}


@pytest.mark.parametrize("command", sorted(CONFIG_FILES))
def test_a_config_file_is_read_and_checked_as_the_flags_are(command, tmp_path, capsys):
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG_FILES[command]))
    status, out, err = run_here(capsys, *command.split(), "--config", str(path))
    assert (status, out) == (1, "") and EXPECTED[command] in err and "Traceback" not in err, err
    path.write_text(yaml.safe_dump({**CONFIG_FILES[command], "not_a_setting": 1}))
    status, _, err = run_here(capsys, *command.split(), "--config", str(path))
    assert status == 1 and "unknown field 'not_a_setting'" in err and str(path) in err, err

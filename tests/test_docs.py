"""The documentation site against the code: the command reference lists every flag the parsers take, the API
reference every public name, and no example of README.md or a page gives a `yt8m` command a flag it lacks.

The examples themselves run in tests/test_readme.py; `mkdocs build --strict` (make test, make docs) checks the links.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from types import ModuleType

import pytest
import yaml

import yt8m
from conftest import REPO_ROOT
from test_readme import Command, documented_files, fenced_blocks, readme_commands

DOCS = REPO_ROOT / "docs"


def load_hooks() -> ModuleType:
    """docs/hooks.py, the build's hook, which holds the parsers' capture and the reference's rendering."""
    spec = importlib.util.spec_from_file_location("yt8m_docs_hooks", DOCS / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    return load_hooks()


@pytest.fixture(scope="module")
def command_flags(hooks: ModuleType) -> dict[str, set[str]]:
    """`yt8m NAME` (and `yt8m bench read`) -> every flag its parser takes, hidden ones included, and the two every
    command takes: --help, and --verbose (yt8m.cli's: an error's traceback)."""
    return {name: hooks.flags(parser, hidden=True) | {"--help", "--verbose"} for name, parser in hooks.parsers()}


def test_the_build_renders_the_command_reference():
    config = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())
    assert "docs/hooks.py" in config["hooks"]
    assert load_hooks().PLACEHOLDER in (DOCS / "reference" / "commands.md").read_text()


def test_every_flag_of_every_command_is_in_the_reference(hooks):
    rendered = hooks.render_commands()
    missing = []
    for name, parser in hooks.parsers():
        section = rendered.split(f"## `{name}` ", 1)[1].split("\n## ", 1)[0]
        missing += [f"{name} {flag}" for flag in hooks.flags(parser) if f"`{flag}` {{#{hooks.flag_anchor(name, flag)}}}"
                    not in section]
    assert not missing
    # Each flag's heading has its own anchor: `commands/#train--num_epochs` lands on it.
    assert "#### `--num_epochs` {#train--num_epochs}" in rendered and "{#bench-read--" in rendered


def test_every_public_name_is_in_the_api_reference():
    entries = set(re.findall(r"^::: yt8m\.api\.(\w+)$", (DOCS / "reference" / "api.md").read_text(), re.MULTILINE))
    assert set(yt8m.__all__) <= entries, sorted(set(yt8m.__all__) - entries)
    assert entries <= set(yt8m.__all__), sorted(entries - set(yt8m.__all__))


def test_every_page_is_in_the_nav():
    pages = {path.relative_to(REPO_ROOT) for path in documented_files()}
    on_disk = {path.relative_to(REPO_ROOT) for path in DOCS.rglob("*.md")}
    assert on_disk <= pages, sorted(map(str, on_disk - pages))


def yt8m_invocations(text: str) -> list[tuple[str, list[str]]]:
    """(`yt8m COMMAND [SUB]`, the flags after it) of each `yt8m` a shell command runs, torchrun's `-m yt8m` included;
    flags before it (torchrun's) are not its."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    found: list[tuple[str, list[str]]] = []
    for index, word in enumerate(words):
        if word == "yt8m" or word.endswith("bin/yt8m"):  # not a URL or folder that ends in yt8m
            name = " ".join(["yt8m"] + words[index + 1:index + 2] + (["read"] if words[index + 1:index + 3] ==
                                                                     ["bench", "read"] else []))
            found.append((name, []))
        elif found and word.startswith("--"):
            found[-1][1].append(word.split("=", 1)[0])
    return found


def own_component_flags() -> set[str]:
    """The hyper-parameters of the components the pages define (`# NAME.py:` blocks), flags once a command names one:
    the parameters of their functions and constructors."""
    _, files = readme_commands()
    parameters = set()
    for name, text in files.items():
        if name.endswith(".py"):
            for signature in re.findall(r"def \w+\(([^)]*)\)", text):
                parameters |= {part.split(":")[0].split("=")[0].strip() for part in signature.split(",")}
    return {f"--{parameter}" for parameter in parameters if parameter and parameter != "self"}


def test_no_page_gives_a_command_a_flag_it_lacks(command_flags):
    """A renamed or removed flag fails here, naming the page and line, rather than in a reader's terminal.
    A command followed by its expected error (`# yt8m train: error: unknown flag ...`) is left out."""
    own = own_component_flags()
    stale, checked = [], 0
    for command in all_shell_commands():
        if command.expected_error:
            continue
        for name, flags in yt8m_invocations(command.text):
            assert name in command_flags, f"{command.path}:{command.line}: no command {name!r}"
            unknown = [flag for flag in flags if flag not in command_flags[name] | own]
            stale += [f"{command.path}:{command.line}: {name} {flag}" for flag in unknown]
            checked += len(flags)
    assert not stale, "\n".join(stale)
    assert checked > 250


def test_no_inline_example_gives_a_command_a_flag_it_lacks(command_flags):
    """The same for prose's inline commands (`yt8m predict --task vertical`), outside the code blocks."""
    stale = []
    for path in documented_files():
        for number, line in prose_lines(path.read_text()):
            for span in re.findall(r"`(yt8m [^`]*)`", line):
                for name, flags in yt8m_invocations(span) if span.split()[:2][-1] != "<command>" else []:
                    stale += [f"{path.relative_to(REPO_ROOT)}:{number}: {name} {flag}" for flag in flags
                              if name in command_flags and flag not in command_flags[name]]
    assert not stale, "\n".join(stale)


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    lines, in_block = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip().startswith("```"):
            in_block = not in_block
        elif not in_block:
            lines.append((number, line))
    return lines


def all_shell_commands() -> list[Command]:
    """Every shell command of README.md and the pages, blocks met twice included (test_readme runs them once)."""
    from test_readme import commands

    found = []
    for path in documented_files():
        for language, first_line, body in fenced_blocks(path.read_text()):
            if language in ("bash", "sh"):
                for command in commands(body, first_line):
                    command.path = str(path.relative_to(REPO_ROOT))
                    found.append(command)
    return found


def test_the_flag_check_finds_a_stale_flag(command_flags):
    """The check's own test: a flag renamed in the code would be caught."""
    (name, flags), = yt8m_invocations("yt8m eval --train_dir runs/moe --run_onse  # typo")
    assert name == "yt8m eval" and flags == ["--train_dir", "--run_onse"]
    assert "--run_onse" not in command_flags[name] and "--run_once" in command_flags[name]
    assert yt8m_invocations("torchrun --nproc_per_node 4 -m yt8m train --batch_size 256") == [
        ("yt8m train", ["--batch_size"])]

"""The mkdocs build's hook: docs/reference/commands.md gets every command's flags from the parsers `--help` prints,
and each built-in model's and loss's hyper-parameters from their own dataclasses. tests/test_docs.py imports this file
too, to check the pages' flags against the same parsers."""

from __future__ import annotations

import argparse
import html
import importlib
from typing import Any, Iterator
from unittest import mock

import dataclasses

from yt8m.cli import COMMANDS
from yt8m.commands.command_line import FlagParser
from yt8m.config import ComponentSection, component_sections, hparam_type
from yt8m.training.config import TrainConfig

PLACEHOLDER = "<!-- yt8m-commands -->"


class _Captured(Exception):
    """Raised from parse_args to bring the command's finished parser out before it does any work."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser `yt8m NAME` builds: each command builds it inside main(), so main runs until it parses."""

    def capture(parser: FlagParser, args: Any = None, namespace: Any = None) -> None:
        parser.add_named_components_flags([])  # the default components' hyper-parameter flags, as parse_args adds
        raise _Captured(parser)

    module_name, func_name = COMMANDS[name][0].split(":")
    command = getattr(importlib.import_module(module_name), func_name)
    with mock.patch.object(FlagParser, "parse_args", capture):
        try:
            command([])
        except _Captured as captured:
            return captured.parser
    raise AssertionError(f"yt8m {name} did not parse its flags")


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(`yt8m NAME` or `yt8m NAME SUB`, parser) of every command and subcommand, in `yt8m --help` order."""
    for name in COMMANDS:
        parser = command_parser(name)
        yield f"yt8m {name}", parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    yield f"yt8m {name} {sub}", subparser


def flag_actions(parser: argparse.ArgumentParser, hidden: bool = False) -> list[argparse.Action]:
    """The parser's long flags (help's own -h/--help left out), hidden ones (help=SUPPRESS) only when asked."""
    return [action for action in parser._actions
            if any(option.startswith("--") for option in action.option_strings) and action.dest != "help"
            and (hidden or action.help != argparse.SUPPRESS)]


def flags(parser: argparse.ArgumentParser, hidden: bool = False) -> set[str]:
    return {option for action in flag_actions(parser, hidden) for option in action.option_strings
            if option.startswith("--")}


def render_commands() -> str:
    """Markdown of every command: its description, its positional arguments and a list entry per flag."""
    out = []
    for name, parser in parsers():
        out += [f"## `{name}`", "", _markdown_safe(parser.description or ""), ""]
        positionals = [action for action in parser._actions if not action.option_strings
                       and not isinstance(action, argparse._SubParsersAction)]
        out += [f"- `{action.metavar or action.dest}`: {_help(parser, action)}" for action in positionals]
        out += [f"- `{' '.join(action.option_strings)}`{_metavar(action)}: {_help(parser, action)}"
                for action in flag_actions(parser)]
        out.append("")
    return "\n".join(out + render_components())


def render_components() -> list[str]:
    """Markdown of each built-in component's hyper-parameters, as `--SECTION.NAME` flags with their own defaults."""
    out = ["## Components' hyper-parameters", "",
           "Each model's and loss's own fields, given as `--model.NAME` / `--loss.NAME` (in YAML, `model: {name: "
           "MoeModel, NAME: value}`); a built-in's also by its starter-kit flag, `--NAME`. `yt8m train --model NAME "
           "--help` lists them for one component, one's own included.", ""]
    for key, section in component_sections(TrainConfig).items():
        for name, builtin, fields in section.loaded_components():
            if builtin:
                out += [f"### `--{section.name_flag()} {name}`", ""]
                out += [_component_field(key, section, name, f) for f in fields.values()] or ["(no hyper-parameters)"]
                out.append("")
    return out


def _component_field(key: str, section: type[ComponentSection], component: str, f: dataclasses.Field) -> str:
    kind = hparam_type(section, component, f.name)
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return (f"- `--{key}.{f.name}` `{getattr(kind, '__name__', str(kind)).upper()}`: "
            f"{_markdown_safe(f.metadata.get('help', ''))} (default: `{default}`; also `--{f.name}`)")


def _metavar(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    return f" `{action.metavar or action.dest.upper()}`"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text as --help prints it (%(default)s expanded), on one line, safe in Markdown."""
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    return _markdown_safe(" ".join(text.split()))


def _markdown_safe(text: str) -> str:
    """Plain text as Markdown that shows it as is: <, >, &, * and _ escaped outside `code` spans, which show theirs."""
    pieces = text.split("`")
    for index in range(0, len(pieces), 2 if len(pieces) % 2 else 1):  # unpaired backticks: no span is code
        pieces[index] = html.escape(pieces[index], quote=False).replace("*", "\\*").replace("_", "\\_")
    return "`".join(pieces)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """mkdocs' hook: the commands page's placeholder becomes the reference."""
    if PLACEHOLDER in markdown:
        return markdown.replace(PLACEHOLDER, render_commands())
    return markdown

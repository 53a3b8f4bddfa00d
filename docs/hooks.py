"""The mkdocs build's hook: docs/reference/commands.md gets every command's flags from the parsers `--help` prints
(a heading and an anchor each, grouped by section) and each built-in model's and loss's hyper-parameters from their
own dataclasses; docs/reference/api.md gets each config's settings, a table per section, from the `setting(...)`
that declares each. tests/test_docs.py imports this file too, to check the pages' flags against the same parsers."""

from __future__ import annotations

import argparse
import dataclasses
import html
import importlib
import re
from typing import Any, Iterator
from unittest import mock

from yt8m import api
from yt8m.cli import COMMANDS
from yt8m.commands.command_line import FlagParser, default_text
from yt8m.config import ComponentSection, component_sections, config_settings, hparam_type, sections
from yt8m.training.config import TrainConfig

PLACEHOLDER = "<!-- yt8m-commands -->"
SETTINGS = re.compile(r"<!-- yt8m-settings (\w+) -->")


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


def flag_anchor(command: str, flag: str) -> str:
    """The id of a flag's entry on the commands page: `train--num_epochs`, `bench-read--files` (a URL fragment a
    reader can link to)."""
    return f"{command.removeprefix('yt8m ').replace(' ', '-')}--{flag.lstrip('-')}"


def render_commands() -> str:
    """Markdown of every command: its description, then a heading per flag (its own anchor, flag_anchor) under a
    heading per section (the groups `--help` prints), so that the page's outline lists the sections and a search or a
    link lands on the flag."""
    out = []
    for name, parser in parsers():
        out += [f"## `{name}` {{#{flag_anchor(name, '').rstrip('-')}}}", "", _markdown_safe(parser.description or ""), ""]
        positionals = [action for action in parser._actions if not action.option_strings
                       and not isinstance(action, argparse._SubParsersAction)]
        if positionals:
            out += [f"### arguments {{#{flag_anchor(name, '').rstrip('-')}-arguments}}", ""]
        for action in positionals:
            argument = action.metavar or action.dest
            out += [f"#### `{argument}` {{#{flag_anchor(name, str(argument))}}}", "",
                    f"`{name} {argument}`: {_help(parser, action)}", ""]
        for group in parser._action_groups:
            shown = [action for action in group._group_actions if action in flag_actions(parser)]
            if shown:
                out += _flag_group(name, parser, group, shown)
    return "\n".join(out + render_components())


def _flag_group(name: str, parser: argparse.ArgumentParser, group: Any, actions: list[argparse.Action]) -> list[str]:
    """A help group's flags under its title (`data flags`, `model MoeModel's hyper-parameters`), each a heading."""
    title = "general flags" if group.title in ("options", "optional arguments") else group.title
    anchor = f"{flag_anchor(name, '').rstrip('-')}-{re.sub(r'[^A-Za-z0-9.]+', '-', title).strip('-')}"
    out = [f"### {_markdown_safe(title)} {{#{anchor}}}", ""]
    if group.description:
        out += [_markdown_safe(group.description), ""]
    for action in actions:
        flag = action.option_strings[-1]
        out += [f"#### `{' '.join(action.option_strings)}` {{#{flag_anchor(name, flag)}}}", "",
                f"`{name} {flag}{_metavar(action)}`: {_help(parser, action)}", ""]
    return out


def render_components() -> list[str]:
    """Markdown of each built-in component's hyper-parameters, as `--SECTION.NAME` flags with their own defaults."""
    out = ["## Components' hyper-parameters {#components}", "",
           "Each model's and loss's own fields, given as `--model.NAME` / `--loss.NAME` (in YAML, `model: {name: "
           "MoeModel, NAME: value}`); a built-in's also by its starter-kit flag, `--NAME`. `yt8m train --model NAME "
           "--help` lists them for one component, one's own included.", ""]
    for key, section in component_sections(TrainConfig).items():
        for name, builtin, fields in section.loaded_components():
            if builtin:
                out += [f"### `--{section.name_flag()} {name}` {{#{key}-{name}}}", ""]
                for f in fields.values():
                    out += _component_field(key, section, name, f)
                if not fields:
                    out += ["(no hyper-parameters)", ""]
    return out


def _component_field(key: str, section: type[ComponentSection], component: str, f: dataclasses.Field) -> list[str]:
    kind = hparam_type(section, component, f.name)
    return [f"#### `--{key}.{f.name}` {{#{key}-{component}--{f.name}}}", "",
            f"`{getattr(kind, '__name__', str(kind)).upper()}`: {_markdown_safe(f.metadata.get('help', ''))} "
            f"(default: `{default_text(f)}`; also `--{f.name}`)", ""]


def _metavar(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    return f" {action.metavar or action.dest.upper()}"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text as --help prints it (%(default)s expanded), on one line, safe in Markdown."""
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    return _markdown_safe(" ".join(text.split()))


def render_settings(cls: type) -> str:
    """Markdown of a config class's settings, a table per section: each setting's name (its flag's, and its flat YAML
    name), type, default and help, from the `setting(...)` that declares it (yt8m.fields)."""
    out = []
    grouped: dict[Any, list[Any]] = {}
    for item in config_settings(cls).values():
        grouped.setdefault(item.section, []).append(item)
    for section, items in grouped.items():
        kind = sections(cls).get(section) if section else cls
        title = f"`{cls.__name__}.{section}`: `{kind.__name__}`" if section else f"`{cls.__name__}`'s settings"
        doc = " ".join((kind.__doc__ or "").split()) if section else ""
        out += [f"### {title} {{#{cls.__name__}.{section or 'settings'}}}", "", _markdown_safe(doc), "",
                "| setting | type | default | what it sets |", "| --- | --- | --- | --- |"]
        out += [f"| `{item.flag}` | `{_type_text(item.field)}` | `{default_text(item.field)}` | "
                f"{_cell(item.field.metadata.get('help', ''))} |" for item in items]
        out.append("")
    return "\n".join(out)


def _cell(text: str) -> str:
    """Plain text as a Markdown table cell's (a | would end the cell)."""
    return _markdown_safe(text).replace("|", "\\|")


def _type_text(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _markdown_safe(text: str) -> str:
    """Plain text as Markdown that shows it as is: <, >, &, * and _ escaped outside `code` spans, which show theirs."""
    pieces = text.split("`")
    for index in range(0, len(pieces), 2 if len(pieces) % 2 else 1):  # unpaired backticks: no span is code
        pieces[index] = html.escape(pieces[index], quote=False).replace("*", "\\*").replace("_", "\\_")
    return "`".join(pieces)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """mkdocs' hook: the commands page's placeholder becomes the reference, and each `<!-- yt8m-settings NAME -->`
    of the API page the settings table of config class yt8m.api.NAME."""
    if PLACEHOLDER in markdown:
        markdown = markdown.replace(PLACEHOLDER, render_commands())
    return SETTINGS.sub(lambda match: render_settings(getattr(api, match[1])), markdown)

"""The command line of every `yt8m` command, declared one way: its config's settings as flags grouped by section, the
chosen components' hyper-parameters as `--SECTION.NAME`, positional arguments, sub-commands and `--config FILE.yaml`,
all read by yt8m.config's one reader. Whole flag names only; a bad command line is one line (FlagError)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import typing
from typing import Any, Mapping, Optional, Sequence

from yt8m.config import (
    C,
    Checks,
    ComponentSection,
    component_sections,
    config_from_dict,
    config_settings,
    flattened,
    given_flags,
    hparam_type,
    load_named_components,
    load_yaml,
    sections,
)
from yt8m.fields import nearest

log = logging.getLogger("yt8m")
CONFIG_HELP = "YAML file with the same names as the flags (flat, or nested by section); flags override it."
# Where a setting's argument form (`yt8m inspect PATTERN`) lands in the parsed namespace, and a sub-command's name.
POSITIONAL = "positional:"
SUBCOMMAND = "subcommand:"
HELP_FLAGS = ("-h", "--help")


class FlagError(ValueError):
    """A command line a command cannot take (an unknown flag, a missing or malformed value): one line, exit 1."""


class FlagParser(argparse.ArgumentParser):
    """The flags of a `yt8m` command: only whole names (argparse would take --num_epoch as --num_epochs), and a bad
    command line raised as a FlagError of one line, an unknown flag with the nearest known one, instead of argparse's
    usage block and exit status 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.config_classes: list[type] = []  # the configs whose flags add_config_arguments gave this parser
        self.load_errors: list[str] = []  # components the command line names that did not load, and why

    # argparse's parse_args is overloaded on the namespace's type; this one keeps the plain Namespace form only.
    def parse_args(self, args: Optional[Sequence[str]] = None,  # type: ignore[override]
                   namespace: Optional[argparse.Namespace] = None) -> argparse.Namespace:
        argv = list(sys.argv[1:] if args is None else args)
        self.add_named_components_flags(argv)
        # Unknown flags first: argparse would otherwise name a required flag the misspelt one was meant to be.
        unknown = self._unknown_flags(argv)
        if unknown:
            known = self._flag_names()
            named = ", ".join(f"{flag}{_did_you_mean(flag, known)}" for flag in unknown)
            loading = "".join(f"; {error}" for error in self.load_errors)
            raise FlagError(f"unknown flag{'s' if len(unknown) > 1 else ''} {named}{loading}; {self._help_hint()}")
        parsed, extra = self.parse_known_args(argv, namespace)
        if extra:
            raise FlagError(f"unexpected argument(s) {' '.join(map(repr, extra))}; {self._help_hint()}")
        return parsed

    def error(self, message: str) -> typing.NoReturn:
        raise FlagError(f"{message}; {self._help_hint()}")

    def add_named_components_flags(self, argv: Sequence[str]) -> None:
        """The flags of the components the command line (or its --config file) names: `--model MoeModel` shows and
        takes MoeModel's `--model.NAME` flags. A component named by import path is imported only where the command
        line asks for help or gives names that are no setting (`--model mymodels:MLP --mlp_hidden 64`): which
        component a flat name belongs to depends on the names each declares."""
        values = {**_config_file_values(argv), **_named_values(argv)}
        for cls in self.config_classes:
            if any(flag in argv for flag in HELP_FLAGS) or _gives_hparams(cls, values):
                self.load_errors += _load_components(cls, values)
            add_config_arguments(self, cls, _chosen_components(cls, values))
        self._accept_dotted_names(argv)

    def _accept_dotted_names(self, argv: Sequence[str]) -> None:
        """`--SECTION.NAME` for a component section is taken whatever NAME is: the component checks its own names when
        the run resolves it (a misspelt one is named there, with the nearest it has)."""
        scopes = {key for cls in self.config_classes for key in component_sections(cls)}
        taken = self._option_strings()
        for flag in self._unknown_flags(argv):
            if flag.partition(".")[0][2:] in scopes and flag not in taken:
                self.add_argument(flag, dest=flag[2:], default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    def _option_strings(self) -> set[str]:
        return {option for action in self._actions for option in action.option_strings}

    def _unknown_flags(self, argv: Sequence[str]) -> list[str]:
        """The long flags of `argv` that no parser of this command takes (up to a `--`, after which all is values)."""
        known = set(self._flag_names(hidden=True))
        given = argv[:list(argv).index("--")] if "--" in argv else argv
        return [flag for flag in (token.split("=", 1)[0] for token in given if token.startswith("--"))
                if flag not in known]

    def _flag_names(self, hidden: bool = False) -> list[str]:
        """Every long flag of this parser and of its sub-commands' (`yt8m bench read`); `hidden`: also those the
        help leaves out (--noframe_features)."""
        parsers = [self] + [sub for action in self._actions if isinstance(action, argparse._SubParsersAction)
                            for sub in action.choices.values()]
        return [flag for parser in parsers for action in parser._actions for flag in action.option_strings
                if flag.startswith("--") and (hidden or action.help != argparse.SUPPRESS)]

    def _help_hint(self) -> str:
        return f"`{self.prog} --help` lists the flags"


def _did_you_mean(flag: str, known: Sequence[str]) -> str:
    match = nearest(flag, known)
    return f" (did you mean {match}?)" if match else ""


def _named_values(argv: Sequence[str]) -> dict[str, str]:
    """`--name value` and `--name=value` pairs of a command line, read before it is parsed."""
    values = {}
    for index, token in enumerate(argv):
        if token == "--":
            break
        if token.startswith("--") and "=" in token:
            name, value = token[2:].split("=", 1)
            values[name] = value
        elif token.startswith("--") and index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            values[token[2:]] = argv[index + 1]
    return values


def _config_file_values(argv: Sequence[str]) -> dict[str, Any]:
    """The values of the command line's --config file, where it reads (parsing reads it again and names any
    problem)."""
    path = _named_values(argv).get("config")
    try:
        values = load_yaml(path) if path else {}
    except (ValueError, OSError):
        return {}
    return values if isinstance(values, dict) else {}


def _chosen_components(cls: type, values: dict[str, Any]) -> dict[str, str]:
    """The component each component section of `cls` names in `values` (flat, dotted or nested), by section."""
    flat = flattened(cls, values)
    chosen = {}
    for key, section in component_sections(cls).items():
        name = flat.get(section.name_flag(), flat.get(f"{key}.{section.NAME}"))
        if isinstance(name, str):
            chosen[key] = name
    return chosen


def _gives_hparams(cls: type, values: dict[str, Any]) -> bool:
    """Whether `values` give names that are no setting of `cls`: a component's hyper-parameters (or unknown)."""
    settings = set(config_settings(cls))
    return any(name.removeprefix("no") not in settings and name != "config" for name in flattened(cls, values))


def _load_components(cls: type, values: dict[str, Any]) -> list[str]:
    """Import the components `values` name, so that their flags are known; why each that does not load fails."""
    load_named_components(cls, values)
    errors = []
    for key, name in _chosen_components(cls, values).items():
        section = component_sections(cls)[key]
        if section.loaded_fields(name) is None:
            try:
                section.registry().entry(name)
            except (ValueError, TypeError) as err:
                errors.append(f"--{section.name_flag()} {name} does not load: {err}")
    return errors


def add_config_file_argument(parser: argparse.ArgumentParser, help: str = CONFIG_HELP, required: bool = False,
                             metavar: str = "FILE.yaml") -> None:
    parser.add_argument("--config", default=None, required=required, metavar=metavar, help=help)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type,
                         chosen: Optional[dict[str, str]] = None, components: bool = True) -> None:
    """One `--name` flag per setting of `cls`, grouped by section (a mapping or list of mappings takes YAML text;
    booleans also take `--noname` and `--name=false`; a positional setting is also the command's argument), and the
    hyper-parameters of its component sections: the chosen component's (`chosen`, by section; else the section's
    default) shown as `--SECTION.NAME` with its own defaults, every loaded component's taken (dotted, and flat for
    the starter kit's names). Adding again adds only what is new; `components` False leaves the components' flags to
    FlagParser.parse_args, which knows what the command line chooses.

    Values stay text here and are typed by `config_from_dict`, so that one error lists every bad flag. Defaults are
    suppressed so that `parse_config` can tell which flags were given.
    """
    if isinstance(parser, FlagParser) and cls not in parser.config_classes:
        parser.config_classes.append(cls)
    for section_name, settings in _settings_by_section(cls).items():
        group = _group(parser, section_name, cls)
        for flag, f, kind in settings:
            _add_setting(parser, group, flag, f, kind)
    for key, section in component_sections(cls).items() if components else ():
        _add_component_flags(parser, cls, key, section, (chosen or {}).get(key))


def _settings_by_section(cls: type) -> dict[Optional[str], list[tuple[str, dataclasses.Field, Any]]]:
    grouped: dict[Optional[str], list[tuple[str, dataclasses.Field, Any]]] = {}
    for setting in config_settings(cls).values():
        grouped.setdefault(setting.section, []).append((setting.flag, setting.field, setting.kind))
    return grouped


def _group(parser: argparse.ArgumentParser, section: Optional[str], cls: type) -> Any:
    """The help's group of a section's flags (its name, and its class's first line); the parser itself for a config
    of no sections."""
    if section is None:
        return parser
    title = f"{section} flags"
    found = next((group for group in parser._action_groups if group.title == title), None)
    if found is not None:
        return found
    kind = sections(cls)[section]
    return parser.add_argument_group(title, _first_sentence(kind.__doc__ or ""))


def _add_setting(parser: argparse.ArgumentParser, group: Any, flag: str, f: dataclasses.Field, kind: Any,
                 hidden: bool = False, shown: Optional[str] = None) -> None:
    """A setting's flag (and its argument form, for a positional one), unless the parser has it already."""
    help_text = argparse.SUPPRESS if hidden else f"{f.metadata.get('help', '')} (default: {shown or default_text(f)})"
    existing = next((action for action in parser._actions if f"--{flag}" in action.option_strings), None)
    if existing is not None:
        if not hidden and existing.help == argparse.SUPPRESS:  # taken for another component: shown for this one
            _show_in(parser, group, existing, help_text, kind)
        return
    if kind is bool:
        group.add_argument(f"--{flag}", dest=flag, nargs="?", const="true", default=argparse.SUPPRESS,
                           metavar="BOOL", help=help_text)
        if "." not in flag:
            group.add_argument(f"--no{flag}", dest=flag, action="store_const", const="false",
                               default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    else:
        group.add_argument(f"--{flag}", dest=flag, default=argparse.SUPPRESS, metavar=_metavar(kind),
                           help=help_text)
    if f.metadata.get("positional"):
        many = typing.get_origin(kind) is list
        parser.add_argument(f"{POSITIONAL}{flag}", nargs="*" if many else "?", default=argparse.SUPPRESS,
                            metavar=flag.upper(), help=f"The same as --{flag}.")


def _show_in(parser: argparse.ArgumentParser, group: Any, action: argparse.Action, help_text: str, kind: Any) -> None:
    """A hidden flag's action shown in `group`, with this help and type (argparse lists a group's
    `_group_actions`)."""
    action.help, action.metavar = help_text, "BOOL" if kind is bool else _metavar(kind)
    for other in parser._action_groups:
        if action in other._group_actions:
            other._group_actions.remove(action)
    group._group_actions.append(action)


def _add_component_flags(parser: argparse.ArgumentParser, cls: type, key: str, section: type[ComponentSection],
                         chosen: Optional[str]) -> None:
    """The chosen component's hyper-parameters in a group of their own, as `--KEY.NAME` (and, for a built-in's, its
    flat starter-kit flag in the help); the other loaded components' taken but not shown."""
    name = chosen or section.default_component()
    own = section.loaded_fields(name)
    settings = set(config_settings(cls))
    if own is not None:
        builtin = next((flag for component, flag, _ in section.loaded_components() if component == name), False)
        group = _component_group(parser, key, section, name, builtin)
        for field_name, f in own.items():
            also = f"; also --{field_name}" if builtin and field_name not in settings else ""
            _add_setting(parser, group, f"{key}.{field_name}", f, hparam_type(section, name, field_name),
                         shown=f"{default_text(f)}{also}")
    for component, _, fields in section.loaded_components():
        for field_name, f in fields.items():
            kind = hparam_type(section, component, field_name)
            _add_setting(parser, parser, f"{key}.{field_name}", f, kind, hidden=True)
            if field_name not in settings:
                _add_setting(parser, parser, field_name, f, kind, hidden=True)


def _component_group(parser: argparse.ArgumentParser, key: str, section: type[ComponentSection], name: str,
                     builtin: bool) -> Any:
    title = f"{key} {name}'s hyper-parameters"
    found = next((group for group in parser._action_groups if group.title == title), None)
    if found is not None:
        return found
    also = " (a built-in's also by their starter-kit flags, --NAME)" if builtin else ""
    return parser.add_argument_group(title, f"Given as --{key}.NAME{also}, or in YAML as {key}: {{NAME: value}}; "
                                            f"`--{section.name_flag()} OTHER --help` lists another {key}'s.")


def _metavar(kind: Any) -> str:
    if typing.get_origin(kind) is list:
        return "YAML" if typing.get_args(kind) == (dict,) else "A,B,..."
    if kind is dict or kind is Any:
        return "YAML"
    return getattr(kind, "__name__", "VALUE").upper()


def default_text(f: dataclasses.Field) -> str:
    """A default as the help shows it: lists in their comma form, empty values as `none`."""
    if "shown_default" in f.metadata:
        return str(f.metadata["shown_default"])
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if default in ("", None, [], {}):
        return "required" if f.metadata.get("required") else "none"
    return ",".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)


def _first_sentence(text: str) -> str:
    joined = " ".join(text.split())
    return joined.split(". ")[0].rstrip(".") + "." if joined else ""


def description(doc: Optional[str]) -> str:
    """A command's description for --help and the reference: its module docstring's first paragraph, whole."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def given_values(cls: type, args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The values `--config FILE.yaml` and the flags given hold (flags win, name by name), and what they were read
    from; a positional setting given both as the argument and as its flag is a FlagError."""
    values: dict[str, Any] = {}
    file_path = getattr(args, "config", None)
    if file_path:
        values.update(flattened(cls, load_yaml(file_path)))
    given = {name: value for name, value in vars(args).items() if name != "config" and not name.startswith(
        (POSITIONAL, SUBCOMMAND))}
    for name, value in vars(args).items():
        if name.startswith(POSITIONAL) and value not in (None, []):
            flag = name[len(POSITIONAL):]
            if flag in given:
                raise FlagError(f"give --{flag} as the argument or as the flag, not both")
            given[flag] = value
    values = without_other_components_hparams(cls, values, given)
    values.update(given)
    return values, " and ".join(part for part in (file_path, "flags" if given else "") if part) or "defaults"


def without_other_components_hparams(cls: type, values: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The file's values without the hyper-parameters of a component the flags replace (`--config run/config.yaml
    --lr_schedule cosine` on a run of the exponential decay): they are the file's component's, not the flag's."""
    for section in component_sections(cls).values():
        flag = section.name_flag()
        if flag in values and given.get(flag) not in (None, values[flag]):
            dropped = [key for key in values if key.startswith(f"{section.SCOPE}.")]
            if dropped:
                log.info("--%s %s replaces the config file's %s: its hyper-parameters (%s) are left out", flag,
                         given[flag], values[flag], ", ".join(key.partition(".")[2] for key in dropped))
            values = {key: value for key, value in values.items() if key not in dropped}
    return values


def parse_config(cls: type[C], args: argparse.Namespace, check_values: bool = True, checks: Optional[Checks] = None
                 ) -> tuple[C, set[str]]:
    """Resolve a config from `--config FILE.yaml` and the flags given; flags win. `checks` adds the config's own
    (see config_from_dict). Returns the config and the flags given explicitly (by file or flag), by their flat
    names."""
    values, source = given_values(cls, args)
    return (config_from_dict(cls, values, source=source, check_values=check_values, checks=checks),
            given_flags(cls, values))


def command_parser(prog: str, doc: Optional[str], cls: Optional[type] = None, *, epilog: Optional[str] = None,
                   config_help: str = CONFIG_HELP, config_required: bool = False,
                   config_metavar: str = "FILE.yaml") -> FlagParser:
    """The parser of `yt8m PROG`: its description from the module docstring, --config, and the config's flags."""
    formatter = argparse.RawDescriptionHelpFormatter if epilog else argparse.HelpFormatter
    parser = FlagParser(prog=prog, description=description(doc), epilog=epilog, formatter_class=formatter)
    add_config_file_argument(parser, config_help, config_required, config_metavar)
    if cls is not None:
        add_config_arguments(parser, cls, components=False)
    return parser


def read_command(cls: type[C], argv: Sequence[str], prog: str, doc: Optional[str], *,
                 checks: Optional[Checks] = None, epilog: Optional[str] = None) -> C:
    """The config of `yt8m PROG ARGV`: its --config file and flags, typed and checked in one ConfigError."""
    parser = command_parser(prog, doc, cls, epilog=epilog)
    return parse_config(cls, parser.parse_args(argv), checks=checks)[0]


def read_subcommand(commands: Mapping[str, tuple[type, str]], argv: Sequence[str], prog: str,
                    doc: Optional[str]) -> tuple[str, Any]:
    """(the sub-command, its config) of `yt8m PROG SUB ARGV` (`yt8m bench read`): each sub-command's config, given
    with its summary, has its own flags and --config."""
    parser = FlagParser(prog=prog, description=description(doc))
    subparsers = parser.add_subparsers(dest=SUBCOMMAND, required=True, metavar="COMMAND")
    for name, (cls, summary) in commands.items():
        sub = subparsers.add_parser(name, help=summary, description=summary)
        add_config_file_argument(sub)
        add_config_arguments(sub, cls)
    args = parser.parse_args(argv)
    name = getattr(args, SUBCOMMAND)
    return name, parse_config(commands[name][0], args)[0]


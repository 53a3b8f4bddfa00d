"""Typed configs in sections, filled from YAML (flat, or nested by section) and flags, and checked whole.

A command's config is a frozen dataclass of sections; a section is a frozen dataclass of settings (yt8m.fields.setting)
owned by the component it configures. Every setting is a flag of its own name, as in the starter kit, so flat YAML,
stored runs and old command lines load as they did; one ConfigError lists every problem of a config.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import math
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Optional, Protocol, Sequence, TypeVar

import yaml

from yt8m.fields import closest, nearest, parse_bool, parse_list
from yt8m.io import storage
from yt8m.io.files import write_file_atomically

T = TypeVar("T")


class DataclassInstance(Protocol):
    """Any config: a dataclass instance (its sections and settings are its fields)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


C = TypeVar("C", bound=DataclassInstance)
# The starter kit's --train_dir default: a run that keeps it is warned that /tmp may not keep it.
STARTER_TRAIN_DIR = "/tmp/yt8m_model/"
log = logging.getLogger("yt8m.config")


class ConfigError(ValueError):
    """A config with problems: `problems` lists them, one line each; the message heads them with what was read. One
    problem is one line, as every user error is (`heading: problem`); several are listed under the heading."""

    def __init__(self, heading: str, problems: list[str]):
        separator = ": " if len(problems) == 1 else ":\n  "
        super().__init__(heading + separator + "\n  ".join(problems))
        self.problems = problems


class ComponentSection:
    """A section that names a component (a model, a loss) in its `name` field and holds the component's
    hyper-parameters, as the component's own dataclass, in its `hparams` field.

    Each hyper-parameter is also a flag and flat YAML name of its own (`--moe_num_mixtures 4`, as the starter kit's
    model flags): given beside the config's settings, the chosen component's go into its `hparams`; another
    component's are ignored with a warning (one file may serve several models); any other name is unknown.
    Subclasses say which dataclass a name's component takes and list every known component's fields."""

    NAME: ClassVar[str] = "name"
    HPARAMS: ClassVar[str] = "hparams"
    __dataclass_fields__: ClassVar[dict[str, Any]]  # a component section is a dataclass

    @classmethod
    def hparams_class(cls, name: str) -> Optional[type]:
        """The hyper-parameters' dataclass of component `name`; None where no component has that name."""
        raise NotImplementedError

    @classmethod
    def hparam_flags(cls) -> list[tuple[dataclasses.Field, Any]]:
        """(field, type) of every known component's hyper-parameters, one per name: their flags."""
        raise NotImplementedError


@dataclass(frozen=True)
class Setting:
    """Where a flag's value lives in a config: the field `field` of section `section` (None: the config's own)."""

    flag: str
    section: Optional[str]
    field: dataclasses.Field
    kind: Any


def is_section(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or f.name


@functools.cache
def config_settings(cls: type) -> dict[str, Setting]:
    """Every flag of a config class (its sections' settings, and its own where it is not sectioned), by name."""
    found: dict[str, Setting] = {}
    for f in dataclasses.fields(cls):
        kind = field_type(cls, f.name)
        members = ([(inner, field_type(kind, inner.name), f.name) for inner in dataclasses.fields(kind)]
                   if is_section(kind) else [(f, kind, None)])
        for member, member_kind, section in members:
            flag = flag_of(member)
            if flag in found:
                raise TypeError(f"{cls.__name__}: two settings are the flag --{flag}")
            found[flag] = Setting(flag, section, member, member_kind)
    return found


def component_sections(cls: type) -> dict[str, type[ComponentSection]]:
    """The config's sections that name a component, by field name."""
    return {f.name: kind for f in dataclasses.fields(cls)
            if isinstance(kind := field_type(cls, f.name), type) and issubclass(kind, ComponentSection)}


def sections(cls: type) -> dict[str, type]:
    return {f.name: kind for f in dataclasses.fields(cls) if is_section(kind := field_type(cls, f.name))}


def hparam_flags(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    """The component hyper-parameters a config takes as flags of their own, one per name."""
    seen: dict[str, tuple[dataclasses.Field, Any]] = {}
    for section in component_sections(cls).values():
        for f, kind in section.hparam_flags():
            seen.setdefault(f.name, (f, kind))
    return list(seen.values())


def flag_names(cls: type) -> list[str]:
    """Every flag and flat YAML name a config class takes, its components' hyper-parameters included."""
    return [*config_settings(cls), *(f.name for f, _ in hparam_flags(cls) if f.name not in config_settings(cls))]


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def field_type(cls: type, name: str) -> Any:
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return hint


def flag_type(cls: type, flag: str) -> Any:
    """The type of a config's flag (a component hyper-parameter's included); None for a name it does not take."""
    if flag in config_settings(cls):
        return config_settings(cls)[flag].kind
    return next((kind for f, kind in hparam_flags(cls) if f.name == flag), None)


# A config's checks beyond its sections' own, made by the layer that knows what they need (yt8m.training.checks for
# TrainConfig): the problems of `config`, leaving out the flags in `skip` (their values did not parse).
Checks = Callable[[Any, set[str]], list[str]]


@dataclass
class _Reading:
    """What `config_from_dict` gathers: each section's given values by field (None: the config's own settings), the
    names no setting took, the flags whose values did not parse, and the problems so far."""

    source: str
    by_section: dict[Optional[str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    loose: dict[str, Any] = dataclasses.field(default_factory=dict)
    ill_typed: set[str] = dataclasses.field(default_factory=set)
    problems: list[str] = dataclasses.field(default_factory=list)


def config_from_dict(cls: type[C], values: dict[str, Any], source: str = "config", check_values: bool = True,
                     checks: Optional[Checks] = None) -> C:
    """Build config class `cls` from a mapping of flat names (the flags') or of sections (nested YAML: a mapping
    under a section's name, keyed by its fields), naming in one ConfigError every unknown or ill-typed name and (with
    `check_values`) every invalid value and what `checks` finds. Configs a run stored (config.yaml, checkpoints) load
    with check_values=False: they were checked when made, and later versions must still read them."""
    reading = _Reading(source)
    for key, value in values.items():
        _route(cls, key, value, reading)
    built = {name: _build_section(kind, name, reading) for name, kind in sections(cls).items()}
    own = {name: value for name, value in _typed(cls, None, reading).items() if name not in built}
    _refuse_loose(cls, reading)
    config = cls(**own, **built)
    problems = reading.problems
    if check_values:
        problems += component_name_clashes(cls, built) + config_problems(config, skip=reading.ill_typed)
        problems += checks(config, reading.ill_typed) if checks is not None else []
    if problems:
        raise ConfigError(f"invalid config ({source})", list(dict.fromkeys(problems)))
    return config


def component_name_clashes(cls: type, built: dict[str, Any]) -> list[str]:
    """Hyper-parameters of the chosen components that share a name with a setting of the config or with another
    chosen component's: one flag cannot set both (the setting, or the first component, would take the value)."""
    settings, problems = set(config_settings(cls)), []
    owners: dict[str, str] = {}
    for name, section_cls in component_sections(cls).items():
        section = built.get(name)
        hparams = getattr(section, section_cls.HPARAMS, None)
        if hparams is None:
            continue
        component = getattr(section, section_cls.NAME)
        for f in dataclasses.fields(hparams):
            if f.name in settings:
                problems.append(f"{component}'s hyper-parameter {f.name!r} has the name of the setting --{f.name}: "
                                "the flag would set the setting only; rename the hyper-parameter")
            elif owners.setdefault(f.name, component) != component:
                problems.append(f"{component}'s hyper-parameter {f.name!r} has the name of {owners[f.name]}'s: one "
                                "flag would set both; rename one of them")
    return problems


def _route(cls: type, key: str, value: Any, reading: _Reading) -> None:
    """Put one given name's value where it belongs: a whole section (nested), a setting (flat), or loose (a
    component's hyper-parameter, or unknown)."""
    by_name = sections(cls)
    if key in by_name and isinstance(value, dict):
        section = by_name[key]
        known = {f.name for f in dataclasses.fields(section)}
        for name, inner in value.items():
            if name in known:
                reading.by_section.setdefault(key, {})[name] = inner
            elif issubclass(section, ComponentSection):
                reading.loose[name] = inner
            else:
                reading.problems.append(f"{reading.source}: unknown field '{key}.{name}'{closest(name, sorted(known))}")
        return
    setting = config_settings(cls).get(key)
    if setting is None:
        reading.loose[key] = value
    else:
        reading.by_section.setdefault(setting.section, {})[setting.field.name] = value


def _typed(cls: type, section: Optional[str], reading: _Reading, given: Optional[dict[str, Any]] = None
           ) -> dict[str, Any]:
    """The given values of a section's (or the config's own) fields, each as its field's type; one that is not is a
    problem, its flag left out of the checks, and its field left at its default."""
    given = reading.by_section.get(section, {}) if given is None else given
    typed = {}
    for f in dataclasses.fields(cls):
        if f.name not in given or (issubclass(cls, ComponentSection) and f.name == cls.HPARAMS):
            continue
        kind = field_type(cls, f.name)
        try:
            typed[f.name] = coerce(kind, given[f.name])
        except ValueError:
            reading.problems.append(f"{reading.source}: field '{flag_of(f)}' expects {_type_name(kind)}, "
                                    f"got {given[f.name]!r}")
            reading.ill_typed.add(flag_of(f))
    return typed


def _build_section(section: type, name: str, reading: _Reading) -> Any:
    values = _typed(section, name, reading)
    if issubclass(section, ComponentSection):
        values[section.HPARAMS] = _component_hparams(section, values, reading.by_section.get(name, {}), reading)
    return section(**values)


def _component_hparams(section: type[ComponentSection], values: dict[str, Any], given: dict[str, Any],
                       reading: _Reading) -> Any:
    """The chosen component's hyper-parameters: the `hparams` mapping (or YAML text) given, with its own names given
    loose over it, typed; None where no component has the chosen name (the section's checks say so)."""
    fields = {f.name: f for f in dataclasses.fields(section)}
    name = values.get(section.NAME, fields[section.NAME].default)
    cls = section.hparams_class(name)
    if cls is None:
        return None
    mapping: dict[str, Any] = {}
    hparams_flag = flag_of(fields[section.HPARAMS])
    if section.HPARAMS in given:
        try:
            mapping = coerce(dict, given[section.HPARAMS])
        except ValueError:
            reading.problems.append(f"{reading.source}: field '{hparams_flag}' expects {_type_name(dict)}, "
                                    f"got {given[section.HPARAMS]!r}")
    own = {f.name for f in dataclasses.fields(cls)}
    mapping.update({key: reading.loose.pop(key) for key in list(reading.loose) if key in own})
    reading.problems += [f"{reading.source}: --{hparams_flag}: '{key}' is not a hyper-parameter of {name} (it has: "
                         f"{', '.join(sorted(own))})" for key in sorted(set(mapping) - own)]
    return cls(**_typed(cls, None, reading, given={key: value for key, value in mapping.items() if key in own}))


def _refuse_loose(cls: type, reading: _Reading) -> None:
    """Names no setting took: another component's hyper-parameters are ignored with a warning, the rest unknown."""
    if not reading.loose:
        return
    others = {f.name for f, _ in hparam_flags(cls)}
    ignored = sorted(set(reading.loose) & others)
    if ignored:
        log.warning("%s: not hyper-parameters of the chosen components, ignored: %s", reading.source,
                    ", ".join(f"--{name}" for name in ignored))
    known = sorted(flag_names(cls))
    reading.problems += [f"{reading.source}: unknown field '{name}'{closest(name, known)}"
                         for name in sorted(set(reading.loose) - others)]


def coerce(kind: Any, value: Any) -> Any:
    """`value` (a flag's text, or YAML's value) as type `kind`; a ValueError where it is not one."""
    if value is None:
        return None
    try:
        if kind is bool:
            return parse_bool(value)
        if kind is int:
            if isinstance(value, float) and not value.is_integer() or isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if kind is str:
            return str(value)
        if kind is dict or _is_list_of_mappings(kind):
            return _yaml_value(value, dict if kind is dict else list)
        if typing.get_origin(kind) is list:
            return parse_list(value, typing.get_args(kind)[0])
    except (ValueError, TypeError, argparse.ArgumentTypeError) as err:
        raise ValueError(f"expects {_type_name(kind)}, got {value!r}") from err
    return value


def _yaml_value(value: Any, kind: type) -> Any:
    """A list-of-mappings setting (tasks:) or a mapping setting (model_hparams): YAML's value, or the same as YAML
    text from a flag, empty text for none (the entries are checked later)."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise ValueError(value) from err
    if value is None:
        return kind()
    if not isinstance(value, (list, tuple) if kind is list else dict):
        raise ValueError(value)
    return kind(value)


def _is_list_of_mappings(kind: Any) -> bool:
    return typing.get_origin(kind) is list and typing.get_args(kind) == (dict,)


def _type_name(kind: Any) -> str:
    if kind is dict:
        return "a mapping (YAML)"
    if _is_list_of_mappings(kind):
        return "a list of mappings (YAML)"
    if typing.get_origin(kind) is list:
        return f"a comma-separated list of {typing.get_args(kind)[0].__name__}"
    return getattr(kind, "__name__", str(kind))


def shown(value: Any) -> str:
    """A setting's value as a message shows it: lists in the starter kit's comma form, 'a,b'."""
    return repr(",".join(map(str, value)) if isinstance(value, list) else value)


def config_problems(config: DataclassInstance, skip: Iterable[str] = frozenset()) -> list[str]:
    """Every invalid value of `config` by its settings' rules, and every invalid combination each of its sections
    (and component hyper-parameters) finds in its own `problems()`, as lines naming the flag; flags in `skip` are
    left out."""
    skip = set(skip)
    problems = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            problems += config_problems(value, skip)
        elif flag_of(f) not in skip:
            problem = _value_problem(f.metadata, value)
            if problem:
                problems.append(f"--{flag_of(f)} {problem}")
    own = getattr(config, "problems", None)
    return problems + (own() if callable(own) else [])


def _value_problem(rules: Any, value: Any) -> Optional[str]:
    if rules.get("required") and value in ("", None):
        return "is required"
    if value is None or value == "":
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    bounds = [("at_least", lambda low: value >= low, "at least"), ("above", lambda low: value > low, "above"),
              ("at_most", lambda high: value <= high, "at most"), ("below", lambda high: value < high, "below")]
    for key, holds, words in bounds:
        if key in rules and not holds(rules[key]):
            return f"must be {words} {rules[key]:g}, got {value}"
    if "choices" in rules and value not in rules["choices"]():
        return f"must be one of {', '.join(rules['choices']())}, got {value!r}"
    if "check" in rules:
        return rules["check"](value)
    return None


def config_document(config: DataclassInstance) -> dict[str, Any]:
    """A config as nested YAML holds it: each section under its name, keyed by its fields (a component's
    hyper-parameters as a mapping); what config.yaml and checkpoints store, and `config_from_dict` reads back."""
    return {f.name: _document_value(getattr(config, f.name)) for f in dataclasses.fields(config)}


def _document_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_document(value)
    if isinstance(value, (list, tuple)):
        return [_document_value(item) for item in value]
    if isinstance(value, dict):
        return {key: _document_value(item) for key, item in value.items()}
    return value


def config_values(config: DataclassInstance) -> dict[str, Any]:
    """A config's settings by flag, its components' hyper-parameters under their own names: the flat form."""
    values: dict[str, Any] = {}
    for setting in config_settings(type(config)).values():
        holder = config if setting.section is None else getattr(config, setting.section)
        value = getattr(holder, setting.field.name)
        if isinstance(holder, ComponentSection) and setting.field.name == holder.HPARAMS:
            values.update(config_document(value) if value is not None else {})
        else:
            values[setting.flag] = _document_value(value)
    return values


def with_values(config: C, **changes: Any) -> C:
    """`config` with the settings named by flag replaced by typed values (frozen configs change only so)."""
    settings = config_settings(type(config))
    top: dict[str, Any] = {}
    by_section: dict[str, dict[str, Any]] = {}
    for flag, value in changes.items():
        setting = settings[flag]
        if setting.section is None:
            top[setting.field.name] = value
        else:
            by_section.setdefault(setting.section, {})[setting.field.name] = value
    replaced = {name: dataclasses.replace(getattr(config, name), **values) for name, values in by_section.items()}
    return dataclasses.replace(config, **top, **replaced)


def read_section(document: dict[str, Any], name: str, section: type[C], source: str) -> C:
    """One section of a stored config (a run's config.yaml or checkpoint), whichever form it has: the mapping under
    `name` (nested), or its settings' flat names. For the layers that read what a run stored without the command's
    whole config (a checkpoint's model, a teacher's features); its values are not checked again. `section` may be a
    part of the stored section (the fields a layer reads): the others are left out."""
    holder = _holder(name, section)
    names = set(flag_names(holder))
    values: dict[str, Any] = {key: value for key, value in document.items() if key in names}
    if isinstance(document.get(name), dict):
        fields = {f.name for f in dataclasses.fields(section)}
        values[name] = {key: value for key, value in document[name].items() if key in fields}
    stored: C = getattr(config_from_dict(holder, values, source, check_values=False), name)
    return stored


@functools.cache
def _holder(name: str, section: type) -> type[Any]:
    """A config of one section, `name`."""
    return dataclasses.make_dataclass(f"Stored_{name}", [(name, section, dataclasses.field(default_factory=section))],
                                      frozen=True)


def differing(old: dict[str, Any], new: dict[str, Any], names: Sequence[str]) -> list[tuple[str, Any, Any]]:
    """(name, old value, new value) of each named flat setting (config_values) whose values differ."""
    return [(name, old.get(name), new.get(name)) for name in names if old.get(name) != new.get(name)]


def load_yaml(path: str) -> dict[str, Any]:
    """A YAML file's mapping; plain YAML only (no `!!python` tags), errors as one line naming the file and line."""
    if not storage.exists(path):
        raise FileNotFoundError(f"config file not found: {path}")
    with storage.open_file(path, "r") as fh:
        try:
            data = yaml.safe_load(fh) or {}
        except yaml.YAMLError as err:
            raise ValueError(f"{path}: not a valid YAML config: {_one_line(err)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config file must hold a mapping of field: value")
    return data


def _one_line(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err)
    return where + " ".join(str(problem).split())


def save_config(config: DataclassInstance, path: str) -> None:
    """config.yaml: the config nested by section (`config_document`)."""
    write_file_atomically(path, lambda out: yaml.safe_dump(config_document(config), out, sort_keys=False))


def load_config(cls: type[C], path: str) -> C:
    """A config a run stored (its values were checked when it was made)."""
    return config_from_dict(cls, load_yaml(path), source=path, check_values=False)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One `--name` flag per setting of `cls` and per hyper-parameter of its components (a mapping or list of
    mappings takes YAML text); booleans also take `--noname` and `--name=false`.

    Values stay text here and are typed by `config_from_dict`, so that one error lists every bad flag. Defaults are
    suppressed so that `parse_config` can tell which flags were given.
    """
    if isinstance(parser, FlagParser) and cls not in parser.config_classes:
        parser.config_classes.append(cls)
    settings = [(s.flag, s.field, s.kind) for s in config_settings(cls).values()]
    settings += [(f.name, f, kind) for f, kind in hparam_flags(cls) if f.name not in config_settings(cls)]
    taken = {option for action in parser._actions for option in action.option_strings}
    for flag, f, kind in settings:
        if f"--{flag}" in taken:  # added before: the components a command line names add only their own flags
            continue
        help_text = f"{f.metadata.get('help', '')} (default: {f.metadata.get('shown_default', _shown_default(f))})"
        if kind is bool:
            parser.add_argument(f"--{flag}", dest=flag, nargs="?", const="true", default=argparse.SUPPRESS,
                                metavar="BOOL", help=help_text)
            parser.add_argument(f"--no{flag}", dest=flag, action="store_const", const="false",
                                default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        else:
            metavar = "A,B,..." if typing.get_origin(kind) is list else getattr(kind, "__name__", "VALUE").upper()
            parser.add_argument(f"--{flag}", dest=flag, default=argparse.SUPPRESS, metavar=metavar, help=help_text)


def _shown_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
        return ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
    return f.default


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

    # argparse's parse_args is overloaded on the namespace's type; this one keeps the plain Namespace form only.
    def parse_args(self, args: Optional[Sequence[str]] = None,  # type: ignore[override]
                   namespace: Optional[argparse.Namespace] = None) -> argparse.Namespace:
        argv = list(sys.argv[1:] if args is None else args)
        self._add_named_components_flags(argv)
        # Unknown flags first: argparse would otherwise name a required flag the misspelt one was meant to be.
        unknown = self._unknown_flags(argv)
        if unknown:
            known = self._flag_names()
            named = ", ".join(f"{flag}{_did_you_mean(flag, known)}" for flag in unknown)
            raise FlagError(f"unknown flag{'s' if len(unknown) > 1 else ''} {named}; {self._help_hint()}")
        parsed, extra = self.parse_known_args(argv, namespace)
        if extra:
            raise FlagError(f"unexpected argument(s) {' '.join(map(repr, extra))}; {self._help_hint()}")
        return parsed

    def error(self, message: str) -> typing.NoReturn:
        raise FlagError(f"{message}; {self._help_hint()}")

    def _add_named_components_flags(self, argv: list[str]) -> None:
        """The flags of the hyper-parameters of components the command line (or its --config file) names by import
        path: `--model mymodels:MyModel --hidden 512` takes --hidden as a built-in model's flags are taken."""
        values = _config_file_values(argv)
        values.update(_named_values(argv))
        for cls in self.config_classes:
            load_components(cls, values)
            add_config_arguments(self, cls)

    def _unknown_flags(self, argv: list[str]) -> list[str]:
        """The long flags of `argv` that no parser of this command takes (up to a `--`, after which all is values)."""
        known = set(self._flag_names(hidden=True))
        given = argv[:argv.index("--")] if "--" in argv else argv
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


def load_components(cls: type, values: dict[str, Any]) -> None:
    """Import the components a config's values name by import path, so that their hyper-parameters are known names
    (flags, YAML fields, searchable fields); a name that finds nothing is left to the config's checks."""
    flat = flattened(cls, values)
    for section in component_sections(cls).values():
        name_field = next(f for f in dataclasses.fields(section) if f.name == section.NAME)
        name = flat.get(flag_of(name_field))
        if isinstance(name, str):
            try:
                section.hparams_class(name)
            except (ValueError, TypeError):
                pass


def _did_you_mean(flag: str, known: Sequence[str]) -> str:
    match = nearest(flag, known)
    return f" (did you mean {match}?)" if match else ""


def add_config_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, metavar="FILE.yaml",
                        help="YAML file with the same names as the flags (flat, or nested by section); flags "
                             "override it.")


def given_values(cls: type, args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The values `--config FILE.yaml` and the flags given hold (flags win), and what they were read from."""
    values: dict[str, Any] = {}
    file_path = getattr(args, "config", None)
    if file_path:
        values.update(load_yaml(file_path))
    names = set(flag_names(cls))
    flags = {k: v for k, v in vars(args).items() if k in names}
    values.update(flags)
    return values, " and ".join(part for part in (file_path, "flags" if flags else "") if part) or "defaults"


def parse_config(cls: type[C], args: argparse.Namespace, check_values: bool = True, checks: Optional[Checks] = None
                 ) -> tuple[C, set[str]]:
    """Resolve a config from `--config FILE.yaml` and the flags given; flags win. `checks` adds the config's own
    (see config_from_dict). Returns the config and the flags given explicitly (by file or flag), by their flat
    names."""
    values, source = given_values(cls, args)
    return (config_from_dict(cls, values, source=source, check_values=check_values, checks=checks),
            given_flags(cls, values))


def flattened(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """A mapping of flat names or sections (nested YAML) as flat names only, a component's hyper-parameters mapping
    under their own names; what no setting takes stays as it is, for the config's checks to name."""
    by_name = sections(cls)
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if not (key in by_name and isinstance(value, dict)):
            flat[key] = value
            continue
        section = by_name[key]
        fields = {f.name: f for f in dataclasses.fields(section)}
        for name, inner in value.items():
            if issubclass(section, ComponentSection) and name == section.HPARAMS and isinstance(inner, dict):
                flat.update(inner)
            else:
                flat[flag_of(fields[name]) if name in fields else name] = inner
    return flat


def given_flags(cls: type, values: dict[str, Any]) -> set[str]:
    """The flat names of what a mapping of flat names or sections gives."""
    return set(flattened(cls, values))

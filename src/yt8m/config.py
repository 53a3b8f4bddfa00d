"""Typed configs in sections, filled from YAML (flat, or nested by section) and flags, and checked whole.

A command's config is a frozen dataclass of sections; a section is a frozen dataclass of settings (yt8m.fields.setting)
owned by the component it configures. Every setting is a flag of its own name, as in the starter kit, so flat YAML,
stored runs and old command lines load as they did; one ConfigError lists every problem of a config. A config only
describes: reading and checking it runs none of a user's code. The components it names (a model, a loss) become
components in one place, `resolve_components`, when a run is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Optional, Protocol, Sequence, TypeVar

import yaml

from yt8m.fields import closest, parse_bool, parse_list, quoted
from yt8m.io import storage
from yt8m.io.files import write_file_atomically
from yt8m.plugins.registry import Registry, is_import_path

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
    hyper-parameters in its `hparams` field: the values given (a mapping) while the config only describes, the
    component's own dataclass once `resolved` (when the run is built, which imports a component of one's own).

    The hyper-parameters are given under the section's name, `SCOPE`: nested in YAML (`model: {name: MoeModel,
    moe_num_mixtures: 4}`) or dotted (`--model.moe_num_mixtures 4`). A built-in component's also take the starter kit's
    flat names (`--moe_num_mixtures 4`); a flat name two chosen components declare, or one a component of one's own
    shares with another component, is refused naming both (their dotted forms always work); another component's flat
    name is ignored with a warning (one file may serve several models)."""

    NAME: ClassVar[str] = "name"
    HPARAMS: ClassVar[str] = "hparams"
    SCOPE: ClassVar[str]  # the section's name in a config: the prefix of its hyper-parameters' dotted names
    __dataclass_fields__: ClassVar[dict[str, Any]]  # a component section is a dataclass

    @classmethod
    def registry(cls) -> Registry[Any]:
        """The components the section names, each with its hyper-parameters' dataclass (`.hparams`)."""
        raise NotImplementedError

    @property
    def component_name(self) -> str:
        return str(getattr(self, self.NAME))

    @classmethod
    def name_flag(cls) -> str:
        return flag_of(next(f for f in dataclasses.fields(cls) if f.name == cls.NAME))

    @classmethod
    def default_component(cls) -> str:
        return str(next(f.default for f in dataclasses.fields(cls) if f.name == cls.NAME))

    def resolved(self: S) -> S:
        """This section with its component found (a ConfigError names every problem: a name that finds none, a module
        that does not import, a hyper-parameter the component does not take or of the wrong type): its name the one
        that finds it in any process, its hyper-parameters the component's dataclass, at its defaults where not
        given. A new object: the section itself is never changed."""
        registry, name = self.registry(), self.component_name
        try:
            entry = registry.entry(name)
        except (ValueError, TypeError) as err:
            raise ConfigError("invalid config", [f"--{self.name_flag()} {err}"]) from err
        if entry is None:
            raise ConfigError("invalid config", [f"--{self.name_flag()} {registry.unknown(name)}"])
        kind = entry.component.hparams
        given = getattr(self, self.HPARAMS)
        if not isinstance(given, kind):
            given = config_from_dict(kind, self._checked_mapping(given, kind), source=f"--{self.name_flag()} {name}")
        return dataclasses.replace(self, **{self.NAME: entry.recorded_name, self.HPARAMS: given})

    def _checked_mapping(self, given: Any, kind: type) -> dict[str, Any]:
        mapping = hparams_mapping(given)
        own = [f.name for f in dataclasses.fields(kind)]
        unknown = [f"--{self.SCOPE}.{key}: {self.component_name} has no hyper-parameter {key!r}{closest(key, own)} "
                   f"(it has: {', '.join(own) or 'none'})" for key in mapping if key not in own]
        if unknown:
            raise ConfigError("invalid config", unknown)
        return mapping

    @classmethod
    def loaded_fields(cls, name: str) -> Optional[dict[str, dataclasses.Field]]:
        """The hyper-parameters of component `name` where finding it imports nothing (a built-in, one registered or
        imported already); None where it is not found so."""
        entry = cls.registry().peek(name) if isinstance(name, str) else None
        return {f.name: f for f in dataclasses.fields(entry.component.hparams)} if entry is not None else None

    @classmethod
    def loaded_components(cls) -> list[tuple[str, bool, dict[str, dataclasses.Field]]]:
        """(name, built-in, hyper-parameters by name) of every component loaded so far, built-ins first."""
        return [(entry.name, entry.builtin, {f.name: f for f in dataclasses.fields(entry.component.hparams)})
                for entry in cls.registry().entries(load=False)]


S = TypeVar("S", bound=ComponentSection)


def hparams_mapping(given: Any) -> dict[str, Any]:
    """Hyper-parameters given as a mapping, a dataclass instance (Python callers) or None, as a mapping."""
    if dataclasses.is_dataclass(given) and not isinstance(given, type):
        return {f.name: getattr(given, f.name) for f in dataclasses.fields(given)}
    return dict(given or {})


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
    """(field, type) of the flat names of the loaded components' hyper-parameters a config takes, one per name (the
    first component's): the names a flat form may give."""
    seen: dict[str, tuple[dataclasses.Field, Any]] = {}
    for section in component_sections(cls).values():
        for _, _, fields in section.loaded_components():
            for name, f in fields.items():
                seen.setdefault(name, (f, f.type))
    return list(seen.values())


def flag_names(cls: type) -> list[str]:
    """Every flag and flat YAML name a config class takes, the loaded components' hyper-parameters included."""
    return [*config_settings(cls), *(f.name for f, _ in hparam_flags(cls) if f.name not in config_settings(cls))]


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def field_type(cls: type, name: str) -> Any:
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return hint


def hparam_type(section: type[ComponentSection], component: str, name: str) -> Any:
    """The type of hyper-parameter `name` of a loaded component; None where it has none (or is not loaded)."""
    fields = section.loaded_fields(component)
    if fields is None or name not in fields:
        return None
    holder = dataclasses.make_dataclass("Holder", [(name, fields[name].type)])
    return field_type(holder, name) if isinstance(fields[name].type, str) else fields[name].type


def flag_type(cls: type, flag: str) -> Any:
    """The type of a config's flag (a loaded component's hyper-parameter included, by its flat or dotted name, the
    first component's that declares it); None for a name it does not take."""
    if flag in config_settings(cls):
        return config_settings(cls)[flag].kind
    key, dot, name = flag.partition(".")
    for scope, section in component_sections(cls).items():
        if dot and key != scope:
            continue
        for component, _, fields in section.loaded_components():
            if (name if dot else flag) in fields:
                return hparam_type(section, component, name if dot else flag)
    return None


# A config's checks beyond its sections' own, made by the layer that knows what they need (yt8m.training.checks for
# TrainConfig): the problems of `config`, leaving out the flags in `skip` (their values did not parse).
Checks = Callable[[Any, set[str]], list[str]]


@dataclass
class _Reading:
    """What `config_from_dict` gathers: each section's given values by field (None: the config's own settings), each
    component section's hyper-parameters given under its name, the flat names no setting took, the flags whose values
    did not parse, and the problems so far."""

    source: str
    by_section: dict[Optional[str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    scoped: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    loose: dict[str, Any] = dataclasses.field(default_factory=dict)
    ill_typed: set[str] = dataclasses.field(default_factory=set)
    problems: list[str] = dataclasses.field(default_factory=list)


def config_from_dict(cls: type[C], values: dict[str, Any], source: str = "config", check_values: bool = True,
                     checks: Optional[Checks] = None) -> C:
    """Build config class `cls` from a mapping of flat names (the flags'), dotted names (`model.moe_num_mixtures`,
    `schedule.seed`) or sections (nested YAML: a mapping under a section's name, keyed by its fields), naming in one
    ConfigError every unknown or ill-typed name and (with `check_values`) every invalid value and what `checks` finds.
    Nothing is imported: a component's hyper-parameters stay the values given until the run resolves them. Configs a
    run stored (config.yaml, checkpoints) load with check_values=False: they were checked when made, and later
    versions must still read them."""
    reading = _Reading(source)
    for key, value in values.items():
        _route(cls, key, value, reading)
    _claim_flat_names(cls, reading)
    built = {name: _build_section(kind, name, reading) for name, kind in sections(cls).items()}
    own = {name: value for name, value in _typed(cls, None, reading).items() if name not in built}
    config = cls(**own, **built)
    problems = reading.problems
    if check_values:
        problems += config_problems(config, skip=reading.ill_typed)
        problems += checks(config, reading.ill_typed) if checks is not None else []
    if problems:
        raise ConfigError(f"invalid config ({source})", list(dict.fromkeys(problems)))
    return config


def _route(cls: type, key: str, value: Any, reading: _Reading) -> None:
    """Put one given name's value where it belongs: a whole section (nested), a section's field or a component's
    hyper-parameter by dotted name, a setting (flat), or loose (a component's flat hyper-parameter, or unknown)."""
    by_name = sections(cls)
    if key in by_name and isinstance(value, dict):
        for name, inner in value.items():
            _route_in_section(key, by_name[key], name, inner, reading)
        return
    section_name, dot, name = key.partition(".")
    if dot and section_name in by_name:
        _route_in_section(section_name, by_name[section_name], name, value, reading)
        return
    setting = config_settings(cls).get(key)
    if setting is None:
        reading.loose[key] = value
    else:
        reading.by_section.setdefault(setting.section, {})[setting.field.name] = value


# A section's ClassVar naming the settings it held once and another section holds now (a config.yaml written before
# they moved names them in the old section): read by their flat names, where they live now.
MOVED_OUT = "MOVED_OUT"


def _route_in_section(key: str, section: type, name: str, value: Any, reading: _Reading) -> None:
    known = {f.name for f in dataclasses.fields(section)}
    if name in known:
        reading.by_section.setdefault(key, {})[name] = value
    elif name in getattr(section, MOVED_OUT, ()):
        reading.loose[name] = value
    elif issubclass(section, ComponentSection):
        reading.scoped.setdefault(key, {})[name] = value
    else:
        reading.problems.append(f"{reading.source}: unknown field '{key}.{name}'{closest(name, sorted(known))}")


def _chosen(section: type[ComponentSection], key: str, reading: _Reading) -> str:
    """The component a section names (its default where the values name none)."""
    return str(reading.by_section.get(key, {}).get(section.NAME, section.default_component()))


def _claim_flat_names(cls: type, reading: _Reading) -> None:
    """Each flat name no setting took goes to the one chosen component that declares it (a component of one's own
    only where no other loaded component declares it too: the flat names are the built-ins' starter-kit flags); a
    name two chosen components declare is refused naming both; another component's is ignored with a warning; the
    rest are unknown. A chosen component named by an import path not imported yet (a module of one's own, imported
    when the run is built) takes the names no loaded component declares, to be checked then."""
    chosen = {key: (section, _chosen(section, key, reading)) for key, section in component_sections(cls).items()}
    declared = {key: section.loaded_fields(name) for key, (section, name) in chosen.items()}
    loaded = [(key, component, builtin, fields) for key, (section, _) in chosen.items()
              for component, builtin, fields in section.loaded_components()]
    ignored = []
    for name, value in list(reading.loose.items()):
        owners = [key for key, fields in declared.items() if fields is not None and name in fields]
        elsewhere = [(key, component) for key, component, _, fields in loaded if name in fields]
        if len(owners) > 1:
            both = " and ".join(f"{chosen[key][1]} (--{key}.{name})" for key in owners)
            reading.problems.append(f"{reading.source}: --{name} is a hyper-parameter of both {both}: give it by "
                                    "its dotted name")
        elif owners:
            _claim_one(owners[0], chosen[owners[0]][1], name, value, elsewhere, loaded, reading)
        elif elsewhere:
            ignored.append(name)
        else:
            pending = [key for key, fields in declared.items() if fields is None and is_import_path(chosen[key][1])]
            if pending:
                reading.scoped.setdefault(pending[0], {}).setdefault(name, value)
            else:
                known = sorted(flag_names(cls))
                reading.problems.append(f"{reading.source}: unknown field '{name}'{closest(name, known)}")
        reading.loose.pop(name)
    if ignored:
        log.warning("%s: not hyper-parameters of the chosen components, ignored: %s", reading.source,
                    ", ".join(f"--{name}" for name in ignored))


def _claim_one(key: str, component: str, name: str, value: Any, elsewhere: list[tuple[str, str]],
               loaded: list[tuple[str, str, bool, dict]], reading: _Reading) -> None:
    builtin = next((flag for k, other, flag, _ in loaded if k == key and other == component), False)
    others = sorted(other for k, other in elsewhere if (k, other) != (key, component))
    if not builtin and others:
        named = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        reading.problems.append(f"{reading.source}: --{name} is a hyper-parameter of both {component} and {named}: "
                                f"give it as --{key}.{name}")
    elif name in reading.scoped.get(key, {}):
        reading.problems.append(f"{reading.source}: {component}'s {name} is given twice, as --{name} and as "
                                f"--{key}.{name}: give it once")
    else:
        reading.scoped.setdefault(key, {})[name] = value


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
                                    f"got {quoted(given[f.name])}")
            reading.ill_typed.add(flag_of(f))
    return typed


def _build_section(section: type, name: str, reading: _Reading) -> Any:
    values = _typed(section, name, reading)
    if issubclass(section, ComponentSection):
        values.update(_component_values(section, name, values, reading))
    return section(**values)


def _component_values(section: type[ComponentSection], key: str, values: dict[str, Any], reading: _Reading
                      ) -> dict[str, Any]:
    """A component section's name and hyper-parameters: those given (its `hparams`, a mapping, YAML text or a
    dataclass instance, with those given by name over it), typed as the component's own dataclass where the
    component is known without importing anything (a built-in, one registered or imported already; recorded by the
    name that finds it in any process); else as given, for the run to resolve."""
    name = str(values.get(section.NAME, section.default_component()))
    given = reading.by_section.get(key, {}).get(section.HPARAMS)
    scoped = reading.scoped.get(key, {})
    entry = section.registry().peek(name)
    kind = entry.component.hparams if entry is not None else None
    if kind is not None and isinstance(given, kind) and not scoped:
        return {section.NAME: entry.recorded_name, section.HPARAMS: given}  # type: ignore[union-attr]
    mapping = {**_given_mapping(section, given, reading), **scoped}
    if entry is None or kind is None:
        return {section.HPARAMS: mapping}
    own = [f.name for f in dataclasses.fields(kind)]
    reading.problems += [f"{reading.source}: --{key}.{item}: {name} has no hyper-parameter {item!r}"
                         f"{closest(item, own)} (it has: {', '.join(own) or 'none'})"
                         for item in mapping if item not in own]
    typed = kind(**_typed(kind, None, reading, given={item: value for item, value in mapping.items() if item in own}))
    return {section.NAME: entry.recorded_name, section.HPARAMS: typed}


def _given_mapping(section: type[ComponentSection], given: Any, reading: _Reading) -> dict[str, Any]:
    """The `hparams` setting's value as a mapping (YAML text from a flag, a mapping, a dataclass instance, None)."""
    if dataclasses.is_dataclass(given) and not isinstance(given, type):
        return hparams_mapping(given)
    try:
        return coerce(dict, given) if given is not None else {}
    except ValueError:
        flag = flag_of(next(f for f in dataclasses.fields(section) if f.name == section.HPARAMS))
        reading.problems.append(f"{reading.source}: field '{flag}' expects {_type_name(dict)}, got {given!r}")
        return {}


def resolve_components(config: C) -> C:
    """`config` with every component it names found and its hyper-parameters typed (ComponentSection.resolved),
    and the checks that find components made (a metric's name): what a run is built from. The one place where names
    become components; every problem in one ConfigError."""
    resolved, problems = {}, []
    for name in component_sections(type(config)):
        try:
            resolved[name] = getattr(config, name).resolved()
        except ConfigError as err:
            problems += err.problems
    problems += config_problems(config, components=True)
    if problems:
        raise ConfigError("invalid config", list(dict.fromkeys(problems)))
    return dataclasses.replace(config, **resolved)


def component_problems(config: DataclassInstance) -> list[str]:
    """What `resolve_components` finds wrong with `config`, as lines."""
    try:
        resolve_components(config)
    except ConfigError as err:
        return err.problems
    return []


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
            element = typing.get_args(kind)[0]
            if isinstance(value, (int, float)):  # one number alone (`feature_sizes: 128`): a list of one, checked
                return [coerce(element, value)]
            return parse_list(value, element)
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


def config_problems(config: DataclassInstance, skip: Iterable[str] = frozenset(), components: bool = False
                    ) -> list[str]:
    """Every invalid value of `config` by its settings' rules, and every invalid combination each of its sections
    (and component hyper-parameters) finds in its own `problems()`, as lines naming the flag; flags in `skip` are
    left out. A rule that finds a component (a metric's name: `setting(resolves=True)`) imports a user's code, so it
    is made only with `components` (and then alone), when the run is built."""
    skip = set(skip)
    problems = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            problems += config_problems(value, skip, components)
        elif flag_of(f) not in skip and bool(f.metadata.get("resolves")) == components:
            problem = _value_problem(f.metadata, value)
            if problem:
                problems.append(f"--{flag_of(f)} {problem}")
    own = getattr(config, "problems", None)
    return problems + (own() if callable(own) and not components else [])


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
    """A config's settings by flag, its components' hyper-parameters under their own names: the starter kit's flat
    form, to show and compare (a config is read back whole from its `config_document`)."""
    values: dict[str, Any] = {}
    for setting in config_settings(type(config)).values():
        holder = config if setting.section is None else getattr(config, setting.section)
        value = getattr(holder, setting.field.name)
        if isinstance(holder, ComponentSection) and setting.field.name == holder.HPARAMS:
            values.update({name: _document_value(item) for name, item in hparams_mapping(value).items()})
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
    """A config a run stored, its components resolved (its values were checked when it was made; a stored config is
    a built one)."""
    return resolve_components(config_from_dict(cls, load_yaml(path), source=path, check_values=False))


def flattened(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """A mapping of flat names or sections (nested YAML) as flat and dotted names only: a section's fields by their
    flags, a component's hyper-parameters (its `hparams` mapping and the names beside it) as `SECTION.NAME`, another
    section's unknown names as `SECTION.NAME` (for the config's checks to name)."""
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
                flat.update({f"{key}.{hparam}": item for hparam, item in inner.items()})
            else:
                flat[flag_of(fields[name]) if name in fields else f"{key}.{name}"] = inner
    return flat


def given_flags(cls: type, values: dict[str, Any]) -> set[str]:
    """The flat names of what a mapping of flat names, dotted names or sections gives (a component's
    hyper-parameter by its own name)."""
    names = set()
    for name in flattened(cls, values):
        section, dot, inner = name.partition(".")
        names.add(inner if dot and section in sections(cls) else name)
    return names


def load_named_components(cls: type, values: dict[str, Any]) -> None:
    """Import the components a config's values name by import path, so that their hyper-parameters' flat names are
    known to the reader: the command line and the Python API call it where such names are given (reading itself
    imports nothing). A name that finds nothing is left to the run's resolution to report."""
    flat = flattened(cls, values)
    for key, section in component_sections(cls).items():
        name = flat.get(section.name_flag(), flat.get(f"{key}.{section.NAME}"))
        if isinstance(name, str):
            try:
                section.registry().entry(name)
            except (ValueError, TypeError):
                pass

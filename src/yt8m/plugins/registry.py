"""A registry of one kind of component (models, losses, metrics): the built-ins, the components an installed
package declares under the kind's entry-point group, those a module registers, and any class an import path names.

Configs record a component by the name that finds it again in any process: a built-in's or an entry point's name,
or `module:Name` for a component of a module's own (one defined in __main__ is known to its process only). A
component given as an object (the Python API's `model=MyModel`) becomes such a name here too (`Registry.named`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import logging
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, Optional, Sequence, TypeVar

from yt8m.fields import closest
from yt8m.plugins.faults import one_line, raised_at

T = TypeVar("T")
log = logging.getLogger("yt8m.plugins")
MAIN_MODULE = "__main__"


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered component, the name configs record it by, and where it came from (for messages)."""

    component: T
    name: str
    origin: str
    source: Any = None  # the class or function the component was made from
    fixed_name: Optional[str] = None  # a built-in's, an entry point's or an import path's: the name recorded
    builtin: bool = False  # one of yt8m's own: its hyper-parameters keep the starter kit's flat flags

    @property
    def process_local(self) -> bool:
        """Whether only this process finds the component: recorded by a bare name no other process registers."""
        return self.fixed_name is None and _process_local(self.source)

    @property
    def recorded_name(self) -> str:
        """The name another process finds the component by: a module's own is found by its import path once its
        module holds it (a decorator runs before the module binds the class's name: read when asked)."""
        return self.fixed_name or object_path(self.source) or self.name


def is_import_path(name: str) -> bool:
    """`package.module:Name` or `package.module.Name`; a registered name has neither ':' nor '.'."""
    return ":" in name or "." in name


def split_import_path(path: str) -> tuple[str, str]:
    """(module, attribute) of an import path; a ValueError for one that names no attribute of a module."""
    module, sep, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    if not module or not attribute or (":" in path and ":" in attribute):
        raise ValueError(f"{path!r} is not an import path: write package.module:Name (or package.module.Name)")
    return module, attribute


def import_object(path: str) -> Any:
    """The object an import path names; a ValueError naming the module and the exception where it does not import
    (any exception the module raises while importing included: it is the user's code failing), with the line that
    raised it, or where yt8m looked for a module that is nowhere."""
    module_name, attribute = split_import_path(path)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # a user module's import may fail any way: reported in one line
        raise ValueError(f"{path}: cannot import module {module_name!r} ({one_line(err)}){_why(err, module_name)}"
                         ) from err
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            known = [name for name in dir(obj) if not name.startswith("_")]
            raise ValueError(f"{path}: {described(obj)} has no attribute {part!r}{closest(part, known)}")
        obj = getattr(obj, part)
    return obj


def _why(err: BaseException, module_name: str) -> str:
    """Where an import failed: a module that is not on the path (where yt8m looks), or the line of the module's own
    code that raised (a SyntaxError names its line itself)."""
    missing = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
    if missing and (module_name == missing or module_name.startswith(missing + ".")):
        return (f": no {missing!r} in the working directory ({os.getcwd()}) nor on PYTHONPATH; run yt8m where "
                "the module is, or add its folder to PYTHONPATH")
    if isinstance(err, SyntaxError):
        return ""
    where = raised_at(err)
    return f", raised at {where}" if where else ""


def described(obj: Any) -> str:
    """What an import path found, for a message: `module 'm'`, `class C`, `function f`, or an object's type and
    value (never an address)."""
    if isinstance(obj, types.ModuleType):
        where = getattr(obj, "__file__", None)
        return f"module {obj.__name__!r}" + (f" ({where})" if where else "")
    if isinstance(obj, type):
        return f"class {obj.__qualname__}"
    if callable(obj) and hasattr(obj, "__qualname__"):
        return f"function {obj.__qualname__}"
    text = repr(obj)
    return f"{type(obj).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


def _process_local(obj: Any) -> bool:
    """Whether `obj` is defined where no other process can import it: in __main__, or inside a function."""
    return getattr(obj, "__module__", None) == MAIN_MODULE or "<locals>" in getattr(obj, "__qualname__", "")


def _made_from(entries: dict[str, Entry[T]], obj: Any) -> Optional[Entry[T]]:
    """The entry registered from `obj` (a class or function), if any."""
    return next((entry for entry in entries.values() if entry.source is obj), None)


def instance_arguments(instance: Any, hparams: Any) -> dict[str, Any]:
    """The hyper-parameters (`hparams`, a dataclass) an instance of a component was made with: its `hparams`, or
    its attributes of their names; a ValueError (one line) where they cannot be read back."""
    if not isinstance(hparams, type) or not dataclasses.is_dataclass(hparams):
        return {}
    held = getattr(instance, "hparams", None)
    if isinstance(held, hparams):
        return {f.name: getattr(held, f.name) for f in dataclasses.fields(held)}
    missing = [f.name for f in dataclasses.fields(hparams) if not hasattr(instance, f.name)]
    if missing:
        raise ValueError(f"a {type(instance).__qualname__} instance: its arguments cannot be read back (it has no "
                         f"attribute {', '.join(missing)}): pass the class with its arguments instead")
    return {f.name: getattr(instance, f.name) for f in dataclasses.fields(hparams)}


def _redefined(old: Any, new: Any) -> bool:
    """Whether `new` is `old` defined again where only this process knows either (a notebook's cell run twice)."""
    return (old is not new and _process_local(old) and _process_local(new) and
            getattr(old, "__qualname__", None) == getattr(new, "__qualname__", None))


def object_path(obj: Any) -> Optional[str]:
    """`module:QualName` for a class or function another process can import: found under that name in its module.
    None for one of __main__ (a notebook's or a script's own), one defined inside a function, or one its module does
    not hold under its name."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or module == MAIN_MODULE or "<locals>" in qualname or module not in sys.modules:
        return None
    found: Any = sys.modules[module]
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}:{qualname}" if found is obj else None


class Registry(Generic[T]):
    """Components of one kind by name. `adopt(name, obj)` turns what a name or path finds (a class, a function) into
    the component, raising TypeError with what it lacks; the registry adds where it came from."""

    def __init__(self, kind: str, group: str, adopt: Callable[[str, Any], T], also_known: Sequence[str] = (),
                 instances: str = ""):
        self.kind, self.group, self.also_known = kind, group, tuple(also_known)
        self.instances = instances  # why an instance is refused as this kind ("": taken as its class and arguments)
        self._adopt = adopt
        self._entries: dict[str, Entry[T]] = {}
        self._broken: dict[str, str] = {}  # entry points left out, by name: why
        self._entry_points_loaded = False

    def add(self, name: str, component: T, obj: Any = None, builtin: bool = False, origin: str = "",
            warn: bool = True) -> None:
        """Register `component` as `name`; `obj`, the class or function it was made from, gives the path configs
        record for a component of a module's own. A name taken already is refused, naming both. `warn`: say so
        where `obj` is known to this process only (else the caller says it, when it matters: a run's start)."""
        if not origin:
            defined = f" ({obj.__module__}:{obj.__qualname__})" if hasattr(obj, "__qualname__") else ""
            origin = f"{'the built-in ' if builtin else ''}{self.kind} {name}{defined}"
        if name in self._entries and _redefined(self._entries[name].source, obj):
            del self._entries[name]  # a notebook's cell run again: its new class replaces the old one
        if name in self._entries:
            rename = "rename the entry point" if origin.startswith("entry point") else "rename it"
            raise ValueError(f"{origin}: the {self.kind} name {name!r} is taken by {self._entries[name].origin}: "
                             f"{rename}")
        fixed = name if builtin or origin.startswith("entry point") else None
        if warn and fixed is None and _process_local(obj):
            log.warning("%s %s is defined in %s: known to this process only (tune jobs, torchrun ranks and a later "
                        "`yt8m eval` of the run cannot find it); define it in a module and import it from there",
                        self.kind, name, "__main__ (a script or notebook)" if getattr(obj, "__module__", "") ==
                        MAIN_MODULE else "a function")
        self._entries[name] = Entry(component, name, origin, obj, fixed, builtin)

    def named(self, given: Any) -> tuple[str, dict[str, Any]]:
        """The name a config records for a component given as a name or an object, and the arguments the object
        carries: a class or function importable from its module is named `module:QualName` (found again in any
        process); one of __main__ or of a function is registered under its own name (known to this process only:
        the run that names it warns so, or refuses it where it needs other processes); `functools.partial(loss,
        scale=2)` is its function and those arguments; an instance is its class and the values of its
        hyper-parameters, read back from its attributes of their names (or its `hparams`), or refused where they
        cannot be read back (or where the kind says `instances`). A ValueError (one line) says why an object names
        no component."""
        if isinstance(given, str):
            return given, {}
        if isinstance(given, functools.partial) and not given.args:
            return self.named(given.func)[0], dict(given.keywords)
        if not (isinstance(given, type) or callable(given) and hasattr(given, "__qualname__")):
            if self.instances:
                raise ValueError(f"a {type(given).__qualname__} instance as a {self.kind}: {self.instances}")
            name = self.named(type(given))[0]
            return name, instance_arguments(given, getattr(self.get(name), "hparams", None))
        registered = _made_from(self._entries, given)
        if registered is not None:
            return registered.recorded_name, {}
        path = object_path(given)
        if path is not None:
            return path, {}
        name = getattr(given, "__name__", "")
        self.add(name, self._adopt_named(name, given, f"{self.kind} {name}"), given, warn=False)
        return name, {}

    def remove(self, name: str) -> None:
        del self._entries[name]

    @contextlib.contextmanager
    def scoped(self, name: str, component: T, obj: Any = None) -> Iterator[T]:
        """Within the block, `component` is registered as `name`; after, it is gone again (a test's or a notebook's
        component, without leaving the registry changed)."""
        self.add(name, component, obj)
        try:
            yield component
        finally:
            self.remove(name)

    def get(self, name: str, field: str = "") -> T:
        """The component a config names: registered, an installed package's entry point, or an import path. A
        ValueError (prefixed `field`) says why not, with the names it knows."""
        entry = self.entry(name)
        if entry is None:
            raise ValueError(f"{field + ' ' if field else ''}{self.unknown(name)}")
        return entry.component

    def entry(self, name: str) -> Optional[Entry[T]]:
        """The entry of `name`, loading the import path it may be (a ValueError where that fails); None for a bare
        name nothing registered."""
        if not is_import_path(name):
            self.load_entry_points()
        if name in self._broken:
            raise ValueError(self._broken[name])
        if name in self._entries:
            return self._entries[name]
        if not is_import_path(name):
            return None
        obj = import_object(name)
        registered = _made_from(self._entries, obj)  # a registered component, named by its path: the registered one
        if registered is not None:
            return registered
        component = self._adopt_named(name, obj, name)
        module, attribute = split_import_path(name)
        path = f"{module}:{attribute}"
        self._entries[name] = Entry(component, name, f"{self.kind} {path}", obj, path)
        return self._entries[name]

    def peek(self, name: str) -> Optional[Entry[T]]:
        """The entry of `name` where finding it imports nothing: registered (an installed package's entry point only
        once loaded), or an import path whose module is imported already; None otherwise (for a reader of configs,
        which must not run a user's code: `entry` finds the rest when the run is built)."""
        if name in self._entries:
            return self._entries[name]
        if not is_import_path(name):
            return None
        try:
            module, attribute = split_import_path(name)
        except ValueError:
            return None
        if module not in sys.modules:
            return None
        try:
            return self.entry(name)
        except (ValueError, TypeError):
            return None

    def names(self) -> list[str]:
        """Every registered name (entry points included): for --help, errors and did-you-mean."""
        self.load_entry_points()
        return sorted(name for name in self._entries if not is_import_path(name))

    def entries(self, load: bool = True) -> list[Entry[T]]:
        """Every component, in registration order (built-ins first), import paths loaded so far included; `load`:
        installed packages' entry points too (not while the built-ins register: their package is half imported)."""
        if load:
            self.load_entry_points()
        return list(self._entries.values())

    def unknown(self, name: str) -> str:
        """Why `name` finds nothing, with the known names (`also_known`: those found elsewhere, such as the metrics a
        task computes itself) and how to name one's own."""
        known = [*self.also_known, *self.names()]
        return (f"{name!r} is not a {self.kind}{closest(name, known)} (known: {', '.join(known) or 'none'}; one of "
                f"your own: package.module:Name, or an entry point of group {self.group})")

    def problem(self, name: str) -> Optional[str]:
        """The `check` of a config field naming a component: None, or why `name` finds none."""
        try:
            return None if self.entry(name) is not None else self.unknown(name)
        except (ValueError, TypeError) as err:
            return str(err)

    def load_entry_points(self) -> None:
        """Register the components installed packages declare under the group (once per process). One that does not
        import, breaks the contract or takes a name already taken is left out with a warning: the commands that do
        not name it work, one that does gets its error."""
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for point in importlib.metadata.entry_points(group=self.group):
            origin = f"entry point {point.name} = {point.value} ({self.group}"
            origin += f", package {point.dist.name})" if point.dist is not None else ")"
            try:
                self._load_entry_point(point, origin)
            except ValueError as err:
                self._broken[point.name] = str(err)
                log.warning("%s (left out: a command naming %s fails with this)", err, point.name)

    def _load_entry_point(self, point: importlib.metadata.EntryPoint, origin: str) -> None:
        try:
            obj = point.load()
        except Exception as err:  # an installed package's import may fail any way
            raise ValueError(f"{origin}: cannot import ({type(err).__name__}: {err})") from err
        registered = _made_from(self._entries, obj)
        if registered is not None and self._entries.get(point.name) is registered:
            # Its module registered it under the same name as it imported: recorded by the entry point's name.
            self._entries[point.name] = Entry(registered.component, point.name, origin, obj, point.name)
            return
        self.add(point.name, self._adopt_named(point.name, obj, origin), obj, origin=origin)

    def _adopt_named(self, name: str, obj: Any, origin: str) -> T:
        try:
            return self._adopt(name, obj)
        except TypeError as err:
            raise ValueError(f"{origin}: {err}") from err

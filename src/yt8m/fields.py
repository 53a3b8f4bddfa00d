"""Config fields declared once where a value is defined (configs, model hyper-parameters): a default, the help its
flag shows and its valid values; parsing the text forms the flags give (booleans, comma lists); and what a message
shows of a user's input (a did-you-mean, a value quoted and cut to a readable length)."""

from __future__ import annotations

import argparse
import difflib
import reprlib
from dataclasses import field
from typing import Any, Callable, Iterable, Optional, Sequence

# A field's own check: the problem with a value (e.g. "'MoeModl' is not a model; did you mean 'MoeModel'?"), or None.
Check = Callable[[Any], Optional[str]]


def setting(default: Any, help: str, *, at_least: Optional[float] = None, above: Optional[float] = None,
            at_most: Optional[float] = None, below: Optional[float] = None,
            choices: Optional[Callable[[], Sequence[str]]] = None, check: Optional[Check] = None,
            resolves: bool = False, required: bool = False, flag: Optional[str] = None, positional: bool = False,
            shown_default: Optional[str] = None) -> Any:
    """A config field: its default, the help text its flag shows, and its valid values (a range, names given by
    `choices()`, a `check`, or `required`: not empty). None, where a field allows it, is always valid. `resolves`: the
    check finds a component by name (a metric), which may import a user's module, so it is made when the run is
    built, not when the config is read. `flag`: the flag's (and flat YAML's) name where it is not the field's own
    (`--model` for the model section's `name`); `positional`: the command line also takes the value as an argument
    (`yt8m inspect PATTERN`); `shown_default`: what --help says of a default its value does not show."""
    rules = {"at_least": at_least, "above": above, "at_most": at_most, "below": below, "choices": choices,
             "check": check, "resolves": resolves, "required": required, "flag": flag, "positional": positional,
             "shown_default": shown_default}
    mutable = isinstance(default, (list, dict))
    default_kind = {"default_factory": lambda: type(default)(default)} if mutable else {"default": default}
    return field(**default_kind, metadata={"help": help, **{key: rule for key, rule in rules.items()
                                                            if rule is not None and rule is not False}})


def problem_of(call: Callable[[], object]) -> Optional[str]:
    """The ValueError `call()` raises, as a check's problem (None where it raises none): a check that is a parser."""
    try:
        call()
    except ValueError as err:
        return str(err)
    return None


def nearest(name: str, known: Iterable[str]) -> Optional[str]:
    """The known name nearest a misspelt one (difflib's closest match), or None: every did-you-mean's lookup."""
    match = difflib.get_close_matches(name, list(known), n=1)
    return match[0] if match else None


def closest(name: str, known: Sequence[str]) -> str:
    """"; did you mean 'X'?" for the known name nearest a misspelt one, or ""."""
    match = nearest(name, known)
    return f"; did you mean {match!r}?" if match else ""


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "t", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "f", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def parse_list(value: str | Sequence[Any], element: type) -> list:
    """A list field's value from a comma-separated string (flags, the starter kit's style) or a sequence (YAML,
    Python); each element converted to `element` (ValueError where one does not convert). A comma inside
    parentheses belongs to its element: `--metrics 'F1(threshold=0.5, beta=2),gap'` is two metrics."""
    parts = [part.strip() for part in _top_level_parts(value)] if isinstance(value, str) else list(value)
    return [element(part) for part in parts if part != ""]


def _top_level_parts(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    return parts + [text[start:]]


# What an error message shows of the user's input: a value quoted as repr() quotes it, cut in the middle when it is
# long, so that a bad 20 MB line gives an error line of a few hundred characters that still shows both its ends.
QUOTE_LIMIT = 200
_QUOTE = reprlib.Repr()
_QUOTE.maxstring = _QUOTE.maxother = _QUOTE.maxlong = QUOTE_LIMIT
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = 20


def quoted(value: object) -> str:
    """repr(value), cut to about QUOTE_LIMIT characters (strings in the middle, lists after 20 items)."""
    return _QUOTE.repr(value)

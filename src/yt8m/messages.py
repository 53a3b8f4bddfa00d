"""What an error message shows of the user's input: a value quoted as repr() quotes it, cut in the middle when it is
long, so that a bad 20 MB line gives an error line of a few hundred characters that still shows both its ends."""

from __future__ import annotations

import reprlib

QUOTE_LIMIT = 200

_QUOTE = reprlib.Repr()
_QUOTE.maxstring = _QUOTE.maxother = _QUOTE.maxlong = QUOTE_LIMIT
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = 20


def quoted(value: object) -> str:
    """repr(value), cut to about QUOTE_LIMIT characters (strings in the middle, lists after 20 items)."""
    return _QUOTE.repr(value)

"""A component of one's own (a metric, a loss) that fails in a call, as one line naming the component and the call:
`metric mymetrics:F1: F1.compute returned nan`, `... F1.update raised ZeroDivisionError: ... (at mymetrics.py:12)`."""

from __future__ import annotations

import math
import traceback
from typing import Any, Callable, TypeVar

R = TypeVar("R")


class ComponentFault(ValueError):
    """A component failed in a call (raised, or returned what its contract rules out); the message is one line.

    A ValueError: the CLI prints it as the user's error it is, without the traceback of yt8m's own frames."""


def one_line(err: BaseException) -> str:
    """`Type: message` of an exception, its message's lines joined (an error is one line)."""
    return f"{type(err).__name__}: " + " ".join(" ".join(line.split()) for line in str(err).splitlines())


def raised_at(err: BaseException) -> str:
    """`file:line` of the innermost frame that raised `err` (the user's own code, where it raised there); "" where
    the traceback holds no file."""
    frames = [frame for frame in traceback.extract_tb(err.__traceback__) if not frame.filename.startswith("<")]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def calling(component: str, call: str, function: Callable[..., R], *args: Any,
            passing: tuple[type[BaseException], ...] = (), **kwargs: Any) -> R:
    """`function(*args, **kwargs)`, where an exception becomes a ComponentFault naming the component and the call;
    one of `passing` (what the caller reports itself: running out of memory) is raised as it is."""
    reraised: tuple[type[BaseException], ...] = (ComponentFault, *passing)
    try:
        return function(*args, **kwargs)
    except reraised:
        raise
    except Exception as err:
        where = raised_at(err)
        raise ComponentFault(f"{component}: {call} raised {one_line(err)}"
                             + (f" (at {where})" if where else "")) from err


def finite_number(component: str, call: str, value: Any) -> float:
    """`value` as a float: a ComponentFault where it is not a number (a str, a list, None) or not finite."""
    number = None
    if not isinstance(value, (str, bytes, bool)):
        try:
            number = float(value)
        except (TypeError, ValueError):
            pass
    if number is None:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ComponentFault(f"{component}: {call} returned {shown} (a {type(value).__name__}), not a number")
    if not math.isfinite(number):
        raise ComponentFault(f"{component}: {call} returned {number}: a value must be a finite number (a nan or inf "
                             "would be ranked as a result)")
    return number

"""Whether a script calls `yt8m.tune(n_jobs=J)` under `if __name__ == "__main__":`: each spawned job process
imports the script again, and an unguarded call would start the study again there; refused before any job starts."""

from __future__ import annotations

import ast
import sys
import types
from typing import Any, Optional

MAIN_GUARD_ADVICE = ('each tune job process imports the script again, and would run the study again: put the '
                     'call under `if __name__ == "__main__":`')


def refuse_unguarded_jobs(n_jobs: Any) -> None:
    """Exit with one line (SystemExit: a script's uncaught ValueError would print a traceback) where n_jobs > 1 and
    the script running this process makes this call outside its main guard."""
    if not isinstance(n_jobs, int) or n_jobs <= 1:
        return
    line = _unguarded_call_line()
    if line is not None:
        raise SystemExit(f"yt8m.tune(n_jobs={n_jobs}) at {line}: {MAIN_GUARD_ADVICE}")


def _unguarded_call_line() -> Optional[str]:
    """`script.py:LINE` of the script's top-level statement that led to this call where that statement is not in
    an `if __name__ == "__main__":` block; None where it is, or where no script's source makes it (a notebook, a
    REPL, `python -c`)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame = _module_frame(main) if path else None
    if frame is None or path is None:
        return None
    try:
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    lineno = frame.f_lineno
    guarded = any(_is_main_guard(node) and node.lineno <= lineno <= (node.end_lineno or node.lineno)
                  for node in tree.body)
    return None if guarded else f"{path}:{lineno}"


def _module_frame(main: Optional[types.ModuleType]) -> Optional[types.FrameType]:
    """The frame running the main module's own top-level code, on this call's stack."""
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None:
        if main is not None and frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            return frame
        frame = frame.f_back
    return None


def _is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":` (either side of the ==)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.comparators) != 1:
        return False
    sides = [node.test.left, node.test.comparators[0]]
    names = [side.id for side in sides if isinstance(side, ast.Name)]
    texts = [side.value for side in sides if isinstance(side, ast.Constant)]
    return isinstance(node.test.ops[0], ast.Eq) and names == ["__name__"] and texts == ["__main__"]

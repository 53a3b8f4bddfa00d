"""The bench/ scripts follow the package's API: every name a script imports from yt8m (at the top or inside a
function) exists, and so does every name it imports from a sibling script or from tests/' helpers. Read from each
script's syntax tree, nothing run: a refactor that moves a name fails here instead of in the next benchmark run."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
# Modules the scripts import from beside them: the other scripts, and tests/' helpers (put on sys.path by the scripts).
LOCAL_FOLDERS = (BENCH, REPO / "tests")
SCRIPTS = sorted(BENCH.glob("*.py"))


def imports(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, module, names imported from it; [] for `import module`) of every absolute import in the tree."""
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, []) for alias in node.names)
    return found


def local_module(name: str) -> Path | None:
    for folder in LOCAL_FOLDERS:
        if (folder / f"{name}.py").is_file():
            return folder / f"{name}.py"
    return None


def top_level_names(path: Path) -> set[str]:
    """The names a module defines or imports at its top level (what `from module import name` can take)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def yt8m_problems(line: int, module: str, names: list[str]) -> list[str]:
    try:
        imported = importlib.import_module(module)
    except ImportError as err:
        return [f"line {line}: import {module}: {err}"]
    problems = []
    for name in names:
        if hasattr(imported, name):
            continue
        try:  # a submodule: `from yt8m import kernels`
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            problems.append(f"line {line}: {module} has no {name!r}")
    return problems


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.name for path in SCRIPTS])
def test_bench_script_imports_resolve(script: Path) -> None:
    problems = []
    for line, module, names in imports(ast.parse(script.read_text(), str(script))):
        if module.split(".")[0] == "yt8m":
            problems += yt8m_problems(line, module, names)
        elif (path := local_module(module)) is not None:
            defined = top_level_names(path)
            problems += [f"line {line}: {path.relative_to(REPO)} has no {name!r}" for name in names
                         if name not in defined]
    assert not problems, f"{script.relative_to(REPO)}:\n" + "\n".join(problems)


def test_bench_scripts_found() -> None:
    assert len(SCRIPTS) >= 20, "bench/ moved? this test reads its scripts"

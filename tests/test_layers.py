"""The package's shape: no import circles (imports inside functions and TYPE_CHECKING blocks counted, and the package
__init__ each import runs), the layers of pyproject.toml's import-linter contract, few modules at the root, and task
classes known only to the tasks package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "yt8m"


def import_graph() -> dict[str, set[str]]:
    """Each module of yt8m and the modules of yt8m importing it runs: those it names, and the packages above them
    (importing a.b.c executes a/__init__ and a/b/__init__)."""
    graph = grimp.build_graph("yt8m", include_external_packages=False)
    edges = {}
    for module in graph.modules:
        targets = set()
        for imported in graph.find_modules_directly_imported_by(module):
            while imported != "yt8m" and not module.startswith(f"{imported}."):
                targets.add(imported)
                imported = imported.rpartition(".")[0]
        edges[module] = targets - {module}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_package_imports_without_circles():
    assert circles(import_graph()) == []


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_layers_contract_holds():
    result = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=REPO_ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 kept, 0 broken" in result.stdout


def test_at_most_eight_modules_sit_at_the_package_root():
    assert len(list(PACKAGE.glob("*.py"))) <= 8


def test_only_the_tasks_package_asks_what_class_a_task_is():
    task_classes = {node.name for path in (PACKAGE / "tasks").glob("*.py")
                    for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)}
    outside = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "tasks":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
                named = {getattr(name, "id", getattr(name, "attr", "")) for name in ast.walk(node.args[1])}
                outside += [f"{path.relative_to(PACKAGE)}:{node.lineno}" for _ in named & task_classes]
    assert outside == []

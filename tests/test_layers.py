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
    assert "2 kept, 0 broken" in result.stdout


def test_the_data_formats_room_imports_neither_the_reading_nor_the_making_of_shards():
    """data/ holds three jobs, each in a room: the file format is what reading and making stand on (the second
    import-linter contract), so a format module that imported a reading one would break it."""
    graph = grimp.build_graph("yt8m", include_external_packages=False)
    rooms = {room: {module for module in graph.modules if module.startswith(f"yt8m.data.{room}")}
             for room in ("format", "reading", "making")}
    assert all(rooms.values())
    assert not any(graph.find_modules_directly_imported_by(module) & (rooms["reading"] | rooms["making"])
                   for module in rooms["format"])
    assert sorted(path.name for path in (PACKAGE / "data").glob("*.py")) == ["__init__.py"]


def long_functions(tree: ast.Module, where: str, limit: int = 60) -> list[str]:
    """Functions (and methods) of more than `limit` lines, docstring included."""
    return [f"{where}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_is_longer_than_60_lines():
    assert [line for name, tree in modules() for line in long_functions(tree, name)] == []
    body = "".join(f"    x{index} = {index}\n" for index in range(60))
    assert long_functions(ast.parse(f"def long():\n{body}"), "m.py") == ["m.py:1 long: 61 lines"]


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


def modules() -> list[tuple[str, ast.Module]]:
    return [(str(path.relative_to(PACKAGE)), ast.parse(path.read_text())) for path in sorted(PACKAGE.rglob("*.py"))]


def untyped_configs(tree: ast.Module, where: str) -> list[str]:
    """Functions taking a `config` argument without a type, or typed Any."""
    return [f"{where}:{node.lineno} {node.name}" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if arg.arg == "config" and (arg.annotation is None or ast.unparse(arg.annotation) == "Any")]


def test_no_function_takes_an_untyped_config():
    assert [line for name, tree in modules() for line in untyped_configs(tree, name)] == []
    assert untyped_configs(ast.parse("def f(x, config: Any): pass\ndef g(config: TrainConfig): pass"), "m.py") == [
        "m.py:1 f"]


def class_size_problems(tree: ast.Module, where: str) -> list[str]:
    """A class's size beyond its budget: more than 15 methods; a class with behaviour (an __init__ of its own) taking
    more than 8 arguments; a record (dataclass, NamedTuple) of more than 12 fields, unless each is a section made by
    its default_factory (TrainConfig: a section per component, each section keeping to the budget)."""
    problems = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        methods = [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
        init = next((method for method in methods if method.name == "__init__"), None)
        arguments = len(init.args.args) - 1 + len(init.args.kwonlyargs) if init else 0
        annotated = [item for item in node.body if isinstance(item, ast.AnnAssign)]
        fields = len(annotated)
        too_many_fields = fields > 12 and not all(map(is_section_field, annotated))
        if len(methods) > 15 or arguments > 8 or too_many_fields:
            problems.append(f"{where}:{node.lineno} {node.name}: {len(methods)} methods, {arguments} arguments, "
                            f"{fields} fields")
    return problems


def is_section_field(item: ast.AnnAssign) -> bool:
    """`name: Section = dataclasses.field(default_factory=Section)`."""
    return isinstance(item.value, ast.Call) and any(keyword.arg == "default_factory" for keyword in item.value.keywords)


def test_every_class_keeps_to_its_size():
    assert [line for name, tree in modules() for line in class_size_problems(tree, name)] == []


def test_an_oversized_class_is_found():
    methods = "".join(f"    def m{index}(self): pass\n" for index in range(16))
    assert class_size_problems(ast.parse(f"class Big:\n{methods}"), "big.py") == [
        "big.py:1 Big: 16 methods, 0 arguments, 0 fields"]
    assert class_size_problems(ast.parse("class Wide:\n    def __init__(self, a, b, c, d, e, f, g, h, i): pass\n"),
                               "wide.py") == ["wide.py:1 Wide: 1 methods, 9 arguments, 0 fields"]
    record = "".join(f"    f{index}: int\n" for index in range(13))
    assert class_size_problems(ast.parse(f"class Record:\n{record}"), "record.py") == [
        "record.py:1 Record: 0 methods, 0 arguments, 13 fields"]
    sections = "".join(f"    s{index}: S = dataclasses.field(default_factory=S)\n" for index in range(13))
    assert class_size_problems(ast.parse(f"class Config:\n{sections}"), "config.py") == []
    assert class_size_problems(ast.parse(f"class Config:\n{sections}    f: int = 0\n"), "config.py") == [
        "config.py:1 Config: 0 methods, 0 arguments, 14 fields"]

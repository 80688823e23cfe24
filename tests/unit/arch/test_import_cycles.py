"""No two project modules import each other, directly or around a longer loop, checked on the source's imports.

Every module under the packages below is parsed with ``ast``; an edge ``a -> b`` is an ``import``/``from … import``
anywhere in ``a`` (at the top or inside a function: a deferred import still runs, and a loop through one means the
two modules cannot be understood, tested or made torch-free apart) that names project module ``b``
(``from p import m`` names module ``p.m`` when that is a module, else ``p``). Imports under ``if TYPE_CHECKING:``
never run and are left out, as are the names a package face loads lazily by string (``memtune/profiler/__init__.py``).
Importing ``p.m`` is not counted as importing the package ``p`` itself.

A cycle is fixed by moving what both sides need into a module of its own that imports neither (as
``memtune.profiler.loss_model`` for ``memtune.profiler.loss`` and ``memtune.profiler.modeled``,
``memtune.tuner.runtime._planned_base`` for ``memtune.tuner.runtime._planned`` and
``memtune.tuner.runtime._planned_module``), not by an exception here.
"""

from __future__ import annotations

import ast
from collections import deque
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("memtune",)  # one installed name: its rooms are its subpackages


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _project_module(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of dotted ``name`` that is a project module, or None."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def _edges(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The project modules ``name`` imports when it runs, each with the line of its first import."""
    is_package = path.name == "__init__.py"
    out: dict[str, int] = {}

    def add(target: str | None, line: int) -> None:
        if target is not None and target != name:
            out.setdefault(target, line)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit_one(other)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(_project_module(alias.name, modules), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                add(submodule if submodule in modules else _project_module(source, modules), node.lineno)
        visit(node)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return out


def import_graph() -> dict[str, dict[str, int]]:
    """``module -> {imported project module: line}`` for every module of ``PACKAGES``."""
    modules = _modules()
    return {name: _edges(name, path, modules) for name, path in modules.items()}


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
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
    return found


def _cycle_through(start: str, members: set[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """A shortest import loop from ``start`` back to it inside one component."""
    before: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node]):
            if nxt not in members:
                continue
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(before[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if nxt not in before:
                before[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is in no loop")  # unreachable for a component of two or more


def describe_cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    """One line per import cycle: the loop, each step with the line of its import in the importing module."""
    lines = []
    for component in _strongly_connected(graph):
        loop = _cycle_through(component[0], set(component), graph)
        steps = [f"{a} -> {b} (line {graph[a][b]})" for a, b in pairwise(loop)]
        extra = f" [component: {', '.join(component)}]" if len(component) > len(loop) - 1 else ""
        lines.append(" ; ".join(steps) + extra)
    return lines


def test_the_graph_sees_function_level_imports() -> None:
    graph = import_graph()
    assert "memtune.profiler.loss_model" in graph["memtune.profiler.modeled"]
    assert (
        "memtune.tuner.runtime._planned_module" in graph["memtune.tuner.runtime._planned"]
    )  # imported inside ``planned``
    assert "memtune.profiler.chain" not in graph["memtune.profiler.loss"]  # under TYPE_CHECKING only


def test_the_cycle_finder_reports_a_loop_with_its_path() -> None:
    graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7, "d": 1}, "d": {}}
    assert describe_cycles(graph) == ["a -> b (line 3) ; b -> c (line 5) ; c -> a (line 7)"]
    assert describe_cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_cycles() -> None:
    cycles = describe_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)

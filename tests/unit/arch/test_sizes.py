"""Pieces a reader can hold: no function over 100 lines and no module over 800 lines in the package (migrations,
which Alembic writes, aside). A function counts from its ``def`` to its last line, nested functions included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3] / "memtune"
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 800


def _sources() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*.py")) if "migrations" not in p.parts]


def test_no_module_over_800_lines() -> None:
    sizes = {str(p.relative_to(ROOT.parent)): p.read_text().count("\n") for p in _sources()}
    long = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {long}"


def test_no_function_over_100_lines() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (break them into named steps):\n" + "\n".join(long)

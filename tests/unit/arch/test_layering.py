"""The dependency direction profiler <- tuner <- storage <- api, checked on the source's imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
WEB = {"fastapi", "sqlalchemy", "alembic", "uvicorn", "starlette", "httpx"}
FORBIDDEN: dict[str, set[str]] = {
    "profiler": {"tuner", "storage", "api", "optuna"} | WEB,
    "tuner": {"storage", "api"} | WEB,
    "storage": {"api", "fastapi", "uvicorn"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downward(package: str) -> None:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        hit = _imports(path) & FORBIDDEN[package]
        if hit:
            bad.append(f"{path.relative_to(ROOT)} imports {sorted(hit)}")
    assert not bad, "\n".join(bad)


def test_tuner_decision_code_imports_no_torch() -> None:
    bad = []
    for path in sorted((ROOT / "tuner").rglob("*.py")):
        if "runtime" in path.relative_to(ROOT / "tuner").parts:
            continue
        if "torch" in _imports(path):
            bad.append(str(path.relative_to(ROOT)))
    assert not bad, f"torch imported outside tuner/runtime: {bad}"


@pytest.mark.parametrize("package", ["profiler", "tuner", "storage", "api"])
def test_every_module_declares_all(package: str) -> None:
    missing = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        has_all = any(
            isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
            for n in tree.body
        )
        if not has_all and tree.body:
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"modules without __all__: {missing}"

"""One installed name, and the dependency direction inside it: ``memtune.profiler`` <- ``memtune.tuner`` <-
``memtune.storage`` <- ``memtune.api``, checked on the source's imports (NOTE [ One installed name ] in
``memtune/__init__.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "memtune"
ROOMS = ("profiler", "tuner", "storage", "api")
WEB = {"fastapi", "sqlalchemy", "alembic", "uvicorn", "starlette", "httpx"}
FORBIDDEN: dict[str, set[str]] = {
    "profiler": {"memtune.tuner", "memtune.storage", "memtune.api", "optuna"} | WEB,
    "tuner": {"memtune.storage", "memtune.api"} | WEB,
    "storage": {"memtune.api", "fastapi", "uvicorn"},
    "api": {"memtune"},  # the face (memtune/__init__.py) sits on the rooms; no room imports it
}
for _room in ("profiler", "tuner", "storage"):
    FORBIDDEN[_room].add("memtune")


def _imports(path: Path) -> set[str]:
    """The top-level names ``path`` imports, with ``memtune``'s own rooms as ``memtune.<room>``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.append(node.module)
    parts = [m.split(".") for m in modules]
    return {".".join(p[:2]) if p[0] == "memtune" and len(p) > 1 else p[0] for p in parts}


def test_the_wheel_installs_one_name() -> None:
    """``memtune`` is the only top-level package in the source tree's install list and on disk: a user's own ``api/``
    or ``storage/`` folder shadows nothing of memtune's, and nothing of memtune's shadows theirs."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["memtune*"]
    assert set(project["tool"]["setuptools"]["package-data"]) <= {f"memtune.{r}" for r in ROOMS}
    assert project["project"]["scripts"]["memtune"].startswith("memtune.")
    stray = [r for r in ROOMS if (REPO / r).exists()]
    assert not stray, f"rooms outside memtune/: {stray}"
    sources = [p for d in ("memtune", "tests", "benchmarks", "scripts", "docs") for p in (REPO / d).rglob("*.py")]
    imports = [f"{p.relative_to(REPO)}: {sorted(n & set(ROOMS))}" for p in sources if (n := _imports(p)) & set(ROOMS)]
    assert not imports, "imports of rooms by their old top-level names:\n" + "\n".join(imports)


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
        if {"runtime", "measure"} & set(path.relative_to(ROOT / "tuner").parts):
            continue
        if "torch" in _imports(path):
            bad.append(str(path.relative_to(ROOT)))
    assert not bad, f"torch imported outside memtune/tuner/runtime and memtune/tuner/measure: {bad}"


@pytest.mark.parametrize("package", ROOMS)
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

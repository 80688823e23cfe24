"""One installed name, and the dependency direction inside it: ``memtune.profiler`` <- ``memtune.tuner`` <-
``memtune.storage`` <- ``memtune.api``, checked on the source's imports (NOTE [ One installed name ] in
``memtune/__init__.py``); inside ``memtune.api``, the command line, the service and the client import one another only
as NOTE [ Rooms of the API ] in ``memtune/api/__init__.py`` says."""

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
    for package in project["tool"]["setuptools"]["package-data"]:  # a room, or a package inside one
        assert package.split(".")[:2] in [["memtune", r] for r in ROOMS], package
        assert (REPO / package.replace(".", "/") / "__init__.py").exists(), f"package data of no package: {package}"
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


#: the API's rooms (NOTE [ Rooms of the API ] in ``memtune/api/__init__.py``): each one's modules, and the modules of
#: the other rooms it may import (``memtune.api``'s face stands for the modules its names come from)
API_ROOMS: dict[str, tuple[str, ...]] = {
    "memtune.api.cli": ("cli",),
    "memtune.api.service": ("service",),
    "memtune.api.client": ("client.py",),
}
API_ALLOWED: dict[str, set[str]] = {
    # ``memtune serve`` and ``memtune worker`` start the service; ``memtune calibration push|get`` use the client
    "memtune.api.cli": {
        "memtune.api.client", "memtune.api.service.main", "memtune.api.service.settings",
        "memtune.api.service.supervisor", "memtune.api.service.worker",
    },
    "memtune.api.service": set(),
    "memtune.api.client": {"memtune.api.service.schemas"},  # the response bodies it parses
}  # fmt: skip


def _api_imports(path: Path) -> set[str]:
    """The ``memtune.api`` modules ``path`` imports, the face's lazy names resolved to their modules."""
    import memtune.api

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("memtune.api."))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "memtune.api":
                found.update(memtune.api._LAZY.get(a.name, f"memtune.api.{a.name}") for a in node.names)
            elif node.module.startswith("memtune.api."):
                found.add(node.module)
    return found


def _api_room(module: str) -> str | None:
    return next((room for room in API_ROOMS if module == room or module.startswith(room + ".")), None)


@pytest.mark.parametrize("room", sorted(API_ROOMS))
def test_api_rooms_import_one_another_only_as_mapped(room: str) -> None:
    bad = []
    for place in API_ROOMS[room]:
        paths = [ROOT / "api" / place] if place.endswith(".py") else sorted((ROOT / "api" / place).rglob("*.py"))
        assert paths and paths[0].exists(), f"{room}: {place} is gone"
        for path in paths:
            other = {m for m in _api_imports(path) if _api_room(m) not in (room, None)}
            if other - API_ALLOWED[room]:
                bad.append(f"{path.relative_to(ROOT)} imports {sorted(other - API_ALLOWED[room])}")
    assert not bad, "\n".join(bad)


def test_api_modules_live_in_a_room() -> None:
    """Every module of ``memtune/api`` but its face and ``__main__`` belongs to one of the API's rooms."""
    loose = [p.name for p in (ROOT / "api").glob("*.py") if p.name not in ("__init__.py", "__main__.py", "client.py")]
    assert not loose, f"modules of memtune/api in no room (move them to cli/ or service/): {loose}"


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

"""Code in one package imports another package's public names through that package's face, checked on the source.

A face is a package's ``__init__.py`` and its ``__all__`` (``memtune.profiler``, ``memtune.tuner``, the sub-faces
``memtune.tuner.runtime`` and ``memtune.storage.repositories``, ``memtune.storage``, ``memtune.api`` and its rooms'
``memtune.api.cli`` and ``memtune.api.service`` …). Every module
under ``WALKED`` is parsed with ``ast``; for each ``from pkg.sub import name`` of another room (at the top, inside a
function or under ``TYPE_CHECKING``: a type is a public name too), no ``name`` may be in the ``__all__`` of a face above
``pkg.sub``: if the face offers it, the import goes through the face (``from memtune.tuner import tune``, not ``from
memtune.tuner.search import tune``; ``from memtune.tuner.runtime import planned``, not ``from
memtune.tuner.runtime._planned …``). ``import pkg.sub`` and ``from pkg import sub`` (a submodule reached through its
package) hide which names are used, so across packages they are refused too. Imports within one room
(``memtune.tuner.runtime`` importing ``memtune.tuner.plan``, a face importing its own submodules) are the package's own
business and are not checked. The API's rooms (``memtune.api.cli``, ``memtune.api.service``, and ``memtune.api``
itself for the client; NOTE [ Rooms of the API ] in ``memtune/api/__init__.py``) are rooms here too: the command line
takes the client and ``create_app`` through ``memtune.api``, as any other package would.

Importing through a face costs nothing at run time: ``import pkg.sub`` runs ``pkg/__init__.py`` first anyway, and
the faces that must stay torch-free (``profiler``, ``api``) load their heavy names lazily (PEP 562 ``__getattr__``).

Names a face does not offer (internals another package needs, such as ``memtune.tuner.calibration.calibration_for``) are
imported from their module; that is allowed without a list. Three lists make the deliberate exceptions explicit:

* ``KEPT_OUT_OF_FACES``: modules that stay out of a face on purpose because importing them loads far more than the
  face does. Consumers import them deeply; the test checks that the face neither offers their names nor loads them.
* ``ALLOWED``: deep imports of names a face *does* offer, kept deliberately (import-cycle avoidance, a face that
  cannot deliver the name). Every entry must still be needed: a stale entry fails.
* ``KNOWN_SHADOWED``: face names that a submodule of the same name hides (none now), locked exactly.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: the rooms of the one installed name, and the face above them: the targets whose faces are checked
PACKAGES = (
    "memtune.profiler", "memtune.tuner", "memtune.storage", "memtune.api.cli", "memtune.api.service", "memtune.api",
    "memtune",
)  # fmt: skip
#: the rooms inside ``memtune.api`` (NOTE [ Rooms of the API ]); the rest of ``memtune.api`` (its face, the client)
#: is the room ``memtune.api``
API_ROOMS = ("memtune.api.cli", "memtune.api.service")
#: the folders whose modules are checked (``memtune/__init__.py`` is a face made only of the rooms' names)
WALKED = ("memtune", "benchmarks", "scripts")

#: (importing module, imported module) -> why the import names a face-offered name from the module itself.
#: Add an entry only with a reason (an import cycle through the face, a face that cannot deliver the name); other
#: face-offered names go through their face without a cycle (the layering is strictly downward,
#: profiler <- tuner <- storage <- api, so no face is half-initialized when another package imports it) and without
#: extra weight (a deep import runs the face's ``__init__.py`` anyway).
ALLOWED: dict[tuple[str, str], str] = {}

#: (face, name) of ``__all__`` names that the face cannot deliver because a submodule of that name shadows them
#: (importing ``pkg.sub`` sets ``pkg.sub`` to the module; ``__getattr__`` is then never asked). A face bug, locked
#: here so that it stays visible; fixing it (renaming the submodule or dropping the name) must update this set.
KNOWN_SHADOWED: set[tuple[str, str]] = set()

#: (face, module) -> why the module stays out of that face: its names are imported from the module itself.
KEPT_OUT_OF_FACES: dict[tuple[str, str], str] = {
    # memtune/tuner/measure/__init__.py's docstring: each measuring module is imported on its own; measuring plans side
    # by side loads the capped-memory model (memtune.tuner.capped), the loss classes (memtune.profiler.loss) and the
    # process isolation helpers
    (
        "memtune.tuner.measure",
        "memtune.tuner.measure.bench",
    ): "heavy: plan benchmarking (memtune.tuner.capped, memtune.profiler.loss, isolate)",
    # the same docstring: validating a job's plans on this GPU runs the bench and reads the CUDA identity
    (
        "memtune.tuner.measure",
        "memtune.tuner.measure.validate",
    ): "heavy: builds on memtune.tuner.measure.bench and memtune.profiler.identity",
    # memtune/storage/__init__.py's docstring points to memtune.storage.records; those records carry profiles and
    # budgets, so the module imports profiler and tuner (numpy, optuna), which ``import storage`` (the settings, the
    # CLI) avoids
    (
        "memtune.storage",
        "memtune.storage.records",
    ): "heavy: imports memtune.profiler._profile and memtune.tuner.budget (numpy, optuna)",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _literal_all(tree: ast.Module) -> set[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def faces() -> dict[str, set[str]]:
    """``package -> its __all__`` for every package (``__init__.py``) of ``PACKAGES`` that declares one."""
    found = {}
    for init in sorted((ROOT / "memtune").rglob("__init__.py")):
        names = _literal_all(ast.parse(init.read_text(), filename=str(init)))
        if names is not None:
            found[_module_name(init)] = names
    return found


def project_modules() -> set[str]:
    return {_module_name(p) for p in (ROOT / "memtune").rglob("*.py")}


@dataclass(frozen=True)
class DeepImport:
    importer: str
    imported: str
    line: int
    problem: str

    def __str__(self) -> str:
        return f"{self.importer} (line {self.line}) imports {self.imported}: {self.problem}"


def _top(name: str) -> str:
    """The room ``name`` lives in (``memtune.tuner`` for ``memtune.tuner.search``, ``memtune.api.service`` for
    ``memtune.api.service.worker``), ``memtune`` for the face, or the top-level folder of a benchmark or script."""
    for room in API_ROOMS:
        if name == room or name.startswith(room + "."):
            return room
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "memtune" and len(parts) > 1 else parts[0]


def deep_imports(importer: str, source: str, faces: dict[str, set[str]], modules: set[str]) -> list[DeepImport]:
    """The imports in ``importer``'s ``source`` that go around another package's face."""
    found: list[DeepImport] = []
    if importer == "memtune":
        return found  # the users' face is made of the rooms' names
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _top(alias.name) in PACKAGES and _top(alias.name) != _top(importer) and alias.name not in faces:
                    found.append(DeepImport(importer, alias.name, node.lineno, "import names from the module instead"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = node.module
            if _top(module) not in PACKAGES or _top(module) == _top(importer) or module.startswith(importer + "."):
                continue  # a face importing from below itself is its own business
            parts = module.split(".")
            # the faces above the module, within its room: ``memtune`` itself is the users' face, made of the rooms'
            # names, and no room imports it (the layering test says so)
            above = [".".join(parts[:i]) for i in range(2 if parts[0] == "memtune" else 1, len(parts))]
            for alias in node.names:
                offering = [face for face in above if alias.name in faces.get(face, ())]
                if offering:
                    found.append(DeepImport(importer, module, node.lineno, f"{alias.name} is public in {offering[0]}"))
                elif module in faces and alias.name not in faces[module] and f"{module}.{alias.name}" in modules:
                    problem = f"{alias.name} is a submodule reached through its package"
                    found.append(DeepImport(importer, f"{module}.{alias.name}", node.lineno, problem))
    return found


def _private(module: str) -> bool:
    """Whether ``module`` is private to its room: a component below the room starts with one underscore."""
    return any(part.startswith("_") and not part.startswith("__") for part in module.split(".")[1:])


def private_imports(importer: str, source: str, modules: set[str]) -> list[DeepImport]:
    """The imports in ``importer``'s ``source`` of another room's private modules (``memtune.tuner._search``, or
    ``from memtune.tuner import _search``): docs/concepts.md, a module whose name starts with ``_``."""
    found: list[DeepImport] = []
    for node in ast.walk(ast.parse(source)):
        named: list[str] = []
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            named = [node.module] + [
                f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules
            ]
        for module in named:
            if _top(module) in PACKAGES and _top(module) != _top(importer) and _private(module):
                found.append(DeepImport(importer, module, node.lineno, "private to its room: use its face"))
                break
    return found


def walked_modules() -> dict[str, str]:
    """``module -> source`` for every module under ``WALKED``."""
    return {_module_name(p): p.read_text() for folder in WALKED for p in sorted((ROOT / folder).rglob("*.py"))}


def all_deep_imports() -> list[DeepImport]:
    face_names, modules = faces(), project_modules()
    return [hit for name, source in walked_modules().items() for hit in deep_imports(name, source, face_names, modules)]


def test_the_checker_sees_deep_imports() -> None:
    face_names = {
        "memtune.tuner": {"tune", "Plan"},
        "memtune.tuner.runtime": {"planned"},
        "memtune.profiler": {"Profile"},
    }
    modules = {"memtune.tuner", "memtune.tuner.search", "memtune.tuner.runtime", "memtune.tuner.runtime._planned",
               "memtune.profiler", "memtune.profiler.zoo"}  # fmt: skip
    source = """
from memtune.tuner import Plan
from memtune.tuner.search import tune, trial_fits
from memtune.tuner.runtime._planned import planned
from memtune.profiler import zoo
import memtune.profiler.zoo
import memtune.tuner.runtime


def later():
    from memtune.tuner.search import tune as run
"""
    found = [(d.imported, d.line, d.problem) for d in deep_imports("memtune.api.x", source, face_names, modules)]
    assert found == [
        ("memtune.tuner.search", 3, "tune is public in memtune.tuner"),
        ("memtune.tuner.runtime._planned", 4, "planned is public in memtune.tuner.runtime"),
        ("memtune.profiler.zoo", 5, "zoo is a submodule reached through its package"),
        ("memtune.profiler.zoo", 6, "import names from the module instead"),
        ("memtune.tuner.search", 11, "tune is public in memtune.tuner"),
    ]
    assert (
        deep_imports("memtune.tuner.y", source, face_names, modules)[0].imported == "memtune.profiler.zoo"
    )  # own package: fine


def test_the_checker_sees_private_imports() -> None:
    source = """
from memtune.tuner import Plan, _search
from memtune.tuner._search import tune
import memtune.tuner.runtime._planned
from memtune.tuner.runtime import planned
"""
    modules = {"memtune.tuner", "memtune.tuner._search", "memtune.tuner.runtime", "memtune.tuner.runtime._planned"}
    found = [(d.imported, d.line) for d in private_imports("benchmarks.x", source, modules)]
    assert found == [
        ("memtune.tuner._search", 2),
        ("memtune.tuner._search", 3),
        ("memtune.tuner.runtime._planned", 4),
    ]
    assert private_imports("memtune.tuner.runtime.offload", source, modules) == []  # its own room


def test_private_modules_stay_in_their_room() -> None:
    modules = project_modules()
    found = [hit for name, source in walked_modules().items() for hit in private_imports(name, source, modules)]
    assert not found, "\n".join(map(str, found))


def test_faces_are_used_across_packages() -> None:
    found = [d for d in all_deep_imports() if (d.importer, d.imported) not in ALLOWED]
    assert not found, "import these through the package's face:\n" + "\n".join(map(str, found))


def test_no_stale_allowed_entries() -> None:
    used = {(d.importer, d.imported) for d in all_deep_imports()}
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries no longer needed (remove them): {stale}"


@pytest.mark.slow
def test_modules_kept_out_of_faces_stay_out() -> None:
    face_names = faces()
    imported = {
        node.module
        for name, source in walked_modules().items()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module and _top(node.module) != _top(name)
    }
    kept_out: dict[str, list[str]] = {}
    for (face, module), reason in KEPT_OUT_OF_FACES.items():
        assert reason and module.startswith(face + "."), (face, module)
        path = ROOT / (module.replace(".", "/") + ".py")
        assert path.exists(), f"stale KEPT_OUT_OF_FACES entry: {module} is gone"
        assert module in imported, f"stale KEPT_OUT_OF_FACES entry: no other package imports {module}"
        offered = face_names[face] & (_literal_all(ast.parse(path.read_text())) or set())
        assert not offered, f"{face} offers {sorted(offered)} of {module}, which stays out of it: {reason}"
        kept_out.setdefault(face, []).append(module)
    for face, modules in kept_out.items():  # a fresh interpreter per face: importing the face loads none of them
        code = f"import sys, {face}; loaded = [m for m in {modules!r} if m in sys.modules]; assert not loaded, loaded"
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"import {face} loads modules kept out of it:\n{run.stderr[-2000:]}"


def test_face_names_are_not_shadowed_by_submodules() -> None:
    modules = project_modules()
    shadowed = set()
    for face, names in faces().items():
        if face == "memtune.api.service.routes":
            continue  # its __all__ lists its submodules on purpose
        package = importlib.import_module(face)
        for name in names:
            if isinstance(getattr(package, name), ModuleType) and f"{face}.{name}" in modules:
                shadowed.add((face, name))
    assert shadowed == KNOWN_SHADOWED

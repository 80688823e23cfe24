"""The documentation site builds (``mkdocs build --strict``, as CI runs it): every page in the nav, every relative
link and anchor resolves, and mkdocstrings renders the ``memtune`` face from its docstrings."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    missing = [m for m in ("mkdocs", "material", "mkdocstrings_handlers.python") if _missing(m)]
    if missing:
        pytest.skip(
            f"mkdocs is not installed ({', '.join(missing)} missing): "
            'pip install -e ".[docs]" (or the dev extra) to build the site'
        )
    site = tmp_path / "site"
    command = ["build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)]
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", *command],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for page in ("index.html", "python-api/index.html", "results/index.html", "results/archive/index.html"):
        assert (site / page).is_file(), f"the site has no {page}"
    api = (site / "python-api" / "index.html").read_text(encoding="utf-8")
    for name in ("memtune.tune", "memtune.planned", "memtune.profile", "memtune.budget_guard"):
        assert name in api, f"the Python API page does not document {name}"


def test_every_parameter_of_the_face_is_documented_on_its_own() -> None:
    """The API page lists a parameter with its default only where its docstring names it alone (``warmup:``, not
    ``warmup, repeats:``, which the page showed as one required parameter)."""
    import inspect

    import memtune

    for function in (memtune.profile, memtune.tune, memtune.planned):
        doc = inspect.getdoc(function) or ""
        named = {line.split(":", 1)[0].strip() for line in doc.splitlines() if line.startswith("    ") and ":" in line}
        loose = [p for p in inspect.signature(function).parameters if p != "kwargs" and p not in named]
        assert not loose, f"{function.__name__}: {loose} not documented on a line of their own"

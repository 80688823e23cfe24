"""``python -m memtune`` runs the ``memtune`` command line (as the installed ``memtune`` script does)."""

from __future__ import annotations

from memtune.api.cli import app

__all__ = ["app"]

app()

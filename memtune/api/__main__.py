"""``python -m memtune.api`` runs the ``memtune`` command line."""

from __future__ import annotations

from memtune.api.cli import app

__all__ = ["app"]

app()

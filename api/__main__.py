"""``python -m api`` runs the ``memtune`` command line."""

from __future__ import annotations

from api.cli import app

__all__ = ["app"]

app()

"""memtune api: the FastAPI service, its worker, the typed client and the command line.

``create_app`` and ``MemtuneClient`` are loaded on first use (the CLI imports this package too).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the lazy names, for type checkers (``__getattr__`` would make them ``Any``)
    from memtune.api.client import MemtuneClient
    from memtune.api.main import create_app

__all__ = ["MemtuneClient", "create_app"]

_LAZY = {"create_app": "memtune.api.main", "MemtuneClient": "memtune.api.client"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memtune.api' has no attribute {name!r}")

"""The ``memtune`` command line: the Typer ``app`` (``commands``) and the modules of its command bodies.

``app`` (the installed ``memtune`` script is ``memtune.api.cli:app``), ``load_chain`` and ``resolve_profile`` are
loaded on first use, so ``python -m memtune.api.cli.cli_service`` (the worker process ``memtune serve`` starts)
loads neither the Typer app nor the other commands.

It imports the client and, to start them, the service's app, settings, worker and worker supervisor; nothing else
of the service (NOTE [ Rooms of the API ] in ``memtune/api/__init__.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the lazy names, for type checkers (``__getattr__`` would make them ``Any``)
    from memtune.api.cli._commands import app
    from memtune.api.cli._common import load_chain, resolve_profile

__all__ = ["app", "load_chain", "resolve_profile"]

_LAZY = {"app": "memtune.api.cli._commands", "load_chain": "memtune.api.cli._common",
         "resolve_profile": "memtune.api.cli._common"}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memtune.api.cli' has no attribute {name!r}")

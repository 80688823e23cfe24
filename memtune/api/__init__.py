"""memtune api: the command line (``cli/``), the HTTP service and its worker (``service/``), the typed client
(``client.py``).

``create_app`` and ``MemtuneClient`` are loaded on first use (the CLI imports this package too).

NOTE [ Rooms of the API ]
-------------------------
``memtune/api`` holds three rooms, each a concern: ``memtune/api/cli/`` (the command line), ``memtune/api/service/``
(the HTTP service, its worker and its web page) and ``memtune/api/client.py`` (the typed HTTP client). A module goes
where its concern is, decided by who imports it: a module only the command line uses lives in ``cli/``, one only
the service uses in ``service/``; one both use and neither owns would stay at ``memtune/api/`` (none does now). The
folder names the concern, so a module drops the prefix it repeats (``cli/tune.py``, not ``cli/cli_tune.py``) unless
the shorter name is a module or package elsewhere in ``memtune/`` (``cli_profile``, ``cli_bench``,
``cli_inference``, ``cli_peers``, ``cli_service``; the service's ``job_*`` steps, which ``service/`` does not name).
The imports go one way (``tests/unit/arch/test_layering.py`` checks them):

* ``service`` imports neither the command line nor the client.
* the client imports only the service's response bodies (``memtune.api.service.schemas``).
* the command line imports the client (``memtune calibration push|get``) and, to start them, the service's app,
  settings, worker and worker supervisor (``memtune serve``, ``memtune worker``); nothing else of the service.

All three import ``memtune.profiler``, ``memtune.tuner`` and ``memtune.storage`` through their faces.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the lazy names, for type checkers (``__getattr__`` would make them ``Any``)
    from memtune.api.client import MemtuneClient
    from memtune.api.service.main import create_app

__all__ = ["MemtuneClient", "create_app"]

_LAZY = {"create_app": "memtune.api.service.main", "MemtuneClient": "memtune.api.client"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memtune.api' has no attribute {name!r}")

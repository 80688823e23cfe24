"""memtune: fit a model's training step into a GPU memory budget, as fast as possible.

The face for Python users; the rooms behind it (``memtune.profiler``, ``memtune.tuner``, ``memtune.storage``,
``memtune.api``) keep their own::

    import memtune
    tuned = memtune.tune(model, "12GiB", example_inputs=batch)   # profile, search, bound
    print(tuned)
    model = memtune.planned(model, tuned)                          # every step follows the plan

``profile`` measures any ``nn.Module`` stage by stage (its repeated blocks and the pieces between them, or stages
you name), ``tune`` searches plans of offload, recompute and selective stages, ``planned`` applies one, and
``budget_guard`` caps CUDA memory at a budget while a planned step runs.

NOTE [ One installed name ]
---------------------------
The wheel installs one top-level name, ``memtune``; its rooms are subpackages that live in this folder, as Optuna's
live in ``optuna/``: ``memtune.profiler`` (measuring a model), ``memtune.tuner`` (deciding and applying plans),
``memtune.storage`` (the database) and ``memtune.api`` (the command line, the service and its client). Imports go
only down that list (``tests/unit/arch/test_layering.py``), and no room imports this face.

Why the rooms moved here rather than staying at the repository's top, installed under ``memtune.`` by setuptools'
``package-dir``: (1) a GPU host runs the source tree from ``PYTHONPATH`` with nothing installed (``scripts/`` and the
benchmarks do), and a ``package-dir`` mapping exists only in an installed distribution; (2) with a checkout on
``sys.path`` as well (pytest, ``python -m``), each room would import under two names, ``tuner.plan.Plan`` beside
``memtune.tuner.plan.Plan``, two classes that ``isinstance``, pickles and the layering checks tell apart; (3) the
paths in the code and the docs read as the import names (``memtune/tuner/simulator.py`` is
``memtune.tuner.simulator``). Nothing else changed: each room keeps its own face (``__init__.py`` and ``__all__``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the lazy names, for type checkers (``__getattr__`` would make them ``Any``)
    from memtune.profiler import Profile
    from memtune.tuner import Action, Plan
    from memtune.tuner.measure.tune_module import planned, profile, tune
    from memtune.tuner.runtime import budget_guard, load_plan
    from memtune.tuner.tuned import Tuned

__all__ = ["Action", "Plan", "Profile", "Tuned", "budget_guard", "load_plan", "planned", "profile", "tune"]

#: where each name of the face lives; loaded on first use, so that importing one room (``memtune.tuner.policies``,
#: the command line's help) does not import torch and every other room with it
_FACE = {
    "Tuned": "memtune.tuner.tuned",
    "planned": "memtune.tuner.measure.tune_module",
    "profile": "memtune.tuner.measure.tune_module",
    "tune": "memtune.tuner.measure.tune_module",
    "Profile": "memtune.profiler",
    "Action": "memtune.tuner",
    "Plan": "memtune.tuner",
    "budget_guard": "memtune.tuner.runtime",
    "load_plan": "memtune.tuner.runtime",
}


def __getattr__(name: str) -> Any:
    if name in _FACE:
        value = getattr(importlib.import_module(_FACE[name]), name)
        globals()[name] = value  # found once
        return value
    raise AttributeError(f"module 'memtune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

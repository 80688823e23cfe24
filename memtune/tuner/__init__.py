"""memtune tuner: plans, the simulator, baseline policies, the Optuna search and the exact optimum, and data-parallel
plans over a shared host link (``simulate_ranks``).

Everything here is pure Python (no torch); ``memtune.tuner.runtime`` applies plans to live models. The search and the
exact optimum (``tune``, ``Candidate``, ``TuneResult``, ``exact_front``, ``exact_optimum``) load Optuna, so they are
loaded on first use: a command line's ``--help`` and a simulation start without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from memtune.tuner._link import SharedLink
from memtune.tuner._peak_check import PeakCheck, peak_check, planning_headroom
from memtune.tuner._prefetch_trigger import PrefetchTrigger, prefetch_trigger
from memtune.tuner._ranks import RanksResult, Stagger, ranks_prefetch_trigger, simulate_ranks, stagger_for
from memtune.tuner._sharding import shard_units, sharded_profile
from memtune.tuner._tuner_errors import (
    BoundError,
    BudgetError,
    CalibrationError,
    PlanError,
    SearchError,
    TunerError,
)
from memtune.tuner.budget import format_bytes, parse_budget
from memtune.tuner.inference import (
    InferenceFacts,
    InferencePlan,
    InferenceSim,
    LayerFitError,
    LayerPlan,
    plan_inference,
    simulate_inference,
)
from memtune.tuner.plan import Action, Plan
from memtune.tuner.policies import POLICIES, run_policy
from memtune.tuner.simulator import SimResult, Simulator, simulate
from memtune.tuner.tuned import held_output_note

# The lazy names, for type checkers (``__getattr__`` would make them ``Any``).
if TYPE_CHECKING:
    from memtune.tuner._exact import exact_front, exact_optimum
    from memtune.tuner.search import Candidate, TuneResult, tune

__all__ = [
    "POLICIES",
    "Action",
    "BoundError",
    "BudgetError",
    "CalibrationError",
    "Candidate",
    "InferenceFacts",
    "InferencePlan",
    "InferenceSim",
    "LayerFitError",
    "LayerPlan",
    "PeakCheck",
    "Plan",
    "PlanError",
    "PrefetchTrigger",
    "RanksResult",
    "SearchError",
    "SharedLink",
    "SimResult",
    "Simulator",
    "Stagger",
    "TuneResult",
    "TunerError",
    "exact_front",
    "exact_optimum",
    "format_bytes",
    "held_output_note",
    "parse_budget",
    "peak_check",
    "plan_inference",
    "planning_headroom",
    "prefetch_trigger",
    "ranks_prefetch_trigger",
    "run_policy",
    "shard_units",
    "sharded_profile",
    "simulate",
    "simulate_inference",
    "simulate_ranks",
    "stagger_for",
    "tune",
]

_LAZY = {
    "Candidate": "memtune.tuner.search",
    "TuneResult": "memtune.tuner.search",
    "tune": "memtune.tuner.search",
    "exact_front": "memtune.tuner._exact",
    "exact_optimum": "memtune.tuner._exact",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memtune.tuner' has no attribute {name!r}")

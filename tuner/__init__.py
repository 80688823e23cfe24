"""memtune tuner: plans, the simulator, baseline policies, the Optuna search and the exact optimum, and data-parallel
plans over a shared host link (``simulate_ranks``).

Everything here is pure Python (no torch); ``tuner.runtime`` applies plans to live models.
"""

from __future__ import annotations

from tuner.budget import format_bytes, parse_budget
from tuner.errors import BudgetError, CalibrationError, PlanError, SearchError, TunerError
from tuner.exact import exact_front, exact_optimum
from tuner.inference import (
    InferenceFacts,
    InferencePlan,
    InferenceSim,
    LayerFitError,
    LayerPlan,
    plan_inference,
    simulate_inference,
)
from tuner.link import SharedLink
from tuner.peak_check import PeakCheck, peak_check, planning_headroom
from tuner.plan import Action, Plan
from tuner.policies import POLICIES, run_policy
from tuner.prefetch_trigger import PrefetchTrigger, prefetch_trigger
from tuner.ranks import RanksResult, Stagger, ranks_prefetch_trigger, simulate_ranks, stagger_for
from tuner.search import Candidate, TuneResult, tune
from tuner.sharding import shard_units, sharded_profile
from tuner.simulator import SimResult, Simulator, simulate

__all__ = [
    "POLICIES",
    "Action",
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

"""memtune tuner: plans, the simulator, baseline policies, the Optuna search and the exact optimum.

Everything here is pure Python (no torch); ``tuner.runtime`` applies plans to live models.
"""

from __future__ import annotations

from tuner.budget import format_bytes, parse_budget
from tuner.errors import BudgetError, CalibrationError, PlanError, SearchError, TunerError
from tuner.exact import exact_front, exact_optimum
from tuner.plan import Action, Plan
from tuner.policies import POLICIES, run_policy
from tuner.search import Candidate, TuneResult, tune
from tuner.simulator import SimResult, Simulator, simulate

__all__ = [
    "POLICIES",
    "Action",
    "BudgetError",
    "CalibrationError",
    "Candidate",
    "Plan",
    "PlanError",
    "SearchError",
    "SimResult",
    "Simulator",
    "TuneResult",
    "TunerError",
    "exact_front",
    "exact_optimum",
    "format_bytes",
    "parse_budget",
    "run_policy",
    "simulate",
    "tune",
]

"""What a plan search returns: the evaluated plans (``Candidate``), ``tune``'s result (``TuneResult``), and the rules
that read them: the Pareto front, a trial's feasibility as the search judged it, the measured whole-model compile
plans, and whether a plan leaves every convolution to the framework.

Times are in milliseconds, memory in bytes. The search that makes them is ``memtune.tuner.search``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from memtune.profiler import CompilerPoint, Profile
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import OPTIMIZERS

__all__ = [
    "CONSTRAINTS",
    "Candidate",
    "Mode",
    "TuneResult",
    "compiler_candidates",
    "leaves_convs_to_framework",
    "pareto_front",
    "trial_fits",
]

Mode = Literal["fastest", "pareto"]
CONSTRAINTS = ("peak_over_budget_bytes", "allocator_out_of_memory")
"""A trial's Optuna constraints, in this order in the list form (NOTE [ One objective ]); feasible when all are ≤ 0."""


@dataclass(frozen=True)
class Candidate:
    """One evaluated plan. ``source`` says whether its numbers were ``simulated`` or ``measured``."""

    name: str
    plan: Plan
    step_ms: float
    peak_bytes: int
    feasible: bool
    source: Literal["simulated", "measured"] = "simulated"
    #: of ``step_ms``, what the allocator's retries under the cap are predicted to cost, ms
    allocator_ms: float = 0.0
    #: predicted allocator retries per step under the cap; None where the placement was not modelled
    alloc_retries: float | None = None

    def to_dict(self, *, with_plan: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "step_ms": round(self.step_ms, 4),
            "peak_bytes": self.peak_bytes,
            "feasible": self.feasible,
            "source": self.source,
        }
        if self.alloc_retries is not None:
            out["allocator_ms"] = round(self.allocator_ms, 4)
            out["alloc_retries"] = round(self.alloc_retries, 3)
        if with_plan:
            out["plan"] = self.plan.model_dump(mode="json")
        return out


@dataclass(frozen=True)
class TuneResult:
    """What ``tune`` found. ``best`` is None only when no plan at all fits the budget."""

    profile: Profile
    budget_bytes: int
    mode: Mode
    unconstrained: Candidate
    policies: list[Candidate]
    best: Candidate | None
    pareto: list[Candidate]
    n_trials: int
    study_name: str | None
    seed: int
    headroom: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: the fastest feasible plan that leaves every convolution's algorithm to the framework, when the profile has
    #: algorithm tables and ``best`` chooses algorithms (NOTE [ Measured selection ]); else None
    no_choice: Candidate | None = None
    #: every measured compiler point of the profile as a whole-model compile plan (``compiler_candidates``), named
    #: like ``best``: what NOTE [ Measured finalists ] in ``memtune.tuner.finalists`` may measure beside ``best``
    compiled: list[Candidate] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The object ``memtune tune --json`` prints (documented in docs/command-line.md)."""
        p = self.profile
        return {
            "model": p.model,
            "batch": p.batch,
            "dtype": p.dtype,
            "gpu": p.device.key,
            "profile_source": p.source,
            "budget_bytes": self.budget_bytes,
            "headroom": self.headroom,
            "mode": self.mode,
            "trials": self.n_trials,
            "seed": self.seed,
            "unconstrained": {
                "step_ms": round(self.unconstrained.step_ms, 4),
                "peak_bytes": self.unconstrained.peak_bytes,
            },
            "policies": [c.to_dict() for c in self.policies],
            "best": self.best.to_dict(with_plan=True) if self.best else None,
            "pareto": [c.to_dict() for c in self.pareto],
            "no_algorithm_choice": self.no_choice.to_dict(with_plan=True) if self.no_choice else None,
            "compiler_points": [
                {"activation_budget": c.activation_budget, "step_ms": round(c.step_ms, 4), "peak_bytes": c.peak_bytes}
                for c in p.compiler_points
            ],
        }


def pareto_front(cands: Sequence[Candidate]) -> list[Candidate]:
    """The candidates no other candidate beats in both step ms and peak bytes, by increasing step ms."""
    front: list[Candidate] = []
    best_peak = math.inf
    for c in sorted(cands, key=lambda c: (c.step_ms, c.peak_bytes)):
        if c.peak_bytes < best_peak:
            front.append(c)
            best_peak = c.peak_bytes
    return front


def trial_fits(attrs: Mapping[str, Any], budget_bytes: int) -> bool:
    """Whether the trial with user attributes ``attrs`` is feasible as the search judged it (NOTE [ One objective ]):
    its simulated peak fits ``budget_bytes`` (the budget less the headroom) and the allocator model places it."""
    return bool(int(attrs["peak_bytes"]) <= budget_bytes and not attrs.get("allocator_out_of_memory"))


def compiler_candidates(
    profile: Profile, cap_bytes: int, search_budget_bytes: int, optimizer: str = "sgd"
) -> list[Candidate]:
    """Every measured compiler point of ``profile`` as a whole-model compile plan (NOTE [ Whole-model compile ] in
    ``memtune.tuner._whole``), feasible where it runs under the cap (``CompilerPoint.fits``). A point measured with
    another optimizer than ``optimizer`` is priced with the difference in optimizer state (per parameter byte, as the
    simulator counts it): a point measured with SGD serves an Adam plan one parameter copy higher."""
    return [
        Candidate(
            f"compiled whole {p.activation_budget:g}",
            Plan.uniform(profile.n_stages, whole_compile=p.activation_budget, label="compiled whole"),
            p.forward_backward_ms,  # NOTE [ The optimizer's update ] in memtune.tuner._whole
            p.peak_bytes,
            p.fits(cap_bytes, search_budget_bytes),
            source="measured",
        )
        for p in (_for_optimizer(q, profile.param_bytes, optimizer) for q in profile.compiler_points)
    ]


def _for_optimizer(point: CompilerPoint, param_bytes: int, optimizer: str) -> CompilerPoint:
    """``point`` as its step would hold under ``optimizer``: its peaks moved by the change in optimizer state."""
    extra = int(param_bytes * (OPTIMIZERS[optimizer] - OPTIMIZERS[point.optimizer]))
    if extra == 0:
        return point
    reserved = None if point.reserved_bytes is None else max(1, point.reserved_bytes + extra)
    return point.model_copy(update={"peak_bytes": max(1, point.peak_bytes + extra), "reserved_bytes": reserved})


def _named(c: Candidate | None, profile: Profile) -> Candidate | None:
    return None if c is None else dataclasses.replace(c, plan=c.plan.named(profile))


def leaves_convs_to_framework(plan: Plan) -> bool:
    """Whether ``plan`` runs every convolution with the framework's own algorithm (no algorithm choice)."""
    return plan.conv_rule == "default" and not plan.conv_algos

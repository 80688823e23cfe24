"""The exact reference optimum: every plan of a small chain, simulated, for the search's optimality gap.

It enumerates the same space the search explores (NOTE [ Search space ] in ``tuner.search``): every
per-stage action, every prefetch lookahead 0..8 and both sync modes, 3^n × 18 plans. That is exact for
the cost model and affordable up to about 9 stages (354,294 plans, a minute or two on one core).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from profiler.profile import Profile
from tuner.errors import SearchError
from tuner.plan import Action, Plan
from tuner.search import _MAX_LOOKAHEAD, _SYNCS
from tuner.simulator import Simulator

__all__ = ["MAX_EXACT_STAGES", "ExactOptimum", "exact_optimum"]

MAX_EXACT_STAGES = 10


@dataclass(frozen=True)
class ExactOptimum:
    """The fastest plan within the budget (None if none fits) and how many plans were simulated."""

    plan: Plan | None
    step_ms: float
    peak_bytes: int
    evaluated: int


def exact_optimum(
    profile: Profile,
    budget_bytes: int,
    *,
    optimizer: str = "sgd",
    progress: Callable[[int, int], None] | None = None,
) -> ExactOptimum:
    """Simulate every plan of the search space and return the fastest one with peak ≤ ``budget_bytes``.

    Raises:
        SearchError: the chain has more than ``MAX_EXACT_STAGES`` stages (too many plans to enumerate).
    """
    n = profile.n_stages
    if n > MAX_EXACT_STAGES:
        raise SearchError(
            f"the exact optimum enumerates 3^n plans; {profile.model!r} has {n} stages, the limit is "
            f"{MAX_EXACT_STAGES} (use a prefix of the chain)"
        )
    sim = Simulator(profile, optimizer)
    knobs = [(la, s) for s in _SYNCS for la in range(_MAX_LOOKAHEAD + 1)]
    total = 3**n * len(knobs)
    best: tuple[float, int, Plan] | None = None
    count = 0
    for la, sync in knobs:
        template = Plan(actions=(Action.KEEP,) * n, prefetch_lookahead=la, sync=sync, label="exact")  # type: ignore[arg-type]
        for actions in itertools.product(tuple(Action), repeat=n):
            r = sim.run_actions(actions, template)
            count += 1
            if r.peak_bytes <= budget_bytes and (best is None or (r.step_ms, r.peak_bytes) < best[:2]):
                best = (r.step_ms, r.peak_bytes, template.with_(actions=actions))
        if progress is not None:
            progress(count, total)
    if best is None:
        return ExactOptimum(None, float("inf"), 0, count)
    return ExactOptimum(best[2], best[0], best[1], count)

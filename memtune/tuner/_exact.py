"""The exact reference optimum: every plan of a small chain, simulated, for the search's optimality gap.

It enumerates the same space the search explores (NOTE [ Search space ] in ``memtune.tuner.search``): every
per-stage action, every prefetch lookahead 0..8, ``layer`` sync and ``deferred`` sync with every distinct
``sync_delay`` (1..n: a delay of n or more never waits in forward, so larger ones are the same plan; 0 is
``layer``), 3^n × 9 × (n + 1) plans (4/3 times more for each stage that may be ``selective``). That is exact
for the cost model and affordable up to about 9 stages (1.8 million plans, a few minutes on one core).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from memtune.profiler import Profile
from memtune.tuner._search_space import _MAX_LOOKAHEAD, _MAX_SYNC_DELAY
from memtune.tuner._tuner_errors import SearchError
from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import Simulator
from memtune.tuner.stage_choices import stage_actions

__all__ = ["MAX_EXACT_STAGES", "ExactFront", "ExactOptimum", "exact_front", "exact_optimum"]

MAX_EXACT_STAGES = 10


@dataclass(frozen=True)
class ExactOptimum:
    """The fastest plan within the budget (None if none fits) and how many plans were simulated."""

    plan: Plan | None
    step_ms: float
    peak_bytes: int
    evaluated: int


@dataclass(frozen=True)
class ExactFront:
    """The time–memory Pareto front of every plan in the space: ``(step ms, peak bytes, plan)`` by step ms."""

    points: tuple[tuple[float, int, Plan], ...]
    evaluated: int

    def best_within(self, budget_bytes: int) -> ExactOptimum:
        """The exact optimum for one budget, read off the front."""
        for step, peak, plan in self.points:
            if peak <= budget_bytes:
                return ExactOptimum(plan, step, peak, self.evaluated)
        return ExactOptimum(None, float("inf"), 0, self.evaluated)


def exact_front(
    profile: Profile, *, optimizer: str = "sgd", progress: Callable[[int, int], None] | None = None
) -> ExactFront:
    """Simulate every plan of the search space once and keep the non-dominated ones.

    Raises:
        SearchError: the chain has more than ``MAX_EXACT_STAGES`` stages (too many plans to enumerate).
    """
    n = profile.n_stages
    if n > MAX_EXACT_STAGES:
        raise SearchError(
            f"the exact optimum enumerates 3^n plans (or more, with selective stages); {profile.model!r} has {n} "
            "stages, the limit is "
            f"{MAX_EXACT_STAGES} (use Profile.prefix to take the first stages)"
        )
    sim = Simulator(profile, optimizer)
    syncs = [("layer", 0)] + [("deferred", d) for d in range(1, min(n, _MAX_SYNC_DELAY) + 1)]
    knobs = [(la, s, d) for s, d in syncs for la in range(_MAX_LOOKAHEAD + 1)]
    choices = stage_actions(profile)
    total = math.prod(len(c) for c in choices) * len(knobs)
    points: list[tuple[float, int, tuple[Action, ...], int, str, int]] = []
    count = 0
    for la, sync, delay in knobs:
        template = Plan(
            actions=(Action.KEEP,) * n,
            prefetch_lookahead=la,
            sync=sync,  # type: ignore[arg-type]
            sync_delay=delay,
            label="exact",
        )
        for actions in itertools.product(*choices):
            r = sim.run_actions(actions, template)
            points.append((r.step_ms, r.peak_bytes, actions, la, sync, delay))
            count += 1
        if progress is not None:
            progress(count, total)
    points.sort(key=lambda p: (p[0], p[1]))
    front: list[tuple[float, int, Plan]] = []
    lowest = None
    for step, peak, actions, la, sync, delay in points:
        if lowest is None or peak < lowest:
            lowest = peak
            plan = Plan(actions=actions, prefetch_lookahead=la, sync=sync, sync_delay=delay, label="exact")  # type: ignore[arg-type]
            front.append((step, peak, plan))
    return ExactFront(tuple(front), count)


def exact_optimum(
    profile: Profile,
    budget_bytes: int,
    *,
    optimizer: str = "sgd",
    progress: Callable[[int, int], None] | None = None,
) -> ExactOptimum:
    """The fastest plan of the search space with peak ≤ ``budget_bytes``, by enumerating every plan."""
    return exact_front(profile, optimizer=optimizer, progress=progress).best_within(budget_bytes)

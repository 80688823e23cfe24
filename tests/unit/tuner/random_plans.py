"""Random plans for the simulator's tests: every action a stage may take, runs of recompute, the syncs asked for, and
every convolution rule where the profile has algorithm tables."""

from __future__ import annotations

import random
from collections.abc import Sequence

from memtune.profiler import Profile
from memtune.tuner.plan import Action, Plan
from memtune.tuner.stage_choices import stage_actions

__all__ = ["random_plans"]


def random_plans(
    profile: Profile, count: int, seed: int, syncs: Sequence[str] = ("layer", "deferred", "points")
) -> list[Plan]:
    """``count`` plans of ``profile`` drawn with ``seed``: one in three starts every stage's choice with two recomputes
    (runs of recompute), each takes a sync of ``syncs`` and, where the profile has cuDNN tables, a convolution rule."""
    rng = random.Random(seed)
    n = profile.n_stages
    choices = stage_actions(profile)
    skewed = [(Action.RECOMPUTE, Action.RECOMPUTE, *acts) for acts in choices]
    rules = ["default", "fastest", "memory_optimal", "fastest_within"] if profile.has_conv_algos else ["default"]
    plans = []
    for i in range(count):
        sync = rng.choice(list(syncs))
        rule = rng.choice(rules)
        plans.append(
            Plan(
                actions=tuple(rng.choice(acts) for acts in (skewed if i % 3 == 0 else choices)),
                prefetch_lookahead=rng.randint(0, 8),
                sync=sync,  # type: ignore[arg-type]
                sync_delay=rng.randint(0, 6),
                sync_points=tuple(sorted(rng.sample(range(n), rng.randint(1, max(1, n // 4)))))
                if sync == "points"
                else (),
                conv_rule=rule,  # type: ignore[arg-type]
                conv_workspace_limit_bytes=rng.choice([0, 64 << 20, 1 << 30]) if rule == "fastest_within" else None,
            )
        )
    return plans

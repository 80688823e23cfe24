"""The ``checkpoint_sqrt`` policy: Chen et al. 2016, sublinear memory by ~sqrt(n) recompute segments."""

from __future__ import annotations

import math

from memtune.profiler import Profile
from memtune.tuner.plan import Action, Plan

__all__ = ["checkpoint_sqrt", "sqrt_boundaries"]


def sqrt_boundaries(n: int) -> tuple[int, ...]:
    """The kept stages that close each of the ~sqrt(n) groups of a chain of ``n`` stages.

    The chain is cut into ``k = max(1, round(sqrt(n)))`` groups of near-equal length (the first
    ``n mod k`` groups one stage longer); the last stage of each group is returned.
    """
    if n < 1:
        raise ValueError(f"a chain has at least one stage, got n={n}")
    k = max(1, round(math.sqrt(n)))
    size, extra = divmod(n, k)
    out: list[int] = []
    end = -1
    for g in range(k):
        end += size + (1 if g < extra else 0)
        out.append(end)
    return tuple(out)


def checkpoint_sqrt(profile: Profile, budget_bytes: int) -> Plan:
    """Split the chain into ~sqrt(n) segments that are recomputed in backward (Chen et al. 2016).

    Chen et al.'s O(sqrt(n)) rule keeps only the output of every ~sqrt(n)-th layer and re-runs the
    forward of each segment between two kept outputs when its backward is due, trading one extra forward
    for memory that grows with sqrt(n) instead of n. In plan terms the chain is cut into
    ``round(sqrt(n))`` groups (``sqrt_boundaries``); the last stage of each group is ``keep`` (its
    output is the next segment's saved input) and the others are ``recompute``, so every group but a
    one-stage group is one checkpointed segment. ``budget_bytes`` is not used.

    Args:
        profile: the chain's profile.
        budget_bytes: the memory budget, bytes (unused).

    Returns:
        The plan, labelled ``checkpoint_sqrt``.

    Example::

        >>> checkpoint_sqrt(profile_with_9_stages, 0).compact()
        'rrkrrkrrk'
    """
    del budget_bytes
    n = profile.n_stages
    kept = set(sqrt_boundaries(n))
    actions = tuple(Action.KEEP if i in kept else Action.RECOMPUTE for i in range(n))
    return Plan(actions=actions, label="checkpoint_sqrt")

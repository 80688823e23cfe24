"""The ``none`` policy: PyTorch's default, every saved tensor stays on the GPU."""

from __future__ import annotations

from memtune.profiler import Profile
from memtune.tuner.plan import Action, Plan

__all__ = ["none"]


def none(profile: Profile, budget_bytes: int) -> Plan:
    """Keep every stage's saved tensors on the GPU until its backward (plain autograd).

    This is the baseline every other policy is measured against: the fastest step when it fits and the
    largest peak. ``budget_bytes`` is not used; the caller marks the plan infeasible when it does not fit.

    Args:
        profile: the chain's profile.
        budget_bytes: the memory budget, bytes (unused).

    Returns:
        A plan with every action ``keep`` and the framework's own convolution algorithms.
    """
    del budget_bytes
    return Plan.uniform(profile.n_stages, Action.KEEP, label="none")

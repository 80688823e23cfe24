"""Baseline memory policies: reproductions of published rules, each a function profile x budget -> plan.

Every policy is a ``PolicyFn``: it takes a profile and a budget in bytes and returns a ``Plan`` labelled
with the policy's name. Policies never raise because a budget cannot be met: they return their plan and
the caller (the simulator, the search) marks it infeasible. The search enqueues all of them as its first
trials, so a tuned plan is never worse than the best feasible baseline.

=====================  ==========================================================================
name                   rule (module)
=====================  ==========================================================================
``none``               keep everything: PyTorch's default (``none``)
``vdnn_all_m/_p``      vDNN: offload every layer, memory-optimal / fastest convs (``vdnn``)
``vdnn_conv_m/_p``     vDNN: offload the convolutions' inputs only (``vdnn``)
``vdnn_dyn``           vDNN section 3.3's profiling passes, simulated (``vdnn_dyn``)
``layup``              Layup: per-layer T_transfer / T_forward, watershed 2 (``layup``)
``layup_cumulative``   the report's Algorithm 1, cumulative threshold 1 (``layup_cumulative``)
``hmms``               HMMS Algorithm 1: capacity-balance sync points (``hmms``)
``checkpoint_sqrt``    Chen et al. 2016: ~sqrt(n) recompute segments (``checkpoint_sqrt``)
``save_on_cpu``        ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` (``save_on_cpu``)
=====================  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Callable

from memtune.profiler import Profile
from memtune.tuner._tuner_errors import TunerError
from memtune.tuner.plan import Plan
from memtune.tuner.policies._checkpoint_sqrt import checkpoint_sqrt
from memtune.tuner.policies._layup import layup
from memtune.tuner.policies._none import none
from memtune.tuner.policies._save_on_cpu import save_on_cpu
from memtune.tuner.policies.hmms import hmms
from memtune.tuner.policies.layup_cumulative import layup_cumulative
from memtune.tuner.policies.vdnn import vdnn_all_m, vdnn_all_p, vdnn_conv_m, vdnn_conv_p
from memtune.tuner.policies.vdnn_dyn import vdnn_dyn

__all__ = ["POLICIES", "PolicyFn", "run_policy"]

#: a policy: (profile, budget bytes) -> plan
PolicyFn = Callable[[Profile, int], Plan]

#: every baseline policy by name, in the order the search enqueues them
POLICIES: dict[str, PolicyFn] = {
    "none": none,
    "vdnn_all_m": vdnn_all_m,
    "vdnn_all_p": vdnn_all_p,
    "vdnn_conv_m": vdnn_conv_m,
    "vdnn_conv_p": vdnn_conv_p,
    "vdnn_dyn": vdnn_dyn,
    "layup": layup,
    "layup_cumulative": layup_cumulative,
    "hmms": hmms,
    "checkpoint_sqrt": checkpoint_sqrt,
    "save_on_cpu": save_on_cpu,
}


def run_policy(name: str, profile: Profile, budget_bytes: int) -> Plan:
    """Run the policy ``name`` on ``profile`` with ``budget_bytes`` and check the plan fits the profile.

    Args:
        name: a key of ``POLICIES``.
        profile: the chain's profile.
        budget_bytes: the memory budget, bytes (some policies ignore it).

    Returns:
        The policy's plan, labelled ``name``.

    Raises:
        TunerError: ``name`` is not a known policy (the message lists the known ones).
    """
    try:
        fn = POLICIES[name]
    except KeyError:
        raise TunerError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}") from None
    plan = fn(profile, budget_bytes)
    plan.check(profile)
    return plan

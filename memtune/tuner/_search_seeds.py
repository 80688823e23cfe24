"""The plans a search starts from: every baseline policy and every seed plan, each simulated as it is (NOTE [ Seeds
kept as they are ]), and the first trials they make, enqueued before the sampler's own (NOTE [ Search space ] in
``memtune.tuner.search``). Steps are in ms, peaks and budgets in bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from memtune.profiler import Profile
from memtune.tuner._search_results import Candidate
from memtune.tuner._search_space import _params_for
from memtune.tuner._trials import TrialQueue
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import Simulator

__all__ = ["evaluate_policies", "evaluate_seeds", "first_trials"]


def evaluate_seeds(profile: Profile, seeds: Sequence[Plan], budget_bytes: int, sim: Simulator) -> list[Candidate]:
    """Each seed plan as it is, simulated, named ``seed`` (NOTE [ Seeds kept as they are ]).

    # NOTE [ Seeds kept as they are ]
    A seed is enqueued as a trial like a baseline, and a trial records where its descent ends, not its start
    (NOTE [ Local descent ]). The descent ranks by the simulator alone and the end plan is priced once (NOTE
    [ Placement ranking ]), so a seed the allocator model places well can descend to a neighbour it cannot place, and
    no trial then holds the seed. ResNet-50 b256 fp32 on the H200 profile at 40% of its peak, 300 trials,
    ``benchmarks.conv_joint``: the seed (the best plan without algorithm choice, 156.8 ms simulated, 157.5 priced)
    descended to 155.7 ms by keeping one more stage and taking ``fastest_within``; the allocator model found that plan
    out of memory, every feasible trial was slower, and the joint search served 210.7 ms. So each seed is also
    kept as it is, simulated and priced as the baselines are, and ranked beside the trials: the result is never
    worse than a feasible seed, as it is never worse than a feasible baseline.

    Raises:
        PlanError: a seed does not fit the profile (``Plan.check``).
    """
    out = []
    for plan in seeds:
        plan.check(profile)
        r = sim.run(plan)
        out.append(Candidate("seed", plan, r.step_ms, r.peak_bytes, r.peak_bytes <= budget_bytes))
    return out


def evaluate_policies(profile: Profile, budget_bytes: int, sim: Simulator) -> list[Candidate]:
    """Run every baseline policy and simulate its plan with ``sim``.

    vDNN_dyn measures its passes' peaks with a simulator of its own (SGD's state, as ``vdnn_dyn`` does alone); it is
    made here with ``sim``'s calibration (NOTE [ Calibration is an input ] in ``memtune.tuner.calibration``), so no
    policy looks one up. A peak is the same under every calibration (memory events run in program order), so the plan
    is the one ``vdnn_dyn`` chooses.
    """
    from memtune.tuner.policies import POLICIES
    from memtune.tuner.policies.vdnn_dyn import vdnn_dyn, vdnn_dyn_passes

    out = []
    for name, fn in POLICIES.items():
        if fn is vdnn_dyn:
            passes = sim if sim.optimizer == "sgd" else Simulator(profile, "sgd", calibration=sim.calibration)
            plan = vdnn_dyn_passes(profile, budget_bytes, peak=_peak_of(passes))[0]
        else:
            plan = fn(profile, budget_bytes)
        r = sim.run(plan)
        out.append(Candidate(name, plan, r.step_ms, r.peak_bytes, r.peak_bytes <= budget_bytes))
    return out


def _peak_of(sim: Simulator) -> Callable[[Plan], int]:
    """A plan's simulated peak under ``sim``, bytes."""
    return lambda plan: sim.run(plan, check=False).peak_bytes


def first_trials(policies: Sequence[Candidate], seeds: Sequence[Plan], with_conv: bool) -> TrialQueue:
    """The trials a new study starts with: each baseline's plan, then each seed's, as search parameters (a plan the
    space expresses as an earlier one's parameters is enqueued once), with its ``policy`` attribute (NOTE [ Fixed
    trials ] in ``memtune.tuner._trials``)."""
    queue: TrialQueue = deque()
    seen: set[str] = set()
    for c in policies:
        params = _params_for(c.plan, with_conv)
        key = repr(sorted(params.items()))
        if key not in seen:
            seen.add(key)
            queue.append((params, {"policy": c.name}))
    for plan in seeds:
        params = _params_for(plan, with_conv)
        key = repr(sorted(params.items()))
        if key not in seen:
            seen.add(key)
            queue.append((params, {"policy": "seed"}))
    return queue

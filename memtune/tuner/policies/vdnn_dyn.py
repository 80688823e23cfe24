"""Dynamic vDNN (Rhu et al. 2016, section 3.3): profiling passes in order, the simulator as the pass.

vDNN_dyn picks the offloaded layers and the convolution algorithms by trying training passes, each of
which either runs or fails for lack of memory. Here a pass is a simulated step (``memtune.tuner.simulator``): it
fails when the simulated peak is above the budget. The passes, in the paper's order (section 3.3):

1. ``vdnn_all_m``: vDNN_all with memory-optimal algorithms, the trainability check ("Because this
   configuration uses the least memory, this initial pass determines if the target DNN can be trained at
   all"). If it fails the network cannot be trained within the budget and this plan (the least memory) is
   returned.
2. ``none_p``: no offload, fastest algorithms everywhere. If it fits it is adopted ("the highest
   performance while guaranteeing trainability").
3. ``vdnn_conv_p`` then ``vdnn_all_p``: offloading with the fastest algorithms.
4. ``greedy_conv`` then ``greedy_all``: the greedy phase. Starting from vDNN_conv (then vDNN_all) with
   every convolution on its fastest algorithms, the convolutions are visited in forward order; while the
   pass overflows the budget, the visited convolution is locally downgraded to a less performant, more
   memory-efficient algorithm, down to its memory-optimal one.
5. ``fallback_all_m``: if both greedy passes fail, vDNN_all with memory-optimal algorithms.

The pass stands in for a training run, so any accounting can be the pass: ``vdnn_dyn_passes(..., peak=...)``
takes vDNN's own (``memtune.tuner.policies.vdnn_accounting.paper_memory``) as readily as the simulator's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memtune.profiler import ConvAlgo, ConvProfile, Profile
from memtune.tuner._conv_choice import working_algos
from memtune.tuner.plan import Action, ConvChoice, Plan
from memtune.tuner.policies.vdnn import vdnn_all, vdnn_conv
from memtune.tuner.simulator import Simulator

__all__ = ["PassRecord", "algo_ladder", "conv_ladder", "vdnn_dyn", "vdnn_dyn_passes"]

#: a stand-in for one training pass: the peak bytes of a plan
PeakFn = Callable[[Plan], int]

_PASSES = ("fwd", "bwd_data", "bwd_filter")


@dataclass(frozen=True)
class PassRecord:
    """One profiling pass of vDNN_dyn: its name, simulated peak bytes, and whether it fit the budget."""

    name: str
    peak_bytes: int
    fits: bool


def algo_ladder(algos: tuple[ConvAlgo, ...], pass_: str) -> tuple[ConvAlgo, ...]:
    """The downgrade ladder of one convolution pass: fastest first, each next one needing less workspace.

    Working algorithms (status ``ok`` with a time) sorted by ms; an algorithm joins the ladder when its
    workspace is below that of every faster one, so the ladder ends at the memory-optimal algorithm
    (the least workspace, the fastest among equals).
    """
    usable = sorted(
        working_algos(algos, pass_),
        key=lambda a: (a.ms, a.workspace_bytes, a.algo),
    )
    ladder: list[ConvAlgo] = []
    for a in usable:
        if not ladder or a.workspace_bytes < ladder[-1].workspace_bytes:
            ladder.append(a)
    return tuple(ladder)


def conv_ladder(conv: ConvProfile) -> tuple[ConvChoice, ...]:
    """The algorithm triples one convolution steps through, fastest first, memory-optimal last.

    Each step moves the pass (fwd, bwd-data, bwd-filter) whose current algorithm needs the most workspace
    one rung down its ``algo_ladder``. Empty when a pass has no working algorithm in the profile.
    """
    ladders = [algo_ladder(conv.algos, p) for p in _PASSES]
    if any(not lad for lad in ladders):
        return ()
    pos = [0, 0, 0]
    out = [
        ConvChoice(
            fwd=ladders[0][0].algo,
            bwd_data=ladders[1][0].algo,
            bwd_filter=ladders[2][0].algo,
        )
    ]
    while True:
        movable = [p for p in range(3) if pos[p] + 1 < len(ladders[p])]
        if not movable:
            return tuple(out)
        p = max(movable, key=lambda q: (ladders[q][pos[q]].workspace_bytes, -q))
        pos[p] += 1
        out.append(
            ConvChoice(
                fwd=ladders[0][pos[0]].algo,
                bwd_data=ladders[1][pos[1]].algo,
                bwd_filter=ladders[2][pos[2]].algo,
            )
        )


def _simulated_peak(profile: Profile, optimizer: str) -> PeakFn:
    sim = Simulator(profile, optimizer)

    def peak(plan: Plan) -> int:
        return sim.run(plan, check=False).peak_bytes

    return peak


def _conv_key(stage: int, conv: ConvProfile) -> str:
    return f"{stage}.{conv.name}"


def _greedy(base: Plan, profile: Profile, budget_bytes: int, peak: PeakFn) -> tuple[Plan, int]:
    """vDNN's greedy phase on ``base``: visit convolutions in order, downgrade while the pass overflows."""
    ladders = [(_conv_key(st.index, c), conv_ladder(c)) for st in profile.stages for c in st.convs]
    ladders = [(key, lad) for key, lad in ladders if lad]
    algos = {key: lad[0] for key, lad in ladders}
    plan = base.with_(conv_algos=algos)
    used = peak(plan)
    for key, lad in ladders:
        rung = 0
        while used > budget_bytes and rung + 1 < len(lad):
            rung += 1
            algos[key] = lad[rung]
            plan = base.with_(conv_algos=algos)
            used = peak(plan)
    return plan, used


def vdnn_dyn_passes(
    profile: Profile,
    budget_bytes: int,
    *,
    optimizer: str = "sgd",
    peak: PeakFn | None = None,
) -> tuple[Plan, tuple[PassRecord, ...]]:
    """Run vDNN_dyn's passes (module docstring) and return the adopted plan and every pass tried.

    Args:
        profile: the chain's profile.
        budget_bytes: the memory budget, bytes.
        optimizer: optimizer whose state counts toward the peak (``sgd``, ``adam``, ``none``).
        peak: what a training pass measures, plan -> peak bytes; default: ``Simulator(profile,
            optimizer).run(plan).peak_bytes``.

    Returns:
        ``(plan, passes)``: the plan (labelled ``vdnn_dyn``) and the passes in the order tried; the last
        record with ``fits=True`` names the pass adopted. When nothing fits, the plan is vDNN_all(m).
    """
    measure: PeakFn = peak if peak is not None else _simulated_peak(profile, optimizer)
    records: list[PassRecord] = []

    def attempt(name: str, plan: Plan, used: int | None = None) -> bool:
        used = measure(plan) if used is None else used
        ok = used <= budget_bytes
        records.append(PassRecord(name, used, ok))
        return ok

    def done(plan: Plan) -> tuple[Plan, tuple[PassRecord, ...]]:
        return plan.with_(label="vdnn_dyn"), tuple(records)

    all_m = vdnn_all(profile, budget_bytes, conv_rule="memory_optimal")
    if not attempt("vdnn_all_m", all_m):
        return done(all_m)
    base_p = Plan.uniform(profile.n_stages, Action.KEEP, conv_rule="fastest")
    if attempt("none_p", base_p):
        return done(base_p)
    for name, make in (("vdnn_conv_p", vdnn_conv), ("vdnn_all_p", vdnn_all)):
        plan = make(profile, budget_bytes, conv_rule="fastest")
        if attempt(name, plan):
            return done(plan)
    for name, make in (("greedy_conv", vdnn_conv), ("greedy_all", vdnn_all)):
        plan, used = _greedy(
            make(profile, budget_bytes, conv_rule="fastest"),
            profile,
            budget_bytes,
            measure,
        )
        if attempt(name, plan, used):
            return done(plan)
    records.append(PassRecord("fallback_all_m", records[0].peak_bytes, records[0].fits))
    return done(all_m)


def vdnn_dyn(profile: Profile, budget_bytes: int) -> Plan:
    """Dynamic vDNN: the first of vDNN's profiling passes that fits ``budget_bytes`` (module docstring).

    Args:
        profile: the chain's profile.
        budget_bytes: the memory budget, bytes.

    Returns:
        The adopted plan, labelled ``vdnn_dyn``; vDNN_all(m) when no pass fits.
    """
    return vdnn_dyn_passes(profile, budget_bytes)[0]

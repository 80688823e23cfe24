"""The per-layer prefetch trigger: for each stage, when its offloaded activations come back in the backward.

# NOTE [ Per-layer prefetch trigger ]
The multi-GPU vDNN paper (Kim and Lee, "Efficient Multi-GPU Memory Management for Deep Learning Acceleration",
§III.C "Efficient Trigger Settings for Swap-in") replaces vDNN's fixed prefetch point (layer N's data comes back
during layer N+1's backward) by one trigger per layer, found in three steps while the first iterations run:

    "Step 2. Find out the earliest time range of each trigger (=prefetch) where learning process works well without
    out-of-memory error. Step 3. Searching for the latest time range for each trigger when swap-in is performed
    without any additional time-delay." ... "within the range in which an out-of-memory error does not occur, the
    algorithm tries to delay the trigger as late as possible where time-delay does not occur."

(Its step 1, the largest batch vDNN can run, is the budget here: the caller fixes it.) In memtune a trigger is a
per-stage lookahead L_k (NOTE [ Prefetch lookahead ] in ``memtune.tuner.plan``): the storages first needed by stage k's
backward are prefetched when the backward reaches stage k + L_k; a larger L_k is an earlier trigger. The simulator
(``memtune.tuner.simulator``) stands in for the paper's training iterations: "out of memory" is a simulated peak over
the budget, "time-delay" a simulated step longer than the one before (the actions and the compute are fixed, so a longer
step is exactly more stall). ``prefetch_trigger`` runs, for the need stages K (those that first need an offloaded
storage; the others' lookahead changes nothing and is left at the start value):

1. Start: the global lookahead L (0 ... the last stage) whose plan fits and is fastest, the largest of equals, i.e.
   the earliest common trigger that fits. The whole step cannot get slower than this start, so the result is never
   slower than the best global lookahead within the budget. Where no global lookahead fits, every trigger is the
   latest one (L_k = 0) and the result says it does not fit.
2. Earliest per layer (the paper's step 2): in backward order, each L_k is raised one stage at a time while the
   plan still fits and gets faster: a layer whose copy is long may come back earlier than the rest can. (A raise
   that only keeps the step is not taken: step 3 would have to undo it, and it cannot always: see below.)
3. Latest without delay (the paper's step 3): from the stage needed last in the backward to the first, each L_k is
   lowered one stage at a time while the plan gets no slower; the last value before a slowdown stays. A later
   prefetch holds its buffer for a shorter time, so the peak only falls. The order matters because the copy engine
   runs prefetches in the order they are issued: an early trigger of a storage needed late puts its copy in the
   queue ahead of every copy issued after it, so while it stays early, lowering the trigger of a storage needed
   sooner can make that one wait. On the committed H100 profile of ResNet-50 b128 fp32, ``vdnn_all_p`` at 60% of
   the unconstrained peak, this order ended 2.1 GiB below the start at the same step; backward order, with step 2
   taking raises that kept the step, ended 0.3 GiB above it.

Steps 2 and 3 repeat until neither moves a trigger (at most ``_ROUNDS`` rounds): lowering the others in step 3 can
leave room under the budget for a layer that step 2 could not raise before. Each step stops a layer at its first
failure, as the paper's incremental search does. Every move keeps the plan within the budget and makes the step
faster (step 2) or no slower (step 3), so the rounds end. On ResNet-50 b128 fp32 (23 stages, the H100 profile)
``vdnn_all_p``, ``vdnn_conv_p`` and tuned plans at 40-60% of the peak took 24-125 simulations, 11-64 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

from memtune.profiler import Profile
from memtune.tuner.plan import Plan, PlanKind, resolve_storages
from memtune.tuner.simulator import SimResult, Simulator

__all__ = ["PrefetchTrigger", "need_stages", "prefetch_trigger"]

_SAME_MS = 1e-9  # a step this much longer or less is "no slower" (float noise of the simulator's sums)
_MAX_LOOKAHEAD = 1024  # stages, the plan's bound
_ROUNDS = 4  # most rounds of steps 2 and 3 (NOTE [ Per-layer prefetch trigger ])


@dataclass(frozen=True)
class PrefetchTrigger:
    """What ``prefetch_trigger`` chose.

    Attributes:
        plan: the input plan with ``prefetch_lookaheads`` set to the triggers (unchanged where nothing is prefetched).
        result: its simulated step.
        fits: whether ``result``'s peak is within the budget.
        start_lookahead: the global lookahead of step 1 (stages).
        start: step 1's plan (the global lookahead) simulated: the result is never slower than it.
        earliest: per stage, the lookahead after the first round's step 2 (the earliest triggers), stages.
        simulations: how many plans were simulated.
    """

    plan: Plan
    result: SimResult
    fits: bool
    start_lookahead: int
    start: SimResult
    earliest: tuple[int, ...]
    simulations: int


def need_stages(profile: Profile, plan: Plan) -> list[int]:
    """The stages whose backward first needs an offloaded storage under ``plan`` (NOTE [ Plan semantics ]): the
    stages whose lookahead matters, in increasing order."""
    return sorted({f.need for f in resolve_storages(profile, plan.actions) if f.fate == "offload" and f.need >= 0})


class _Runner:
    """Simulates ``plan`` with per-stage lookaheads and counts the runs."""

    def __init__(self, sim: Simulator, plan: Plan, budget_bytes: int) -> None:
        self.sim, self.plan, self.budget = sim, plan, budget_bytes
        self.count = 0

    def run(self, lookaheads: list[int]) -> SimResult:
        self.count += 1
        # valid by construction (0..1024, one per stage): no validation in the loop
        return self.sim.run(self.plan.model_copy(update={"prefetch_lookaheads": tuple(lookaheads)}), check=False)


def prefetch_trigger(
    profile: Profile,
    plan: Plan,
    budget_bytes: int,
    *,
    optimizer: str = "sgd",
    simulator: Simulator | None = None,
) -> PrefetchTrigger:
    """Per-layer prefetch triggers for ``plan`` within ``budget_bytes`` (NOTE [ Per-layer prefetch trigger ]).

    Only the lookaheads change; the actions and every other knob stay. A plan that prefetches nothing (no offloaded
    storage, ``sync="inline"``, a whole-model compile) comes back as it is.

    Args:
        profile: the profile ``plan`` is for.
        plan: the plan whose triggers are chosen; its own lookahead is not used.
        budget_bytes: the GPU memory the step may use, bytes (the simulated peak must stay within it).
        optimizer: the optimizer whose state the simulator counts (``sgd``, ``adam``, ``none``).
        simulator: a ``Simulator`` of ``profile`` to reuse (a search's), else one is made.

    Returns:
        A ``PrefetchTrigger``: the plan with ``prefetch_lookaheads``, its simulated step and whether it fits.

    Raises:
        PlanError: ``plan`` does not fit ``profile``.
        ValueError: ``simulator`` was made for another profile.

    Example::

        >>> trig = prefetch_trigger(profile, plan, 12 << 30)
        >>> trig.plan.prefetch_lookaheads, trig.result.step_ms
    """
    sim = simulator if simulator is not None else Simulator(profile, optimizer)
    if sim.profile is not profile:
        raise ValueError("prefetch_trigger: the simulator was made for another profile; pass that profile's")
    plan.check(profile)
    n = profile.n_stages
    needs = need_stages(sim.tables.profile, plan)
    runner = _Runner(sim, plan, budget_bytes)
    if not needs or plan.sync == "inline" or plan.kind is PlanKind.WHOLE_COMPILE:
        r = sim.run(plan, check=False)
        own = plan.stage_lookaheads()
        return PrefetchTrigger(plan, r, r.peak_bytes <= budget_bytes, own[0], r, own, 1)
    cap = [min(_MAX_LOOKAHEAD, n - 1 - k) for k in range(n)]  # a trigger at the first backward stage is the earliest
    start_la, start = _start(runner, n, max(cap[k] for k in needs))
    la = [min(start_la, cap[k]) for k in range(n)]
    if start.peak_bytes > budget_bytes:  # nothing fits: the latest triggers, the least memory
        la = [0 if k in needs else v for k, v in enumerate(la)]
        r = runner.run(la)
        done = plan.with_(prefetch_lookaheads=tuple(la))
        return PrefetchTrigger(done, r, r.peak_bytes <= budget_bytes, start_la, start, tuple(la), runner.count)
    cur = start
    earliest: tuple[int, ...] = ()
    for _ in range(_ROUNDS):
        before = list(la)
        cur = _move(runner, la, sorted(needs, reverse=True), cap, cur, step=+1)  # 2. earliest per layer
        earliest = earliest or tuple(la)
        cur = _move(runner, la, needs, cap, cur, step=-1)  # 3. latest without delay, the stage needed last first
        if la == before:
            break
    done = plan.with_(prefetch_lookaheads=tuple(la))
    return PrefetchTrigger(done, cur, cur.peak_bytes <= budget_bytes, start_la, start, earliest, runner.count)


def _start(runner: _Runner, n: int, top: int) -> tuple[int, SimResult]:
    """Step 1: the fitting global lookahead in 0..``top`` of the fastest step, the largest of equals; where none
    fits, the one of the lowest peak (NOTE [ Per-layer prefetch trigger ])."""
    best: tuple[int, SimResult] | None = None
    lowest: tuple[int, SimResult] | None = None
    for lookahead in range(top + 1):
        r = runner.run([lookahead] * n)
        if lowest is None or r.peak_bytes < lowest[1].peak_bytes:
            lowest = (lookahead, r)
        if r.peak_bytes <= runner.budget and (best is None or r.step_ms <= best[1].step_ms + _SAME_MS):
            best = (lookahead, r)
    assert lowest is not None
    return best if best is not None else lowest


def _move(runner: _Runner, la: list[int], order: list[int], cap: list[int], cur: SimResult, *, step: int) -> SimResult:
    """Steps 2 (``step`` +1: earlier, taken while the step gets faster) and 3 (-1: later, taken while it gets no
    slower): move each need stage's lookahead in ``order`` one stage at a time while the plan fits; ``la`` is
    updated in place. Returns the last accepted result (NOTE [ Per-layer prefetch trigger ])."""
    for k in order:
        while 0 <= la[k] + step <= cap[k]:
            la[k] += step
            r = runner.run(la)
            slower = r.step_ms > cur.step_ms + _SAME_MS if step < 0 else r.step_ms >= cur.step_ms - _SAME_MS
            if r.peak_bytes > runner.budget or slower:
                la[k] -= step
                break
            cur = r
    return cur

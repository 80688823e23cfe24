"""How fast any compiled plan can be at a budget: a lower bound from the compiler's measured points and the
compiled-region profiles.

``print(tuned)`` prints it beside the eager bound (NOTE [ Budget bound ] in ``memtune.tuner.bound``) where compiled
plans were candidates.

# NOTE [ Compiled lower bound ]
With compiling on, two families of compiled plans are candidates: the whole model compiled at one measured activation
budget, every stage kept, priced by its compiler point (NOTE [ Whole-model compile ] in ``memtune.tuner._whole``); and,
per compiled-region profile (one partition into regions, compiled at one activation budget), a plan of offload and
recompute over its regions, simulated on that profile (NOTE [ Compiled-region candidates ] in
``memtune.tuner.region_plans``). For a budget B the bound is the least of the families' floors, each
max(compute floor, link floor). Times are ms, bytes those of the step's peak.

*The whole model compiled.* Its points (m_j, t_j) are the compiler points' allocated peaks and steps as the search
serves them (peaks moved for the optimizer, ``memtune.tuner._search_results.compiler_candidates``). T is the fastest
step measured; from it towards less memory the lower convex envelope of the points (``lower_envelope``) has vertices
(m_0, T), (m_1, t_1), ... and slopes s_i rising: the ms per byte of peak the compiler's recompute frees between two
measured budgets. The compute floor is

    F(B) = max(T, max_i [t_i + s_i (m_i - B)])

every chord of the envelope extended into a line. It holds for every measured point that fits (m_j <= B), with no
assumption: each extended chord lies on or below the envelope, the envelope on or below every point, and the lines
fall as the peak grows, so F(B) <= F(m_j) <= t_j. It holds for the compiler at a budget not measured where its step,
as a function of its peak, never beats the fastest point measured and is convex: each further byte freed costs at
least what the last did, as when the partitioner re-makes the cheapest bytes (pointwise operations) before dearer
ones. A convex curve lies on or above each chord's extension beyond the chord's ends, though within a chord it may lie
below it: so the chords are extended, not joined, and below the lowest peak measured every byte costs at least the
last slope. A whole-model compile sends nothing to the host: no link floor.

*Compiled regions.* On one compiled-region profile, at the moment of its unplanned step's peak P, a plan that fits B
has freed at least D = P - B bytes: r dropped (recompute, selective) and o = D - r sent to the host and not yet back.
Its step is at least

- compute floor: T + c(r), T the profile's compute (every region's forward and backward and the loss as the simulator
  prices them; its unplanned step, which stalls on nothing) and c(r) the least re-run time that drops r bytes: each
  region re-makes the bytes it made for at least the lower convex envelope of its re-run and selective costs
  (``memtune.tuner.bound.remake_pieces``, as NOTE [ Budget bound ] prices them), the cheapest pieces of all regions
  taken first;
- link floor: o (1/d2h + 1/h2d), d2h and h2d the fastest copy rates of any storage of the profile, bytes per ms (the
  simulator's copy times, ``memtune.tuner._copy_costs.storage_copy_ms``): a byte away at the peak went out before it on
  the one copy engine to the host and comes back after it on the one from the host, so its two copies never overlap.

- host floor, where the profile carries host prices (NOTE [ Host issue time ] in ``memtune.tuner._host_time``): the
  host's time to issue the step with every region kept. A plan's actions add host work (an offloaded region's hooks,
  a recomputed one's re-run) and take none away, so no plan of the profile issues its step faster.

The floor is the least over r of the larger of the compute and link floors, the split most favourable to the plan,
and at least the host floor; r is at most the bytes the regions make, and D at most the profile's storages (beyond
that no plan of the profile fits: the floor is infinite). Without a copy rate o is 0. The family's unconstrained
step T is its kept step as simulated, the larger of its compute and its host floor.

Where neither family exists (no compiler points, no compiled-region profile) there is no bound and nothing is
printed. The compiled unconstrained step, the base of the printed ratio, is the fastest family's T.

Assumptions, besides the relaxations NOTE [ Budget bound ] makes (fractions of storages, no allocator rounding):

- the compiler's curve as above (non-increasing, convex) for budgets not measured; the measured points served need
  neither;
- a plan of regions takes nothing off the unplanned step's live bytes but what it drops or has away (re-made tensors,
  copies in flight and workspaces only add), and its actions change no region's forward, backward or the loss but
  add re-runs as the simulator prices them;
- copies each way one at a time at the fastest storage's rate, the link not shared (one GPU per host link);
- the host's pace as the profile's prices measured it (a busier host issues more slowly; a quieter one, measured
  later, may issue faster than the floor);
- the bound is at B itself: plans of regions must fit B less the headroom, and a compiler point is served where its
  reserved peak, which is at least its allocated peak, fits B (or its allocated peak fits B less the headroom); so
  every compiled plan served has its allocated peak within B. The bound is looser than either family's best plan by
  what it leaves out (when copies can start, which bytes are live at the peak), not tighter.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from memtune.profiler import Profile
from memtune.tuner._search_results import compiler_candidates
from memtune.tuner._tuner_errors import BoundError
from memtune.tuner.bound import lower_envelope, remake_pieces, step_lower_bound
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import Simulator

__all__ = ["CompiledBound", "CompiledFloor", "compiled_lower_bound", "least_step_ms", "region_floor", "whole_floor"]

GIB = float(1 << 30)  # remake_pieces' unit

#: the family name of the whole model compiled
WHOLE = "the whole model compiled"


@dataclass(frozen=True)
class CompiledFloor:
    """One family's floor at one budget (NOTE [ Compiled lower bound ]). Times ms, sizes bytes.

    Attributes:
        family: ``the whole model compiled`` or ``N regions compiled at activation budget A``.
        unconstrained_ms: its fastest step with everything kept (T).
        step_ms: its floor, the largest of ``compute_ms``, ``link_ms`` and ``host_ms``; ``inf`` where none of its plans
            can fit.
        compute_ms / link_ms: its compute floor and link floor at the split the floor takes.
        host_ms: its host floor (the host's time to issue a kept step; 0 without host prices).
        recompute_bytes / offload_bytes: that split: bytes of peak freed by recompute and by copies to the host.
    """

    family: str
    unconstrained_ms: float
    step_ms: float
    compute_ms: float
    link_ms: float = 0.0
    host_ms: float = 0.0
    recompute_bytes: float = 0.0
    offload_bytes: float = 0.0


@dataclass(frozen=True)
class CompiledBound:
    """A lower bound on the step of any compiled plan at one budget: the least of the families' floors.

    Attributes:
        budget_bytes: the budget, bytes.
        floors: every family's floor, the whole model compiled first, then the compiled-region profiles in order.
    """

    budget_bytes: int
    floors: tuple[CompiledFloor, ...]

    @property
    def least(self) -> CompiledFloor:
        """The family whose floor is the bound (the first among ties)."""
        return min(self.floors, key=lambda f: f.step_ms)

    @property
    def step_ms(self) -> float:
        """The bound, ms; ``inf`` where no compiled plan can fit."""
        return self.least.step_ms

    @property
    def unconstrained_ms(self) -> float:
        """The compiled unconstrained step: the fastest family's step with everything kept, ms."""
        return min(f.unconstrained_ms for f in self.floors)

    @property
    def ratio(self) -> float:
        """The bound over the compiled unconstrained step."""
        return self.step_ms / self.unconstrained_ms


def whole_floor(points: Sequence[tuple[float, float]], budget_bytes: int) -> CompiledFloor:
    """The floor of the whole model compiled at ``budget_bytes`` from its points ``(peak bytes, step ms)``: the fastest
    step and every envelope chord extended (NOTE [ Compiled lower bound ]).

    Raises:
        ValueError: no points.
    """
    if not points:
        raise ValueError("the whole model compiled needs at least one compiler point")
    anchor, fastest, pieces = lower_envelope([(float(m), t) for m, t in points])
    floor, m, t = fastest, anchor, fastest
    for width, slope in pieces:  # the chord from (m, t) on, extended both ways
        floor = max(floor, t + slope * (m - budget_bytes))
        m, t = m - width, t + slope * width
    return CompiledFloor(WHOLE, fastest, floor, floor, recompute_bytes=max(0.0, anchor - budget_bytes))


def region_floor(sim: Simulator, budget_bytes: int) -> CompiledFloor:
    """The floor of the plans on ``sim``'s compiled-region profile at ``budget_bytes``: the least over how they split
    the bytes freed at the unplanned peak between recompute and copies (NOTE [ Compiled lower bound ])."""
    prof, tab = sim.profile, sim.tables
    keep = Plan.uniform(sim.n)
    fwd, bwd, _, _ = sim.stage_costs(keep)
    compute = sum(fwd) + sim.loss_ms + sum(bwd)
    family = f"{sim.n} regions compiled at activation budget {prof.compile_budget:g}"
    host = sim.host_ms(keep.actions)  # a plan's actions add host work, take none away
    kept = max(compute, host)
    need = float(sim.run(keep).peak_bytes - budget_bytes)
    if need <= 0:
        return CompiledFloor(family, kept, kept, compute, host_ms=host)
    if need > sum(tab.s_bytes):
        return CompiledFloor(family, kept, math.inf, math.inf, host_ms=host)
    made: dict[int, float] = {}
    for s, p in enumerate(tab.s_producer):
        if p >= 0:
            made[p] = made.get(p, 0.0) + tab.s_bytes[s]
    pieces = sorted(
        (slope / GIB, width * GIB)  # ms per byte, bytes
        for p, b in made.items()
        for width, slope in remake_pieces(sim, p, b / GIB, fwd[p])
    )
    sized = [k for k, b in enumerate(tab.s_bytes) if b > 0]
    per_byte = (  # ms per byte out and back at the fastest storage's rates; None: no storage to copy
        min(tab.s_d2h[k] / tab.s_bytes[k] for k in sized) + min(tab.s_h2d[k] / tab.s_bytes[k] for k in sized)
        if sized
        else None
    )
    r, rerun = _split(compute, pieces, need, per_byte)
    if r is None:
        return CompiledFloor(family, kept, math.inf, math.inf, host_ms=host)
    link = 0.0 if per_byte is None else per_byte * (need - r)
    return CompiledFloor(family, kept, max(compute + rerun, link, host), compute + rerun, link, host, r, need - r)


def _split(
    compute: float, pieces: list[tuple[float, float]], need: float, per_byte: float | None
) -> tuple[float | None, float]:
    """The bytes ``r`` to drop (the rest copied) that minimise max(``compute`` + c(r), ``per_byte`` (need - r)), and
    c(r); ``(None, inf)`` where no split frees ``need``. c is convex and piecewise linear (``pieces``: ms per byte,
    bytes, slopes rising), the link term linear, so the least of the larger lies at a breakpoint or where they cross."""
    knots = [(0.0, 0.0)]  # (bytes dropped, ms)
    for slope, width in pieces:
        r0, c0 = knots[-1]
        knots.append((r0 + width, c0 + slope * width))
    most = min(need, knots[-1][0])
    if per_byte is None:  # nothing can be copied: drop it all
        return (need, _cost(knots, pieces, need)) if need <= knots[-1][0] else (None, math.inf)
    tries = {0.0, most}
    for (r0, c0), (slope, _), (r1, _) in zip(knots, pieces, knots[1:], strict=False):
        tries.add(min(r1, most))
        if slope + per_byte > 0:  # compute + c0 + slope (r - r0) = per_byte (need - r)
            tries.add(min(max((per_byte * need - compute - c0 + slope * r0) / (slope + per_byte), r0), r1, most))
    r = min(sorted(tries), key=lambda x: max(compute + _cost(knots, pieces, x), per_byte * (need - x)))
    return r, _cost(knots, pieces, r)


def _cost(knots: list[tuple[float, float]], pieces: list[tuple[float, float]], r: float) -> float:
    """c(r): the least re-run ms that drops ``r`` bytes, on the knots of the cheapest pieces first."""
    for (r0, c0), (slope, width) in zip(knots, pieces, strict=False):
        if r <= r0 + width:
            return c0 + slope * max(0.0, r - r0)
    return knots[-1][1]


def compiled_lower_bound(
    profiles: Sequence[Profile], budget_bytes: int, optimizer: str = "sgd"
) -> CompiledBound | None:
    """The lower bound on any compiled plan's step within ``budget_bytes`` (NOTE [ Compiled lower bound ]) over
    ``profiles``: each profile's compiler points (the whole model compiled) and each compiled-region profile
    (``compile_budget`` set); None where there are neither.

    Raises:
        ValueError: the budget is not positive.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget must be positive, not {budget_bytes} bytes")
    floors: list[CompiledFloor] = []
    for prof in profiles:
        if prof.compiler_points:
            served = compiler_candidates(prof, budget_bytes, budget_bytes, optimizer)
            floors.append(whole_floor([(c.peak_bytes, c.step_ms) for c in served], budget_bytes))
    floors += [region_floor(Simulator(p, optimizer), budget_bytes) for p in profiles if p.compile_budget is not None]
    return CompiledBound(budget_bytes, tuple(floors)) if floors else None


def least_step_ms(
    eager: Profile, regions: Sequence[Profile], budget_bytes: int, optimizer: str = "sgd"
) -> float | None:
    """The least step any plan ``tune`` may serve within ``budget_bytes`` can take, ms: the smaller of the eager bound
    on ``eager`` (NOTE [ Budget bound ] in ``memtune.tuner.bound``) and the compiled bound over ``eager``'s compiler
    points and the compiled-region profiles ``regions`` (NOTE [ Compiled lower bound ]); None where neither gives a
    finite one (the solver gave no answer and no compiled plan fits)."""
    floors: list[float] = []
    with contextlib.suppress(BoundError):  # the solver gave no answer: the compiled bound alone
        floors.append(step_lower_bound(Simulator(eager, optimizer), budget_bytes).step_ms)
    compiled = compiled_lower_bound([eager, *regions], budget_bytes, optimizer)
    if compiled is not None:
        floors.append(compiled.step_ms)
    least = min(floors, default=math.inf)
    return least if math.isfinite(least) else None

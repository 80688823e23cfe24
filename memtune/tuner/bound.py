"""How fast any plan can be at a budget: a lower bound on the step time, from the profile alone.

``memtune tune`` prints it beside the best plan; ``python -m benchmarks.budget_bound`` tabulates it per budget. Compiled
plans have a bound of their own (NOTE [ Compiled lower bound ] in ``memtune.tuner.compiled_bound``).

# NOTE [ Budget bound ]
At every moment of the step (each event of the simulator's timeline of the unconstrained step: a stage's forward
or backward starting or ending, the loss) the bytes live with every activation kept, less what a plan has taken
off the GPU by then, must fit the budget. Only three things lower them: an activation copied to the host and
not yet back (offload: ``save_on_cpu``, vDNN, Layup, HMMS), an activation dropped and not yet re-made (recompute
and selective stages: ``checkpoint_sequential``, √n checkpointing), and a convolution algorithm with less
workspace (vDNN's memory-optimal algorithms, a workspace cap). Each costs time. The cheapest mix over the whole
step is one linear program (bytes in GiB, times in ms):

    minimise   σ_f + σ_b + Σ_p c_p(y_p) + Σ_k w_k(x_k)
    for each moment i at time t_i, its live bytes holding until d_i:
               Σ_s (a_is + r_s) + x_k(i) ≥ L_i − budget                   (free enough; k(i): the stage running)
               a_is + r_s ≤ b_s                                           (away by copy, or dropped)
               Σ_{s made at or after τ} a_is·d2h_s ≤ d_i − τ + slack      (every τ: one copy engine to the host;
                                                                          a copy starts after its producer ends)
               Σ_{s needed by ν} a_is·h2d_s ≤ ν − t_i + slack             (every ν: one back, before the backward
                                                                          of the storage's first reader there)
    and        y_p = Σ_{s made by p} r_s                                  (bytes stage p re-makes)

``a_is`` is the part of storage ``s`` on the host at moment ``i`` (a copy that finished by then), ``r_s`` the
part dropped (the same at every moment where ``s`` is made, no longer read by the forward, and not needed by the
backward yet), σ_f/σ_b the time compute waits in forward/backward, ``slack`` every extra millisecond that can
come before the moment (the waits and, in backward, the re-runs and slower algorithms), ``c_p`` the cheapest way
to re-make ``y`` of the bytes stage ``p`` made (the lower convex envelope of nothing, its selective stage: the
bytes it frees for its measured extra forward + backward ms, and its full re-run: all of them for its forward
ms), and ``w_k`` the least extra time to take ``x`` bytes off stage k's workspace at that pass (the lower convex
envelope of the framework's, the fastest, the memory-optimal and the fastest-within-a-cap algorithms, every cap
at an algorithm's workspace). The bound is the step's compute at its fastest algorithms plus that minimum; a
plan's step is at least that:

- relaxations only: fractions of storages, stages and algorithms; a stage re-made for the price of the bytes
  asked of it, when its reader needs them, with no segment inputs to keep; copies as fast as measured with
  nothing else on the link; no retries, no allocator rounding;
- what it leaves fixed: the loss's own tensors (the plans and PyTorch's built-ins leave them too), parameters,
  optimizer state and the batch (the simulator's ``base``), and the order of the stages.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from memtune.tuner._tuner_errors import BoundError
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import Simulator
from memtune.tuner.stage_choices import selective_gain_bytes

if TYPE_CHECKING:
    from scipy.sparse import coo_array

__all__ = ["StepBound", "lower_envelope", "remake_pieces", "step_lower_bound"]

GIB = float(1 << 30)


@dataclass(frozen=True)
class StepBound:
    """A lower bound on the step time of any plan at one budget (NOTE [ Budget bound ]).

    Attributes:
        budget_bytes: the budget, bytes.
        unconstrained_ms: the simulated unconstrained step (every activation kept, framework's algorithms), ms.
        step_ms: the bound, ms; ``inf`` where no plan can fit (some moment cannot free enough).
        offload_bytes / recompute_bytes: the most bytes the bound has on the host at one moment, and re-makes, bytes.
        recompute_ms / algorithm_ms / stall_ms: what re-making, slower algorithms and waiting for copies cost, ms.
        binding: the timeline labels of the moments whose budget constraint is tight.
    """

    budget_bytes: int
    unconstrained_ms: float
    step_ms: float
    offload_bytes: float = 0.0
    recompute_bytes: float = 0.0
    recompute_ms: float = 0.0
    algorithm_ms: float = 0.0
    stall_ms: float = 0.0
    binding: tuple[str, ...] = ()

    @property
    def ratio(self) -> float:
        """The bound over the unconstrained step."""
        return self.step_ms / self.unconstrained_ms


def lower_envelope(points: list[tuple[float, float]]) -> tuple[float, float, list[tuple[float, float]]]:
    """Saving one resource for time: of ``(resource, ms)`` points, the fastest (least resource among ties) and the
    lower convex envelope below it, as ``(resource, ms, [(resource saved, ms per unit), ...])`` with slopes rising.
    """
    least: dict[float, float] = {}
    for w, t in points:
        least[w] = min(t, least.get(w, t))
    anchor_ms = min(least.values())
    anchor = min(w for w, t in least.items() if t == anchor_ms)
    hull: list[tuple[float, float]] = [(anchor, anchor_ms)]  # from the fastest towards less resource
    for w in sorted((w for w in least if w < anchor), reverse=True):
        t = least[w]
        while len(hull) >= 2:
            (w0, t0), (w1, t1) = hull[-2], hull[-1]
            if (t1 - t0) * (w0 - w) >= (t - t0) * (w0 - w1):  # hull[-1] lies on or above the chord to (w, t)
                hull.pop()
            else:
                break
        hull.append((w, t))
    pieces = [(w0 - w1, (t1 - t0) / (w0 - w1)) for (w0, t0), (w1, t1) in itertools.pairwise(hull) if w0 > w1]
    return anchor, anchor_ms, pieces


def _stage_of(label: str) -> tuple[str, int]:
    """``("fwd", k)``/``("bwd", k)`` for an event of stage k, ``("loss", -1)`` for the loss."""
    parts = label.split()
    if parts[0] in ("fwd", "bwd"):
        return parts[0], int(parts[1])
    return "loss", -1


def _algorithm_envelopes(sim: Simulator) -> dict[tuple[str, int], tuple[float, float, list[tuple[float, float]]]]:
    """Per ``("fwd" | "bwd", stage)``: the fastest choice's workspace (GiB) and ms, and the envelope of less
    workspace for more time (``lower_envelope``) over the framework's, the fastest, the memory-optimal and the
    fastest-within-a-cap algorithms, every cap at some algorithm's workspace."""
    n = sim.n
    caps = sorted({a.workspace_bytes for st in sim.profile.stages for c in st.convs for a in c.algos})
    choices = [Plan.uniform(n, conv_rule=r) for r in ("default", "fastest", "memory_optimal")]
    choices += [Plan.uniform(n, conv_rule="fastest_within", conv_workspace_limit_bytes=w) for w in caps]
    costs = [sim.stage_costs(p) for p in choices]
    algo = {}
    for k in range(n):
        algo["fwd", k] = lower_envelope([(c[2][k] / GIB, c[0][k]) for c in costs])
        algo["bwd", k] = lower_envelope([(c[3][k] / GIB, c[1][k]) for c in costs])
    return algo


def _event_times(
    events: Sequence[tuple[float, int, str]], fwd: list[float], bwd: list[float], loss_ms: float
) -> tuple[list[float], list[float], list[float]]:
    """Each timeline event's time with every stage at ``fwd``/``bwd`` ms, and each stage's forward end and
    backward start, ms."""
    fwd_end = [float(t) for t in np.cumsum(fwd)]
    loss_start, loss_end = fwd_end[-1], fwd_end[-1] + loss_ms
    bwd_start = [float(t) for t in loss_end + np.cumsum([0.0, *bwd[::-1]])[:-1][::-1]]
    loss_times = {"loss forward": loss_start, "loss forward end": loss_start + loss_ms / 2}
    loss_times["loss backward"] = loss_times["loss forward end"]
    times: list[float] = []
    for _, _, label in events:
        kind, k = _stage_of(label)
        if kind == "bwd":
            times.append(bwd_start[k] + (bwd[k] if label.endswith("end") else 0.0))
        elif kind == "fwd":
            times.append((fwd_end[k - 1] if k > 0 else 0.0) if label.endswith("start") else fwd_end[k])
        else:
            times.append(loss_times.get(label, loss_end))
    return times, fwd_end, bwd_start


class _Program:
    """The sparse linear program: variables by name range, rows as ``(columns, values, bound)``."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.upper: list[float | None] = []
        self.rows: list[tuple[list[int], list[float], float]] = []
        self.eqs: list[tuple[list[int], list[float]]] = []

    def add(self, n: int, cost: float | list[float] = 0.0, upper: float | list[float] | None = None) -> int:
        """Adds ``n`` non-negative variables; returns the first one's column."""
        first = len(self.cost)
        self.cost += cost if isinstance(cost, list) else [cost] * n
        self.upper += upper if isinstance(upper, list) else [upper] * n
        return first

    def solve(self) -> np.ndarray | None:
        """The optimal variables; None when the program is infeasible.

        Raises:
            BoundError: the solver stopped without an answer (iteration limit, numerical trouble).
        """
        from scipy.optimize import linprog  # imported here: about a second (NOTE [ Bound beside the search ])
        from scipy.sparse import coo_array

        nv = len(self.cost)

        def matrix(rows: list[tuple[list[int], list[float]]]) -> coo_array:
            r = [i for i, (cols, _) in enumerate(rows) for _ in cols]
            c = [j for cols, _ in rows for j in cols]
            v = [x for _, vals in rows for x in vals]
            return coo_array((v, (r, c)), shape=(len(rows), nv))

        res = linprog(
            np.array(self.cost),
            A_ub=matrix([(c, v) for c, v, _ in self.rows]),
            b_ub=np.array([b for _, _, b in self.rows]),
            A_eq=matrix(self.eqs) if self.eqs else None,
            b_eq=np.zeros(len(self.eqs)) if self.eqs else None,
            bounds=[(0.0, u) for u in self.upper],
            method="highs",
        )
        if res.status == 2:
            return None
        if res.status != 0:
            raise BoundError(f"the budget bound's linear program was not solved: {res.message}")
        return np.asarray(res.x)


def step_lower_bound(sim: Simulator, budget_bytes: int) -> StepBound:
    """The least step time, ms, any plan can have within ``budget_bytes`` on ``sim``'s profile (NOTE [ Budget bound ]).

    Raises:
        ValueError: the budget is not positive.
        BoundError: the solver stopped without an answer.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget must be positive, not {budget_bytes} bytes")
    n, tab = sim.n, sim.tables
    unconstrained = sim.run(Plan.uniform(n)).step_ms
    ref = Plan.uniform(n, conv_rule="fastest")
    events = sim.run(ref, timeline=True).timeline
    _, _, wf_ref, wb_ref = sim.stage_costs(ref)

    algo = _algorithm_envelopes(sim)
    fwd = [algo["fwd", k][1] for k in range(n)]
    bwd = [algo["bwd", k][1] for k in range(n)]
    compute = sum(fwd) + sim.loss_ms + sum(bwd)
    times, fwd_end, bwd_start = _event_times(events, fwd, bwd, sim.loss_ms)
    deadlines = [next((u for u in times[i + 1 :] if u > t), t) for i, t in enumerate(times)]

    lp = _Program()
    sig = lp.add(2, cost=1.0)  # forward and backward waits
    n_s = len(tab.s_bytes)
    size = [tab.s_bytes[s] / GIB for s in range(n_s)]
    drop = lp.add(n_s, upper=size)
    for s in range(n_s):
        if tab.s_producer[s] < 0 or not tab.s_saved_by[s]:
            lp.upper[drop + s] = 0.0
    remake_cols, remake_cost = _remake_columns(lp, sim, size, drop, fwd)
    ws_cols, algo_cost = _workspace_columns(lp, algo)
    fwd_algo_cols = [j for (kind, _), cols in ws_cols.items() if kind == "fwd" for j in cols]
    at = _Moments(
        sim=sim,
        budget_bytes=budget_bytes,
        size=size,
        drop=drop,
        algo=algo,
        ws_ref=(wf_ref, wb_ref),
        bwd=bwd,
        bwd_start=bwd_start,
        times=times,
        deadlines=deadlines,
        need=[bwd_start[max(tab.s_saved_by[s])] if tab.s_saved_by[s] else bwd_start[0] for s in range(n_s)],
        release=[fwd_end[p] if p >= 0 else 0.0 for p in tab.s_producer],
        ws_cols=ws_cols,
        # what may come before a moment: forward waits and algorithms, and in backward also re-runs and its waits
        fwd_slack=([sig, *fwd_algo_cols], [1.0] + [algo_cost[j] for j in fwd_algo_cols]),
        all_slack=([sig, sig + 1, *remake_cols, *algo_cost], [1.0, 1.0, *remake_cost, *algo_cost.values()]),
    )
    moments: list[tuple[str, int, int, int]] = []  # label, row of its budget constraint, its a_is columns
    for i, (_, live, label) in enumerate(events):
        moment = _add_moment(lp, at, i, live, label)
        if moment is not None:
            moments.append(moment)
    if not moments:
        return StepBound(budget_bytes, unconstrained, compute)
    x = lp.solve()
    if x is None:
        return StepBound(budget_bytes, unconstrained, float("inf"))
    cost = np.array(lp.cost)
    remade = float(sum(x[drop + s] for s in range(n_s)))
    on_host = 0.0
    binding = []
    for label, row, away, end in moments:
        cols, vals, rhs = lp.rows[row]
        on_host = max(on_host, float(x[away:end].sum()))
        if abs(sum(v * x[c] for c, v in zip(cols, vals, strict=True)) - rhs) < 1e-6:
            binding.append(label)
    return StepBound(
        budget_bytes=budget_bytes,
        unconstrained_ms=unconstrained,
        step_ms=compute + float(cost @ x),
        offload_bytes=on_host * GIB,
        recompute_bytes=remade * GIB,
        recompute_ms=float(sum(x[c] * v for c, v in zip(remake_cols, remake_cost, strict=True))),
        algorithm_ms=float(sum(x[c] * v for c, v in algo_cost.items())),
        stall_ms=float(x[sig] + x[sig + 1]),
        binding=tuple(binding),
    )


def _remake_columns(
    lp: _Program, sim: Simulator, size: list[float], drop: int, fwd: list[float]
) -> tuple[list[int], list[float]]:
    """Add, per stage that makes storages, the pieces of ``c_p`` (the cheapest way to re-make bytes it made, GiB, for
    ms) and the equality tying them to the storages dropped (columns from ``drop``); their columns and ms per GiB."""
    tab = sim.tables
    made_by: dict[int, list[int]] = {}
    for s, p in enumerate(tab.s_producer):
        if p >= 0:
            made_by.setdefault(p, []).append(s)
    remake_cols: list[int] = []
    remake_cost: list[float] = []
    for p, sids in made_by.items():
        pieces = remake_pieces(sim, p, sum(size[s] for s in sids), fwd[p])
        first = lp.add(len(pieces), cost=[c for _, c in pieces], upper=[w for w, _ in pieces])
        lp.eqs.append(
            (
                [drop + s for s in sids] + list(range(first, first + len(pieces))),
                [1.0] * len(sids) + [-1.0] * len(pieces),
            )
        )
        remake_cols += list(range(first, first + len(pieces)))
        remake_cost += [c for _, c in pieces]
    return remake_cols, remake_cost


def remake_pieces(sim: Simulator, p: int, made_gib: float, fwd_ms: float) -> list[tuple[float, float]]:
    """The cheapest way to re-make bytes stage ``p`` made (``made_gib`` GiB of them; ``fwd_ms`` its forward at the
    fastest algorithms): the lower convex envelope of keeping them all, its selective stage and its full re-run as the
    simulator prices them, as ``[(GiB, ms per GiB), ...]`` with slopes rising (``lower_envelope``)."""
    prof = sim.profile
    extra = sum(max(0.0, x) for x in prof.stages[p].selective_extra_ms) * sim.compute_scale
    gain = min(selective_gain_bytes(prof, p) / GIB, made_gib)
    # bytes kept -> ms; a selective stage costs a little, so that keeping everything stays the anchor
    measured = sim.rec_extra_ms[p]
    rerun = fwd_ms if measured is None else measured  # as the simulator prices it
    points = [(made_gib, 0.0), (0.0, rerun)] + ([(made_gib - gain, max(extra, 1e-9))] if gain > 0 else [])
    return lower_envelope(points)[2]


def _workspace_columns(
    lp: _Program, algo: dict[tuple[str, int], tuple[float, float, list[tuple[float, float]]]]
) -> tuple[dict[tuple[str, int], list[int]], dict[int, float]]:
    """Add the pieces of every ``w_k`` (workspace GiB taken off a pass for ms): their columns per ``("fwd" | "bwd",
    stage)``, and each column's ms per GiB."""
    ws_cols: dict[tuple[str, int], list[int]] = {}
    algo_cost: dict[int, float] = {}
    for key, (_, _, pieces) in algo.items():
        first = lp.add(len(pieces), cost=[c for _, c in pieces], upper=[w for w, _ in pieces])
        ws_cols[key] = list(range(first, first + len(pieces)))
        algo_cost.update({first + j: c for j, (_, c) in enumerate(pieces)})
    return ws_cols, algo_cost


@dataclass(frozen=True)
class _Moments:
    """What the rows of each moment read (``step_lower_bound``): sizes in GiB, times in ms, columns of the program."""

    sim: Simulator
    budget_bytes: int
    #: per storage: its size, GiB; its dropped part's column is ``drop + s``
    size: list[float]
    drop: int
    algo: dict[tuple[str, int], tuple[float, float, list[tuple[float, float]]]]
    #: per stage, the forward's and the backward's workspace at the fastest algorithms, bytes
    ws_ref: tuple[list[int], list[int]]
    bwd: list[float]
    bwd_start: list[float]
    #: per event: its time, and the next later event's
    times: list[float]
    deadlines: list[float]
    #: per storage: when the backward first needs it back, and when its copy to the host may start
    need: list[float]
    release: list[float]
    ws_cols: dict[tuple[str, int], list[int]]
    #: the columns (and ms) that may come before a forward moment, and before a backward one
    fwd_slack: tuple[list[int], list[float]]
    all_slack: tuple[list[int], list[float]]


def _add_moment(lp: _Program, at: _Moments, i: int, live: int, label: str) -> tuple[str, int, int, int] | None:
    """Add event ``i``'s rows (``live`` bytes at ``label``): free enough, away by copy or dropped, the copy engines
    both ways; the moment as ``(label, row of its budget constraint, its first a_is column, past its last)``, or None
    where the budget holds it as it is."""
    tab = at.sim.tables
    kind, k = _stage_of(label)
    own = 0.0
    if kind != "loss" and label.endswith("start"):  # this moment's workspace: the fastest choice's, then less
        ref_ws = (at.ws_ref[0] if kind == "fwd" else at.ws_ref[1])[k] / GIB
        own = at.algo[kind, k][0] - ref_ws
    must = (live - at.budget_bytes) / GIB + own
    if must <= 0:
        return None
    free, reads_at = _free_storages(at, kind, k, label)
    size, drop = at.size, at.drop
    away = lp.add(len(free), upper=[size[s] for s in free])
    cols = [away + j for j in range(len(free))] + [drop + s for s in free]
    if kind != "loss" and label.endswith("start"):
        cols += at.ws_cols[kind, k]
    lp.rows.append((cols, [-1.0] * len(cols), -must))
    moment = (label, len(lp.rows) - 1, away, away + len(free))
    for j, s in enumerate(free):
        lp.rows.append(([away + j, drop + s], [1.0, 1.0], size[s]))
    slack_cols, slack_vals = at.all_slack if kind == "bwd" else at.fwd_slack
    d2h = [tab.s_d2h[s] / size[s] for s in free]
    for tau in sorted({at.release[s] for s in free}):
        cs = [away + j for j, s in enumerate(free) if at.release[s] >= tau]
        vs = [d2h[j] for j, s in enumerate(free) if at.release[s] >= tau]
        lp.rows.append((cs + slack_cols, vs + [-v for v in slack_vals], at.deadlines[i] - tau))
    h2d = [tab.s_h2d[s] / size[s] for s in free]
    back, back_vals = at.all_slack
    due = [reads_at.get(s, at.need[s]) for s in free]
    for nu in sorted(set(due)):
        cs = [away + j for j in range(len(free)) if due[j] <= nu]
        vs = [h2d[j] for j in range(len(free)) if due[j] <= nu]
        lp.rows.append((cs + back, vs + [-v for v in back_vals], nu - at.times[i]))
    return moment


def _free_storages(at: _Moments, kind: str, k: int, label: str) -> tuple[list[int], dict[int, float]]:
    """The storages a plan may have off the GPU at the moment ``label`` of stage ``k``, and for those the backward
    reads here, when it next reads each, ms."""
    tab = at.sim.tables
    n, n_s = at.sim.n, len(tab.s_bytes)
    # storage -> when the backward next reads it (one that stage k reads may be fetched inline, within it)
    reads_at: dict[int, float] = {}
    if kind == "bwd":  # live now: read by the backward of this stage or of earlier ones
        for s in range(n_s):
            readers = [j for j in tab.s_saved_by[s] if j < k or (j == k and label.endswith("start"))]
            if readers:
                j = max(readers)
                reads_at[s] = at.bwd_start[j] + (at.bwd[j] if j == k else 0.0)
        free = list(reads_at)
    else:  # made by stages whose forward is over and read by no later forward
        done = k if label.endswith("start") else k + 1 if kind == "fwd" else n
        final_out = tab.output_storage[n - 1]
        free = [
            s
            for s in range(n_s)
            if 0 <= tab.s_producer[s] < done and tab.s_last_use[s] < done and not (kind == "loss" and s == final_out)
        ]
    free = [s for s in free if at.size[s] > 0 and tab.s_producer[s] >= 0]  # the batch is ``base``
    return free, reads_at

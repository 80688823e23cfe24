"""The simulator's fast path: one step's times and peak without its timeline, on tables made once per profile.

# NOTE [ Fast path ]
A search asks the simulator for thousands of plans' step and peak and never for their timeline. ``Simulator._run``
builds that timeline as it goes: a labelled event per allocation and free, the storages' fates as value objects,
gradient blocks per stage. ``FastPath.run`` computes the same numbers without any of it:

* what does not depend on the plan is tabled once per profile: each storage's savers and the stages that take it
  as input (where a segment or a selective stage refers to it), its last forward reader, each stage's produced
  bytes and gradients, the loss's events; what depends only on the convolution costs (a selective stage's forward
  and backward, a recompute re-run, the bytes a stage allocates and frees whatever the plan) once per set of costs;
* NOTE [ Plan semantics ] (``memtune.tuner.plan.resolve_storages``) and the per-stage tables of ``_run`` are two
  passes over the storages, which add each storage's bytes to the stage where it is allocated, freed or re-made: its
  fate (``FastPath._fates``), then where it is copied, waited for and fetched, in storage order, the order its copies
  queue in (``FastPath._place_storages``);
* memory and time are apart: the peak depends on the order of the allocations and frees, never on their times.
  The step's memory events are summed into groups, each ending where an allocation ends a run of events (the
  forward's start and end of each stage, the loss's three, and each backward stage's prefetches and re-run, start,
  end), so the largest running sum over the groups is the timeline's maximum; it is taken in C
  (``itertools.accumulate``), and the time loops touch only stages where something waits or is copied.

Every time is the same floating-point operation on the same operands in the same order as in ``_run``, and bytes
are integers, so the results are equal to the last bit: ``tests/unit/tuner/test_fast_path.py`` compares the two on
random plans of zoo chains, committed module profiles and hand-made chains with in-place segment boundaries.
``Simulator.run`` takes this path for plans without a timeline under ``layer`` or ``deferred`` sync that split no
segment; ``inline`` and ``points`` sync, spatial splits and every timeline go through ``_run``, the reference. A
change to what ``_run`` counts is made here too (that test fails until it is).

# NOTE [ Compute bound ]
A step takes at least its compute: every stage's forward and backward, the loss, its segments' re-runs and its
selective stages' extras; waiting for copies only adds to it. Where a bounded simulation's step limit (NOTE [ Bounded
simulations ] in ``memtune.tuner.simulator``) is below that sum, the plan loses whatever its memory, so ``run`` answers
None before its storage pass: 7,252 of the 51,378 bounded simulations of the README's VGG-16 job at 13 GiB. It does so
only where ``run`` would answer None too: no time is negative, and ``step_limit_peak`` is at most the base bytes, which
every peak reaches; over a larger ``step_limit_peak`` (an incumbent that does not fit) the same test follows the peak,
before the step is timed. Once the forward has run, its end plus the rest's compute bounds the step as well, so the
backward is not timed where that sum is over the limit. The sums are taken in another order than the step's clock, so
they must exceed the limit by more than their rounding can differ (``_ROUNDING``, 1e-9 of the sum, against some 1e-14
for a hundred additions); every answer is the one ``run`` gave without them (the 51,378 calls replayed).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, chain
from operator import itemgetter
from typing import TYPE_CHECKING, NamedTuple, cast

from memtune.tuner.plan import Action

if TYPE_CHECKING:
    from memtune.tuner.plan import Plan
    from memtune.tuner.simulator import Simulator, StorageTables

__all__ = ["FastPath", "StepNumbers"]

_KEEP, _OFFLOAD, _RECOMPUTE, _SELECTIVE = Action.KEEP, Action.OFFLOAD, Action.RECOMPUTE, Action.SELECTIVE
_HOLDS = (_KEEP, _SELECTIVE)  # actions that hold the stage's input on the GPU (NOTE [ Plan semantics ])
_NONE, _KEPT, _OFFLOADED = 0, 1, 2  # a storage's fate (NOTE [ Plan semantics ])
_NEED = itemgetter(0)
# a storage's shape, for the fate rule's cases (``FastPath._fates``): one saver and no stage takes it as input; a
# chain's storage saved by exactly the stages that take it as input; anything else
_OWN, _SAVED_BY_READERS, _GENERAL = "own", "saved by readers", "general"

_ROUNDING = 1e-9  # NOTE [ Compute bound ]: far above the rounding of summing a step's times in another order
StepNumbers = tuple[float, int, float, float, float, float, tuple[float, ...], tuple[float, ...], int, int]
"""step ms, peak bytes, forward ms, backward ms, recompute ms, stall ms, forward stalls, backward stalls, D2H bytes,
H2D bytes: ``SimResult``'s fields in order, up to ``base_bytes``"""

Costs = tuple[list[float], list[float], list[int], list[int]]


class _CostTables(NamedTuple):
    """What one set of stage costs (``Simulator.stage_costs``) gives every plan priced with it."""

    costs: Costs
    fwd_sel: list[float]  # a selective stage's forward, ms: its forward plus its caching mode's extra
    bwd_sel: list[float]  # a selective stage's backward, ms: its backward plus its cheap operations' re-run
    rerun: list[float]  # a recomputed stage's re-run, ms (``Simulator._rerun_ms`` without splits)
    fwd_alloc: list[int]  # the forward's start: workspace and produced storages
    fwd_after: list[int]  # the forward's end, before the plan's frees: the workspace freed
    bwd_start: list[int]  # the backward's start: gradients made, parameters' gradients, workspace
    bwd_end: list[int]  # the backward's end, before the plan's frees: workspace and gradients freed
    monotone: bool  # no time is negative, so the step's clock never runs back (a bound on it holds early)
    busy_ms: float  # every stage's forward and backward and the loss: the compute of a plan without re-runs
    fwd_ms: float  # of it, the forward's
    sel_busy: list[float]  # what a selective stage adds to it, ms
    rerun_before: list[float]  # per stage, the re-runs of the stages before it, ms (n + 1 entries)


_Fate = tuple[int, int, tuple[int, ...], int, int, bool, int, int, int]
"""a storage's fate under a plan (NOTE [ Plan semantics ]): sid, producer, savers, last forward reader, bytes; kept, the
first stage that copies it (``n`` where none does), the last stage whose backward needs it, the first stage whose
backward ends its hold"""


class _Step:
    """One plan's tables, by stage (NOTE [ Fast path ]): the bytes each memory group allocates (positive) or frees
    (negative), the forward's start and end and the backward's prefetches and re-run, start and end; and where each
    storage is copied, waited for, fetched and needed."""

    __slots__ = (
        "bwd_end", "bwd_fetch", "bwd_mark", "bwd_start", "copy_after", "copy_during", "fate", "fetch_at", "fwd_after",
        "fwd_alloc", "fwd_mark", "late_at", "made", "need_at", "prog_end", "seg_start", "wait_at",
    )  # fmt: skip

    def __init__(self, ct: _CostTables, n: int, n_storages: int) -> None:
        self.fwd_alloc = ct.fwd_alloc.copy()
        self.fwd_after = ct.fwd_after.copy()
        self.bwd_fetch = [0] * n
        self.bwd_start = ct.bwd_start.copy()
        self.bwd_end = ct.bwd_end.copy()
        self.seg_start = [-1] * n  # by segment end: its first stage
        self.prog_end = list(range(n))  # the stage whose end the runtime's end_stage runs at: a segment's last
        self.made = [0] * n  # by segment end: what its re-run makes (storages nobody keeps, second copies, a clone)
        self.fate = [_NONE] * n_storages  # by storage (NOTE [ Plan semantics ])
        self.copy_during: list[list[int] | None] = [None] * n  # by stage: storages copied while it runs
        self.copy_after: list[list[int] | None] = [None] * n  # by stage: storages copied after it
        self.wait_at: list[list[int] | None] = [None] * n  # by stage: copies its end waits for
        self.late_at: list[list[int] | None] = [None] * n  # by stage: copies its backward uses in place
        self.fetch_at: list[list[tuple[int, int]] | None] = [None] * n  # by stage: (need, storage) fetched there
        self.need_at: list[list[int] | None] = [None] * n  # by stage: fetched storages its backward waits for
        self.fwd_mark = [False] * n  # forward stages where something is copied or waited for
        self.bwd_mark = [False] * n  # backward stages that wait, fetch, re-run or are selective


class FastPath:
    """One simulator's tables for the fast path (NOTE [ Fast path ]).

    Args:
        sim: the simulator whose numbers it reproduces, on its merged storage tables.
    """

    def __init__(self, sim: Simulator) -> None:
        tab = sim.tables
        profile = tab.profile
        n = sim.n
        modules = profile.modules
        self.n = n
        self.modules = modules
        self.out = sim.out
        self.base = sim.base
        self.sel_keep = sim.sel_keep
        self.sel_ws = sim.sel_ws
        self.sel_extra_ms = sim.sel_extra_ms
        self.sel_extra_fwd_ms = sim.sel_extra_fwd_ms
        self.rec_extra_ms = sim.rec_extra_ms
        self.rec_extra_ms_or_zero = [x or 0.0 for x in sim.rec_extra_ms]
        self.rec_ws = [w or 0 for w in sim.rec_ws]
        self.inplace = [st.inplace for st in profile.stages]
        self.packs_at_end = tab.packs_at_end
        self.s_bytes = tab.s_bytes
        self.s_d2h = tab.s_d2h
        self.s_h2d = tab.s_h2d
        self.output_storage = tab.output_storage
        self.final_out = tab.output_storage[n - 1]
        self.n_storages = len(tab.s_bytes)
        self._storage_tables(tab, modules)
        outside_release = [0] * n  # kept to the backward of their first saver, whatever the plan
        for sid, _, savers in self.outside:
            outside_release[min(savers)] += tab.s_bytes[sid]
        # the tensor a segment's in-place first stage clones (NOTE [ In-place at segment boundaries ])
        if modules:
            self.clone_src = [tab.inputs[i][0] if tab.inputs[i] else None for i in range(n)]
        else:
            self.clone_src = [tab.output_storage[i - 1] if i > 0 else None for i in range(n)]
        self.saved_by_sets = [frozenset(s) for s in tab.s_saved_by]
        self.produced_bytes = [sum(tab.s_bytes[sid] for sid in made) for made in tab.produced]
        # NOTE [ Gradients between stages ]: what each stage's backward makes and frees (the simulator's blocks), and
        # its parameters' gradients
        blocks = [sim._grad_blocks(k) for k in range(n)]
        grad_in = [sum(b[2] for b in made) for made, _ in blocks]
        grad_out = [sum(b[2] for b in gone) for _, gone in blocks]
        self.grad_made = [g + p for g, p in zip(grad_in, sim.pgrad, strict=True)]
        # NOTE [ Gradient storages ]: what a stage's backward leaves of a gradient's storage is not freed at its end;
        # its transient holds at least what of it the incoming gradients do not (NOTE [ Gradient storages made in the
        # backward ])
        rest_made = tab.grad_rest_made
        self.rest_floor = tab.grad_rest_floor
        self.grad_gone = [g + r - m for g, r, m in zip(grad_out, outside_release, rest_made, strict=True)]
        # NOTE [ Loss memory ] (``Simulator._loss``): its time, and its events' bytes apart from the model's output
        self.half = sim.loss_ms / 2
        self.loss_saved = profile.loss_saved_bytes
        self.loss_transient = profile.loss_backward_bytes or 0
        self.loss_grad = tab.s_grad[self.final_out] if self.final_out is not None else 0
        self.held = sim.held
        numel = self.out[n - 1] // sim.out_itemsize
        self.f32 = 4 * numel
        self.cast = self.f32 if sim.out_itemsize != 4 else 0
        self.cast_back = numel * sim.out_itemsize if self.cast else 0
        self._by_costs: dict[int, _CostTables] = {}
        self._last: _CostTables | None = None

    def _cost_tables(self, costs: Costs) -> _CostTables:
        """The tables of one set of stage costs, made the first time it is seen."""
        held = self._last
        if held is not None and held.costs is costs:  # a search prices most plans with the costs of the one before
            return held
        held = self._by_costs.get(id(costs[0]))
        if held is not None and all(a is b for a, b in zip(held.costs, costs, strict=True)):
            self._last = held
            return held
        fwd, bwd, ws_f, ws_b = costs
        rerun = [fwd[k] if x is None else x for k, x in enumerate(self.rec_extra_ms)]
        tables = _CostTables(
            costs,  # kept with its tables, so the ids stay theirs
            [f + e for f, e in zip(fwd, self.sel_extra_fwd_ms, strict=True)],
            [b + e for b, e in zip(bwd, self.sel_extra_ms, strict=True)],
            rerun,
            [w + p for w, p in zip(ws_f, self.produced_bytes, strict=True)],
            [-w for w in ws_f],
            [g + max(w, r) for g, w, r in zip(self.grad_made, ws_b, self.rest_floor, strict=True)],
            [-(max(w, r) + g) for g, w, r in zip(self.grad_gone, ws_b, self.rest_floor, strict=True)],
            min((*fwd, *bwd, *self.sel_extra_fwd_ms, *self.sel_extra_ms, *self.rec_extra_ms_or_zero, self.half)) >= 0,
            sum(fwd) + 2 * self.half + sum(bwd),
            sum(fwd),
            [e + x for e, x in zip(self.sel_extra_fwd_ms, self.sel_extra_ms, strict=True)],
            list(accumulate(rerun, initial=0.0)),
        )
        self._by_costs[id(costs[0])] = tables
        self._last = tables
        return tables

    def _storage_tables(self, tab: StorageTables, modules: bool) -> None:
        """The storages a stage makes, each with what the fate rule (NOTE [ Plan semantics ]) reads of it, in bytes
        and stage indices; those saved outside every stage (``outside``) are always kept. The model input (producer
        -1) has no part in any plan."""
        n = self.n
        readers: list[list[int]] = [[] for _ in tab.s_bytes]
        for i in range(n):
            if i > 0 or modules:  # a chain's model input is always resident (NOTE [ Plan semantics ])
                for sid in dict.fromkeys(tab.inputs[i]):
                    readers[sid].append(i)
        outside = [s.outside for s in tab.profile.storages]
        # in storage order: (sid, producer, savers, stages taking it as input, last forward reader, bytes, shape)
        self.storages: list[tuple[int, int, tuple[int, ...], tuple[int, ...], int, int, str]] = []
        # by sid, for a storage of one saver that no stage takes as input: its fate records where the saver keeps it
        # and where it offloads it
        self.own_fates: list[tuple[_Fate, _Fate] | None] = [None] * len(tab.s_bytes)
        for sid, p in enumerate(tab.s_producer):
            if p >= 0 and not outside[sid]:
                savers, took = tuple(tab.s_saved_by[sid]), readers[sid]
                last, nbytes = tab.s_last_use[sid], tab.s_bytes[sid]
                shape = _shape(savers, took, modules)
                self.storages.append((sid, p, savers, tuple(took), last, nbytes, shape))
                if shape is _OWN:
                    r = savers[0]
                    kept = (sid, p, savers, last, nbytes, True, n, r, r)
                    self.own_fates[sid] = (kept, (sid, p, savers, last, nbytes, False, r, r, r))
        self.outside = [
            (sid, p, tuple(tab.s_saved_by[sid])) for sid, p in enumerate(tab.s_producer) if p >= 0 and outside[sid]
        ]

    def run(
        self,
        actions: Sequence[Action],
        plan: Plan,
        costs: Costs,
        *,
        peak_limit: int | None = None,
        step_limit: float | None = None,
        step_limit_peak: int = 0,
    ) -> StepNumbers | None:
        """The numbers of ``SimResult`` for ``actions`` under ``plan``'s other knobs and ``costs`` (``stage_costs``);
        ``plan.sync`` is ``layer`` or ``deferred`` and no segment of ``actions`` is split. None, as soon as it is
        known, where the peak exceeds ``peak_limit``, or the step exceeds ``step_limit`` and the peak is at least
        ``step_limit_peak`` (NOTE [ Bounded simulations ] in ``memtune.tuner.simulator``)."""
        ct = self._cost_tables(costs)
        segs, sels = self._segments(actions)
        # NOTE [ Compute bound ]: a step is at least its compute, whatever waits for copies
        busy = fwd_busy = -1.0
        if step_limit is not None and ct.monotone:
            busy, fwd_busy = self._compute_ms(ct, segs, sels)
            if step_limit_peak <= self.base and busy - step_limit > _ROUNDING * busy:
                return None
        st = _Step(ct, self.n, self.n_storages)
        self._segment_memory(actions, segs, st)
        fates = self._fates(actions, st)
        d2h_bytes, h2d_bytes = self._place_storages(actions, plan, fates, st)
        f_ms, b_ms = self._rerun_memory(ct, costs, segs, sels, st)
        peak = self._peak(st)
        if peak_limit is not None and peak > peak_limit:
            return None
        if step_limit is not None and (peak < step_limit_peak or not ct.monotone):
            step_limit = None  # a negative time: the clock may run back, so no bound holds before the end
        if step_limit is not None and step_limit_peak > self.base and busy - step_limit > _ROUNDING * busy:
            return None  # NOTE [ Compute bound ], once the peak is known to reach ``step_limit_peak``

        t, fstall, copy_done = self._forward(f_ms, st)
        forward_ms = t
        if step_limit is not None:  # NOTE [ Compute bound ]: the forward as it ran, then the rest's compute
            at_least = t + (busy - fwd_busy)
            if at_least - step_limit > _ROUNDING * at_least:
                return None
        half = self.half
        if self.loss_saved is not None:
            t = t + 2 * half
        else:
            t += half
            t += half
        bwd_start_ms = t
        if step_limit is not None and t > step_limit:
            return None
        backward = self._backward(actions, ct, b_ms, t, step_limit, copy_done, st)
        if backward is None:
            return None
        t, recompute_ms, bstall = backward
        fs = sum(fstall)
        bs = sum(bstall)
        return (t, peak, forward_ms, t - bwd_start_ms, recompute_ms, fs + bs, tuple(fstall), tuple(bstall), d2h_bytes,
                h2d_bytes)  # fmt: skip

    def _segments(self, acts: Sequence[Action]) -> tuple[list[tuple[int, int]], list[int]]:
        """The plan's recompute segments, (first stage, last stage), and its selective stages, in stage order."""
        n = self.n
        modules = self.modules
        segs: list[tuple[int, int]] = []
        sels = [k for k, a in enumerate(acts) if a is _SELECTIVE] if _SELECTIVE in acts else []
        if _RECOMPUTE in acts:  # the runs of recompute stages, found by the list's own search
            i = acts.index(_RECOMPUTE)
            while True:
                j = i + 1
                if modules:  # every recompute stage is a segment of its own (NOTE [ Plan semantics ])
                    segs.append((i, i))
                else:
                    while j < n and acts[j] is _RECOMPUTE:
                        j += 1
                    segs.append((i, j - 1))
                try:
                    i = acts.index(_RECOMPUTE, j)
                except ValueError:
                    break
        return segs, sels

    def _compute_ms(self, ct: _CostTables, segs: list[tuple[int, int]], sels: list[int]) -> tuple[float, float]:
        """NOTE [ Compute bound ]: the plan's compute, ms, and of it the forward's (a bound: any order of the
        additions does)."""
        busy, fwd_busy = ct.busy_ms, ct.fwd_ms
        before = ct.rerun_before
        for i, j in segs:
            busy += before[j + 1] - before[i]
        for k in sels:
            busy += ct.sel_busy[k]
            fwd_busy += self.sel_extra_fwd_ms[k]
        return busy, fwd_busy

    def _segment_memory(self, acts: Sequence[Action], segs: list[tuple[int, int]], st: _Step) -> None:
        """Where each segment ends in program order, and the clone of its in-place first stage's input, bytes."""
        n = self.n
        modules = self.modules
        out = self.out
        fwd_alloc, fwd_after, bwd_end = st.fwd_alloc, st.fwd_after, st.bwd_end
        seg_start, prog_end, made = st.seg_start, st.prog_end, st.made
        for i, j in segs:
            seg_start[j] = i
            if j > i:
                prog_end[i:j] = [j] * (j - i)
            if self.inplace[i]:  # NOTE [ In-place at segment boundaries ] (``Simulator._run``)
                src = self.clone_src[i]
                if src is None or not (modules or acts[i - 1] is _KEEP or acts[i - 1] is _SELECTIVE):
                    continue
                size = out[i - 1]
                if j > i:  # cloned in forward, freed after the next stage; cloned again by the re-run
                    fwd_alloc[i] += size
                    fwd_after[i + 1] -= size
                    made[j] += size
                    bwd_end[i] -= size
                elif j + 1 < n and acts[j + 1] in _HOLDS and j + 1 in self.saved_by_sets[src]:
                    fwd_alloc[i] += size
                    bwd_end[i] -= size

    def _fates(self, acts: Sequence[Action], st: _Step) -> list[_Fate]:
        """NOTE [ Plan semantics ] for every storage a stage makes: the fates of those kept or offloaded, in storage
        order; one nobody keeps is freed after its last forward reader and re-made by a segment that saves it, its
        bytes entered here."""
        n = self.n
        modules = self.modules
        fwd_after, bwd_end, prog_end, made = st.fwd_after, st.bwd_end, st.prog_end, st.made
        final_out = self.final_out
        fates: list[_Fate] = []
        own_fates = cast("list[tuple[_Fate, _Fate]]", self.own_fates)  # set for every storage of shape _OWN
        for sid, p, savers, readers, last, nbytes, shape in self.storages:
            if shape is _OWN:  # one saver, no stage takes it as input: its saver's action decides
                r = savers[0]
                a = acts[r]
                if a is _KEEP:
                    fates.append(own_fates[sid][0])
                elif a is _OFFLOAD:
                    fates.append(own_fates[sid][1])
                else:
                    if sid != final_out:
                        fwd_after[last] -= nbytes
                    if a is _RECOMPUTE:
                        made[prog_end[r]] += nbytes
                        bwd_end[r] -= nbytes
                continue
            keep, pack, need, release = False, n, -1, n
            if shape is _SAVED_BY_READERS:  # a chain's: every stage that takes it as input saves it
                for i in savers:
                    a = acts[i]
                    if a is _OFFLOAD:
                        if i < pack:
                            pack = i
                        j = i
                    elif a is _RECOMPUTE:
                        b = acts[i - 1]
                        if b is _RECOMPUTE:
                            continue  # inside a segment: only its first stage's input is saved
                        j = prog_end[i]
                        if b is _OFFLOAD:
                            if i < pack:
                                pack = i
                        else:
                            keep = True
                    else:  # keep, or selective, which holds its input as keep does
                        keep = True
                        j = i
                    if j > need:
                        need = j
                    if i < release:
                        release = i
            else:
                for r in savers:
                    a = acts[r]
                    if a is _KEEP:
                        keep = True
                    elif a is _OFFLOAD:
                        if r < pack:
                            pack = r
                    else:
                        continue
                    if r > need:
                        need = r
                    if r < release:
                        release = r
                for i in readers:
                    a = acts[i]
                    if a is _RECOMPUTE:
                        if modules:
                            keep = True
                            j = i
                        elif acts[i - 1] is _RECOMPUTE:
                            continue  # inside a segment: only its first stage's input is saved
                        else:
                            j = prog_end[i]
                            if acts[i - 1] is _OFFLOAD:
                                if i < pack:
                                    pack = i
                            else:
                                keep = True
                    elif a is _SELECTIVE:
                        keep = True
                        j = i
                    else:
                        continue
                    if j > need:
                        need = j
                    if i < release:
                        release = i
            if need < 0:  # nobody keeps it
                if sid != final_out:
                    fwd_after[last] -= nbytes
                in_seg = [r for r in savers if acts[r] is _RECOMPUTE]
                if in_seg:
                    seg = prog_end[in_seg[0]] if len(in_seg) == 1 else max([prog_end[r] for r in in_seg])
                    made[seg] += nbytes
                    bwd_end[min(in_seg)] -= nbytes
            else:
                fates.append((sid, p, savers, last, nbytes, keep, pack, need, release))
        return fates

    def _place_storages(self, acts: Sequence[Action], plan: Plan, fates: list[_Fate], st: _Step) -> tuple[int, int]:
        """Where each storage that is kept or offloaded (``fates``) is copied, waited for, freed, fetched and re-made,
        in storage order, the order its copies queue in; the bytes copied to the host and back."""
        n = self.n
        layer = plan.sync == "layer"
        delay = plan.sync_delay
        lookahead = plan.stage_lookaheads()
        fwd_after, bwd_fetch, bwd_end, prog_end, made = st.fwd_after, st.bwd_fetch, st.bwd_end, st.prog_end, st.made
        fate, copy_during, copy_after, wait_at = st.fate, st.copy_during, st.copy_after, st.wait_at
        late_at, fetch_at, need_at, fwd_mark, bwd_mark = st.late_at, st.fetch_at, st.need_at, st.fwd_mark, st.bwd_mark
        packs_at_end = self.packs_at_end
        d2h_bytes = h2d_bytes = 0
        last_stage = n - 1
        for sid, p, savers, last, nbytes, keep, pack, need, release in fates:
            fate[sid] = _KEPT if keep else _OFFLOADED
            fetched = False
            if pack < n:  # copied: offloaded, or a wasted copy beside a keep reference
                d2h_bytes += nbytes
                if p == pack and not packs_at_end[p]:  # NOTE [ Copies during the forward ]
                    lst = copy_during[p]
                    if lst is None:
                        copy_during[p] = [sid]
                    else:
                        lst.append(sid)
                    fwd_mark[p] = True
                else:
                    x = p if p > pack - 1 else pack - 1
                    lst = copy_after[x]
                    if lst is None:
                        copy_after[x] = [sid]
                    else:
                        lst.append(sid)
                    fwd_mark[x] = True
                # NOTE [ Deferred frees ]: where compute waits for the copy
                if layer:
                    w = prog_end[pack]
                else:
                    due = pack + delay
                    w = prog_end[due] if due < n else -1
                if w < 0:  # never waited for in forward: its backward uses it in place once copied
                    lst = late_at[need]
                    if lst is None:
                        late_at[need] = [sid]
                    else:
                        lst.append(sid)
                    bwd_mark[need] = True
                else:
                    lst = wait_at[w]
                    if lst is None:
                        wait_at[w] = [sid]
                    else:
                        lst.append(sid)
                    fwd_mark[w] = True
                    if not keep:
                        fwd_after[w if w > last else last] -= nbytes
                        fetched = True
            bwd_end[release] -= nbytes
            if not keep:
                if fetched:  # NOTE [ Prefetch lookahead ]
                    x = need + lookahead[need]
                    if x > last_stage:
                        x = last_stage
                    queued = fetch_at[x]
                    if queued is None:
                        fetch_at[x] = [(need, sid)]
                    else:
                        queued.append((need, sid))
                    bwd_fetch[x] += nbytes
                    bwd_mark[x] = True
                    h2d_bytes += nbytes
                lst = need_at[need]
                if lst is None:
                    need_at[need] = [sid]
                else:
                    lst.append(sid)
                bwd_mark[need] = True
            if acts[p] is _RECOMPUTE:  # NOTE [ Re-made copies ]
                seg = prog_end[p]
                inside = [r for r in savers if acts[r] is _RECOMPUTE and prog_end[r] == seg]
                if inside:
                    made[seg] += nbytes
                    bwd_end[min(inside)] -= nbytes
        for sid, p, savers in self.outside:
            fate[sid] = _KEPT
            if acts[p] is _RECOMPUTE:  # NOTE [ Re-made copies ]
                seg = prog_end[p]
                inside = [r for r in savers if acts[r] is _RECOMPUTE and prog_end[r] == seg]
                if inside:
                    made[seg] += self.s_bytes[sid]
                    bwd_end[min(inside)] -= self.s_bytes[sid]
        return d2h_bytes, h2d_bytes

    def _rerun_memory(
        self, ct: _CostTables, costs: Costs, segs: list[tuple[int, int]], sels: list[int], st: _Step
    ) -> tuple[list[float], list[float]]:
        """The re-runs' and selective stages' bytes; each stage's forward and backward time under the plan, ms."""
        fwd, bwd, _, ws_b = costs
        out, rest = self.out, self.rest_floor  # the transient holds at least this of a gradient's storage
        fwd_after, bwd_fetch, bwd_start, bwd_end = st.fwd_after, st.bwd_fetch, st.bwd_start, st.bwd_end
        made, bwd_mark = st.made, st.bwd_mark
        for i, j in segs:
            transient = out[i] if i == j else max(out[i : j + 1])
            bwd_fetch[j] += made[j] + transient
            bwd_start[j] -= transient
            bwd_mark[j] = True
            if i == j:  # NOTE [ Recompute priced as measured ]
                extra = self.rec_ws[j] - made[j] - max(ws_b[j], rest[j])
                if extra > 0:
                    bwd_start[j] += extra
                    bwd_end[j] -= extra
        f_ms, b_ms = fwd, bwd
        if sels:  # NOTE [ Selective stages ]
            f_ms, b_ms = fwd.copy(), bwd.copy()
            for k in sels:
                f_ms[k] = ct.fwd_sel[k]
                b_ms[k] = ct.bwd_sel[k]
                keep_k = self.sel_keep[k]
                fwd_after[k] += keep_k
                extra = self.sel_ws[k] - max(ws_b[k], rest[k])
                if extra > 0:
                    bwd_start[k] += extra
                    bwd_end[k] -= extra
                bwd_end[k] -= keep_k
                bwd_mark[k] = True
        return f_ms, b_ms

    def _peak(self, st: _Step) -> int:
        """The step's peak, bytes: the largest running sum of the memory groups in program order, the loss's between
        the forward's and the backward's (NOTE [ Fast path ], NOTE [ Loss memory ])."""
        n = self.n
        final_out = self.final_out
        out_dies = self.s_bytes[final_out] if final_out is not None and st.fate[final_out] == _NONE else 0
        if self.loss_saved is not None:
            saved, transient = self.loss_saved, self.loss_transient
            loss = (saved, self.held - out_dies + transient + self.loss_grad, -transient - saved)
        else:
            f32, cast = self.f32, self.cast
            loss = (cast + f32, 2 * f32 - cast - out_dies, self.cast_back - 2 * f32 - cast)
        fwd_seq = [0] * (2 * n)
        fwd_seq[::2] = st.fwd_alloc
        fwd_seq[1::2] = st.fwd_after
        bwd_seq = [0] * (3 * n)
        bwd_seq[::3] = st.bwd_fetch[::-1]
        bwd_seq[1::3] = st.bwd_start[::-1]
        bwd_seq[2::3] = st.bwd_end[::-1]
        return max(accumulate(chain(fwd_seq, loss, bwd_seq), initial=self.base))

    def _forward(self, f_ms: list[float], st: _Step) -> tuple[float, list[float], list[float]]:
        """The forward's clock: its end, ms; each stage's stall, ms; when each storage's copy to the host is done,
        ms (0 where none)."""
        n = self.n
        s_d2h = self.s_d2h
        fwd_mark, copy_during, copy_after, wait_at = st.fwd_mark, st.copy_during, st.copy_after, st.wait_at
        copy_done = [0.0] * self.n_storages
        fstall = [0.0] * n
        t = 0.0
        d2h_free = 0.0
        for k in range(n):
            t_start = t
            t += f_ms[k]
            if fwd_mark[k]:
                lst = copy_during[k]
                if lst is not None:  # NOTE [ Copies during the forward ]
                    for sid in lst:
                        d2h_free = (d2h_free if d2h_free > t_start else t_start) + s_d2h[sid]
                        copy_done[sid] = d2h_free if d2h_free > t else t
                lst = copy_after[k]
                if lst is not None:
                    for sid in lst:
                        d2h_free = (d2h_free if d2h_free > t else t) + s_d2h[sid]
                        copy_done[sid] = d2h_free
                lst = wait_at[k]
                if lst is not None:
                    wait = copy_done[lst[0]] if len(lst) == 1 else max([copy_done[sid] for sid in lst])
                    if wait > t:
                        fstall[k] = wait - t
                        t = wait
        return t, fstall, copy_done

    def _backward(
        self,
        acts: Sequence[Action],
        ct: _CostTables,
        b_ms: list[float],
        t: float,
        step_limit: float | None,
        copy_done: list[float],
        st: _Step,
    ) -> tuple[float, float, list[float]] | None:
        """The backward's clock from ``t``, ms: the step's end, the re-runs' time and each stage's stall, ms; None as
        soon as the clock passes ``step_limit``."""
        n = self.n
        modules = self.modules
        s_h2d = self.s_h2d
        output_storage = self.output_storage
        rerun = ct.rerun
        sel_extra_ms = self.sel_extra_ms
        fate, late_at, fetch_at, need_at = st.fate, st.late_at, st.fetch_at, st.need_at
        seg_start, bwd_mark = st.seg_start, st.bwd_mark
        bstall = [0.0] * n
        ready = [0.0] * self.n_storages
        recompute_ms = 0.0
        h2d_free = 0.0
        for k in range(n - 1, -1, -1):
            if bwd_mark[k]:
                stall = 0.0
                lst = late_at[k]
                if lst is not None:  # used in place: its first unpack waits for its copy
                    for sid in lst:
                        done = copy_done[sid]
                        ready[sid] = done
                        if fate[sid] == _KEPT and done > t:
                            stall += done - t
                            t = done
                fetch = fetch_at[k]
                if fetch is not None:  # NOTE [ Prefetch lookahead ]: the one needed first goes first
                    if len(fetch) > 1:
                        fetch.sort(key=_NEED, reverse=True)
                    for _, sid in fetch:
                        h = t if t > h2d_free else h2d_free
                        done = copy_done[sid]
                        h2d_free = (h if h > done else done) + s_h2d[sid]
                        ready[sid] = h2d_free
                i = seg_start[k]
                if i >= 0:
                    if i > 0 and not modules:
                        src = output_storage[i - 1]
                        if src is not None and fate[src] == _OFFLOADED and ready[src] > t:
                            stall += ready[src] - t
                            t = ready[src]
                    seg_ms = sum(rerun[i : k + 1])
                    t += seg_ms
                    recompute_ms += seg_ms
                lst = need_at[k]
                if lst is not None:
                    for sid in lst:
                        if ready[sid] > t:
                            stall += ready[sid] - t
                            t = ready[sid]
                if acts[k] is _SELECTIVE:
                    recompute_ms += sel_extra_ms[k]
                bstall[k] = stall
            t += b_ms[k]
            if step_limit is not None and t > step_limit:
                return None
        return t, recompute_ms, bstall


def _shape(savers: tuple[int, ...], readers: list[int], modules: bool) -> str:
    """The case of the fate rule a storage takes (``_OWN``, ``_SAVED_BY_READERS`` or ``_GENERAL``)."""
    if len(savers) == 1 and not readers:
        return _OWN
    if not modules and savers and sorted(set(savers)) == readers:
        return _SAVED_BY_READERS
    return _GENERAL

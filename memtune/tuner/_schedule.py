"""The schedule step of a simulation: what a plan does to each storage, stage by stage, before any time is counted.

``forward_schedule`` says at which forward stage each copy is issued, where compute waits for it, where each storage
is freed, and which segment inputs are cloned (bytes); ``backward_schedule`` says where each offloaded storage is
prefetched, needed and released, and what each recompute segment re-makes. ``memtune.tuner.simulator`` runs the
forward and backward steps over these tables; they hold stage indices, storage ids and bytes, no times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from memtune.tuner._spatial import SplitPricing
from memtune.tuner._storage_tables import StorageTables
from memtune.tuner.plan import Action, Plan, StorageFate, segments

__all__ = ["BackwardSchedule", "ForwardSchedule", "StepState", "backward_schedule", "forward_schedule", "remade"]

#: actions that hold the stage's input on the GPU (NOTE [ Plan semantics ])
_HOLDS = (Action.KEEP, Action.SELECTIVE)


@dataclass(slots=True)
class ForwardSchedule:
    """The forward's plan-dependent tables, by stage index (lists of storage ids, or bytes).

    Attributes:
        copy_at: storages to copy, by the stage at whose forward end the copy is issued.
        copy_during: by storage id, whether its copy is issued while its producing stage computes (NOTE [ Copies
            during the forward ]).
        wait_at: copies compute waits for, by the stage at whose end it waits (the runtime's end_stage, which for a
            recompute segment runs after the whole segment).
        free_at_sync: offloaded storages to free, by stage.
        late_wait_at: copies never waited for in forward, by the backward stage whose first unpack waits for them.
        drop_at: storages no one keeps, freed at the end of their last forward reader.
        sync_points: under ``points`` sync, the sorted sync points; else empty.
        clone / clone_fwd_free / clone_bwd_free: bytes of a segment input's clone made at a stage's forward, freed at
            a stage's forward end, freed at a stage's backward end (NOTE [ In-place at segment boundaries ]).
        reclone: bytes the re-run clones again, by segment end.
    """

    copy_at: list[list[int]]
    copy_during: list[bool]
    wait_at: list[list[int]]
    free_at_sync: list[list[int]]
    late_wait_at: list[list[int]]
    drop_at: list[list[int]]
    sync_points: list[int]
    clone: list[int]
    clone_fwd_free: list[int]
    clone_bwd_free: list[int]
    reclone: dict[int, int]


@dataclass(slots=True)
class BackwardSchedule:
    """The backward's plan-dependent tables, by stage index (lists of storage ids).

    Attributes:
        seg_end: each recompute segment's first stage, by its last.
        prefetch_at / need_at / release_at: offloaded storages by the backward stage that prefetches, first needs and
            releases them (kept storages and re-made ones are released too).
        local: under ``inline`` sync, storages fetched within the stage that uses them (NOTE [ Inline fetches ]).
        fetched: the stages whose measured inline transient stands for their backward.
        remat_at / copy_at_seg / copy_release_at: what the segments re-make (``remade``).
    """

    seg_end: dict[int, int]
    prefetch_at: list[list[int]]
    need_at: list[list[int]]
    release_at: list[list[int]]
    local: set[int]
    fetched: set[int]
    remat_at: dict[int, list[int]]
    copy_at_seg: dict[int, list[int]]
    copy_release_at: list[list[int]]


@dataclass(slots=True)
class StepState:
    """One simulation's state between its steps (``Simulator._run`` in ``memtune.tuner.simulator``): what the schedule
    step made, then the clock, stalls (ms) and counters (bytes) the forward and backward steps advance."""

    n: int
    tab: StorageTables
    fates: Sequence[StorageFate]
    split: SplitPricing | None
    inline: bool
    sync: str
    costs: tuple[list[float], list[float], list[int], list[int]]  # forward ms, backward ms, their transients, bytes
    s_bytes: Sequence[int]
    c_bytes: Sequence[int]
    selective: list[bool]
    fs: ForwardSchedule
    bs: BackwardSchedule
    t: float = 0.0
    forward_ms: float = 0.0
    bwd_start: float = 0.0
    recompute_ms: float = 0.0
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    copy_done: list[float] = field(init=False)  # by storage: when its device-to-host copy is done, ms
    freed: list[bool] = field(init=False)  # by storage: freed in forward after its copy (NOTE [ Deferred frees ])
    ready: list[float] = field(init=False)  # by storage: when it is back on the GPU in backward, ms
    fstall: list[float] = field(init=False)
    bstall: list[float] = field(init=False)
    local_max: list[int] = field(init=False)  # NOTE [ Inline fetches ]: the largest storage fetched within a stage
    rec_made: dict[int, int] = field(init=False)  # one-stage recompute segments' re-made bytes, by stage

    def __post_init__(self) -> None:
        self.copy_done = [0.0] * len(self.s_bytes)
        self.freed = [False] * len(self.s_bytes)
        self.ready = [0.0] * len(self.s_bytes)
        self.fstall = [0.0] * self.n
        self.bstall = [0.0] * self.n
        self.local_max = [0] * self.n
        self.rec_made = {}


def _clones(
    tab: StorageTables, actions: Sequence[Action], split: SplitPricing | None, out: Sequence[int], prog_end: list[int]
) -> tuple[list[int], list[int], list[int], dict[int, int]]:
    """Segment inputs cloned in place, bytes: ``(clone, clone_fwd_free, clone_bwd_free, reclone)``; sets each segment
    stage's ``prog_end`` to the segment's last stage."""
    n = len(out)
    # NOTE [ In-place at segment boundaries ] (memtune.tuner.runtime._segments): a segment whose first stage writes
    # its input in place runs on a clone of it; the storage table counts the two as one. Where the input is kept,
    # the clone is a second tensor: made at stage i's forward (``clone``), freed at the end of stage i+1's forward
    # when the segment goes on (``clone_fwd_free``), else kept by the next stage until stage i's backward
    # (``clone_bwd_free``); inside a longer segment the re-run clones again (``reclone``, by segment end)
    clone = [0] * n
    clone_fwd_free = [0] * n
    clone_bwd_free = [0] * n
    reclone: dict[int, int] = {}
    modules = tab.profile.modules
    for i, j in segments(actions, one_stage=modules):
        for r in range(i, j + 1):
            prog_end[r] = j
        if split is not None and j in split.cost:  # NOTE [ Spatial splitting ]: strips clone only a strip
            continue
        if modules:  # a module stage's checkpoint keeps every input (NOTE [ Plan semantics ])
            src = tab.inputs[i][0] if tab.inputs[i] else None
        else:
            src = tab.output_storage[i - 1] if i > 0 and actions[i - 1] in _HOLDS else None
        if src is None or not tab.profile.stages[i].inplace:
            continue
        if j > i:
            clone[i] = clone_fwd_free[i + 1] = out[i - 1]
            reclone[j] = out[i - 1]
            clone_bwd_free[i] = out[i - 1]
        elif j + 1 < n and actions[j + 1] in _HOLDS and j + 1 in tab.s_saved_by[src]:
            clone[i] = clone_bwd_free[i] = out[i - 1]
    return clone, clone_fwd_free, clone_bwd_free, reclone


def forward_schedule(
    tab: StorageTables,
    actions: Sequence[Action],
    fates: Sequence[StorageFate],
    plan: Plan,
    split: SplitPricing | None,
    out: Sequence[int],
) -> ForwardSchedule:
    """The forward's tables under ``plan`` (``out``: each stage's output bytes)."""
    n = len(out)
    sync = plan.sync
    inline = sync == "inline"
    s_last = tab.s_last_use
    copy_at: list[list[int]] = [[] for _ in range(n)]
    wait_at: list[list[int]] = [[] for _ in range(n)]
    free_at_sync: list[list[int]] = [[] for _ in range(n)]
    late_wait_at: list[list[int]] = [[] for _ in range(n)]
    drop_at: list[list[int]] = [[] for _ in range(n)]
    sync_points = sorted(plan.sync_points) if sync == "points" else []
    prog_end = list(range(n))
    clone, clone_fwd_free, clone_bwd_free, reclone = _clones(tab, actions, split, out, prog_end)
    # the model's output is read by the loss, which frees it (NOTE [ Loss memory ])
    final_out = tab.output_storage[n - 1]
    copy_during = [False] * len(tab.s_bytes)
    for sid, f in enumerate(fates):
        p = tab.s_producer[sid]
        if p < 0:
            continue
        if f.copied:
            copy_at[max(p, f.copy_stage - 1)].append(sid)
            copy_during[sid] = p == f.copy_stage and not tab.packs_at_end[p]
        if f.fate == "none" and sid != final_out:
            drop_at[s_last[sid]].append(sid)
            continue
        if not f.copied:
            continue
        # NOTE [ Deferred frees ]: where compute waits for the copy (a stream wait, never the host)
        w: int | None
        if inline:
            w = max(s_last[sid], max(p, f.copy_stage - 1))
        elif sync == "layer":
            w = prog_end[f.copy_stage]
        elif sync == "deferred":
            due = f.copy_stage + plan.sync_delay
            w = prog_end[due] if due < n else None
        else:  # points: the first sync point at or after the pack
            q = next((q for q in sync_points if q >= f.copy_stage), None)
            w = prog_end[q] if q is not None else None
        if w is None:
            # never waited for in forward: stays resident, backward uses it in place after waiting
            late_wait_at[f.need].append(sid)
            continue
        wait_at[w].append(sid)
        if f.fate == "offload":
            free_at_sync[max(w, s_last[sid])].append(sid)
    return ForwardSchedule(
        copy_at=copy_at,
        copy_during=copy_during,
        wait_at=wait_at,
        free_at_sync=free_at_sync,
        late_wait_at=late_wait_at,
        drop_at=drop_at,
        sync_points=sync_points,
        clone=clone,
        clone_fwd_free=clone_fwd_free,
        clone_bwd_free=clone_bwd_free,
        reclone=reclone,
    )


def backward_schedule(
    tab: StorageTables,
    actions: Sequence[Action],
    fates: Sequence[StorageFate],
    plan: Plan,
    split: SplitPricing | None,
    fetched: set[int],
) -> BackwardSchedule:
    """The backward's tables under ``plan``; ``fetched``: under ``inline`` sync the stages whose measured inline
    transient stands for their backward (``Simulator._inline_stages``), else empty."""
    n = len(tab.inputs)
    inline = plan.sync == "inline"
    lookahead = plan.stage_lookaheads()  # NOTE [ Prefetch lookahead ]: by need stage; 0 under inline
    seg_end = {j: i for i, j in segments(actions, one_stage=tab.profile.modules)}
    prefetch_at: list[list[int]] = [[] for _ in range(n)]
    release_at: list[list[int]] = [[] for _ in range(n)]
    need_at: list[list[int]] = [[] for _ in range(n)]
    # NOTE [ Inline fetches ] (``_inline_stages``)
    local: set[int] = set()
    lift = split.lift if split is not None else range(n)  # NOTE [ Spatial splitting ]: the node's prefetches
    for sid, f in enumerate(fates):
        if tab.s_producer[sid] < 0:
            continue
        if f.fate == "offload":
            prefetch_at[lift[min(n - 1, f.need + lookahead[f.need])]].append(sid)
            need_at[f.need].append(sid)
            release_at[f.release].append(sid)
            if inline and (f.need == f.release or all(r in fetched for r in tab.s_saved_by[sid])):
                local.add(sid)
        elif f.fate == "keep":
            release_at[f.release].append(sid)
    for queued in prefetch_at:  # NOTE [ Prefetch lookahead ]: issued together, the one needed first goes first
        if len(queued) > 1:
            queued.sort(key=lambda sid: -fates[sid].need)
    remat_at, copy_at_seg, copy_release_at = remade(tab, fates, seg_end, release_at)
    return BackwardSchedule(
        seg_end, prefetch_at, need_at, release_at, local, fetched, remat_at, copy_at_seg, copy_release_at
    )


def remade(
    tab: StorageTables, fates: Sequence[StorageFate], seg_end: dict[int, int], release_at: list[list[int]]
) -> tuple[dict[int, list[int]], dict[int, list[int]], list[list[int]]]:
    """What the recompute segments re-make in backward: storages nobody keeps, by the segment end whose re-run makes
    them (their release is added to ``release_at``); and the second copies of kept or offloaded storages a re-run
    makes for its own stages (NOTE [ Re-made copies ]), by segment end, with the backward stage whose end frees
    them. Returns ``(remat_at, copy_at_seg, copy_release_at)``."""
    n = len(release_at)
    remat_at: dict[int, list[int]] = {}
    copy_at_seg: dict[int, list[int]] = {}
    copy_release_at: list[list[int]] = [[] for _ in range(n)]
    if not seg_end:
        return remat_at, copy_at_seg, copy_release_at
    seg_of = [-1] * n
    for j, i in seg_end.items():
        for r in range(i, j + 1):
            seg_of[r] = j
    for sid, f in enumerate(fates):
        if f.fate != "none" or tab.s_producer[sid] < 0:
            continue
        savers = [r for r in tab.s_saved_by[sid] if seg_of[r] >= 0]
        if savers:
            remat_at.setdefault(max(seg_of[r] for r in savers), []).append(sid)
            release_at[min(savers)].append(sid)
    # NOTE [ Re-made copies ]
    for sid, f in enumerate(fates):
        p = tab.s_producer[sid]
        if f.fate == "none" or p < 0 or seg_of[p] < 0:
            continue
        inside = [r for r in tab.s_saved_by[sid] if seg_of[r] == seg_of[p]]
        if inside:
            copy_at_seg.setdefault(seg_of[p], []).append(sid)
            copy_release_at[min(inside)].append(sid)
    return remat_at, copy_at_seg, copy_release_at

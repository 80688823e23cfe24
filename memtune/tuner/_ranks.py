"""Data-parallel plans on several GPUs of one host: N ranks run one plan each, their copies share the host link.

# NOTE [ Shared host link ]
N data-parallel ranks (DDP, one process per GPU) each run the same plan on their share of the batch. Their
offload and prefetch copies go through one host link, and their gradients are summed by a ring all-reduce.
``simulate_ranks`` prices one step so, on top of the single-GPU simulator (``memtune.tuner.simulator``), by these rules:

* Rates. While c ranks copy one way at once, each gets ``SharedLink.gbps(direction, c)`` (``memtune.tuner._link``): the
GPU
  type's measured table (calibration field ``shared_link_gbps``, ``python -m benchmarks.shared_link``), else one
  GPU's rate shared fairly (1/c each); the result says which (``link_source``). A copy's time is the profile's
  (one GPU alone) times the slowdown r(1) / r(c); each direction is priced on its own (two copy engines; the
  both-ways rows are kept in the table, not used).
* Lockstep. The all-reduce ends every step on every rank, so all ranks start a step together and, with no stagger,
  run the same timeline: every copy has all N ranks copying beside it, and the step is the single-GPU simulation
  with every copy N-contended. One rank is exactly the single-GPU simulator.
* Stagger (the multi-GPU vDNN paper's schedule, Kim and Lee, "Efficient Multi-GPU Memory Management for Deep
  Learning Acceleration", §III.A: GPU i swaps layers i % x + j x, so that fewer GPUs swap at each layer). Rank i
  takes slot i % S of S slots, so at most x = ceil(N / S) ranks are in one slot. A rank in slot s starts each burst
  of copies (the copies one forward stage packs; the prefetches one backward stage issues) s burst-times late, a
  burst-time being the burst's bytes at the x-contended rate: it lets the s slots before it copy that burst first.
  The runtime does exactly this (``memtune.tuner.runtime._stagger``: a wait on the copy stream before the burst), and
  waits never change the math. The model folds the wait into the copy time of the burst's stage (the simulator's copy
  engines run in order, so a wait before a burst ends it as much later) and counts link use only after the wait.
* Contention with stagger. Slots no longer copy at the same moments, so the copiers beside a copy vary in time.
  Per slot, the model simulates one rank, lays the slots' copy windows side by side, and takes each stage's
  slowdown as its windows' length over the copy work done in them (the rate integrated over the windows, c(t) =
  the ranks whose windows cover t); it repeats with the new slowdowns (damped, until they move < 1e-4) from the
  x-contended start. The step is the slowest slot's.
* All-reduce. Gradients are summed by NCCL's ring all-reduce: 2 (N - 1) / N of a bucket's bytes at the GPU type's
  bus bandwidth (calibration field ``allreduce_gbps`` by ranks, or given). As DDP does, parameters are packed in
  buckets in backward order (the first capped at 1 MiB, the rest at 25 MiB; a stage's parameters are not split) and
  a bucket's all-reduce starts when every rank's backward has made its last gradient and the one before it is
  done; it overlaps the rest of the backward. Simplifications: the all-reduce takes no compute time and does not
  use the host link (NVLink; on a PCIe-only host it would share it), and the optimizer's step after it is not
  priced (as on one GPU).
* Memory. A rank's peak is the single-GPU peak plus DDP's gradient buckets (one more copy of the gradients for the
  whole run, ``gradient_as_bucket_view=False``); waits and slowdowns move no allocation (frees are at fixed program
  points, NOTE [ Deferred frees ] in ``memtune.tuner.simulator``). NCCL's own buffers are outside the caching allocator
  and the budget.
* Swap-in triggers (the paper's §III.C). ``ranks_prefetch_trigger`` runs the per-layer trigger search
  (NOTE [ Per-layer prefetch trigger ] in ``memtune.tuner._prefetch_trigger``) on the slowest slot's contended copy
  times: each stage's prefetch as late as adds no delay at the rate it really gets.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from memtune.profiler import Profile
from memtune.tuner._copy_costs import storage_copy_ms
from memtune.tuner._link import Direction, LinkSource, SharedLink, ring_allreduce_ms
from memtune.tuner._prefetch_trigger import PrefetchTrigger, prefetch_trigger
from memtune.tuner._tuner_errors import CalibrationError, TunerError
from memtune.tuner.calibration import Calibration, calibration_for
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import SimResult, Simulator

__all__ = [
    "DDP_BUCKET_BYTES",
    "DDP_FIRST_BUCKET_BYTES",
    "RankSlot",
    "RanksResult",
    "Stagger",
    "ranks_prefetch_trigger",
    "simulate_ranks",
    "stagger_for",
]

DDP_BUCKET_BYTES = 25 << 20  # DistributedDataParallel's bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 1 << 20  # its first bucket's cap
_DIRECTIONS: tuple[Direction, ...] = ("d2h", "h2d")
_TOLERANCE = 1e-4  # relative change of every slowdown at which the contention iteration stops
_MAX_ROUNDS = 60


@dataclass(frozen=True)
class Stagger:
    """One rank's place in the stagger schedule (NOTE [ Shared host link ]); the runtime's delays come from it.

    Attributes:
        rank / ranks: this rank and how many there are.
        slot / slots: this rank's slot (rank % slots) and how many slots; 1 slot is no stagger.
        copiers: the most ranks in one slot, x = ceil(ranks / slots): how many copy at once when slots do not overlap.
        d2h_gbps / h2d_gbps: GB/s each of ``copiers`` ranks gets copying at once, each way.
    """

    rank: int
    ranks: int
    slot: int
    slots: int
    copiers: int
    d2h_gbps: float
    h2d_gbps: float

    def delay_ms(self, direction: Direction, nbytes: int) -> float:
        """ms this rank waits before a burst of ``nbytes`` copied ``direction``: ``slot`` burst-times at the
        ``copiers``-contended rate (0 in slot 0)."""
        rate = self.d2h_gbps if direction == "d2h" else self.h2d_gbps
        return self.slot * max(0, nbytes) / (rate * 1e6)


def stagger_for(rank: int, ranks: int, slots: int, link: SharedLink) -> Stagger:
    """Rank ``rank``'s stagger among ``ranks`` in ``slots`` slots, with ``link``'s rates.

    Raises:
        ValueError: ``ranks`` < 1, ``rank`` outside 0..ranks-1, or ``slots`` outside 1..ranks.
    """
    if ranks < 1 or not 0 <= rank < ranks:
        raise ValueError(f"rank must be in 0..{ranks - 1} of {ranks} ranks, got {rank}")
    if not 1 <= slots <= ranks:
        raise ValueError(f"stagger slots must be in 1..{ranks} (the ranks), got {slots}; 1 is no stagger")
    copiers = math.ceil(ranks / slots)
    return Stagger(rank, ranks, rank % slots, slots, copiers, link.gbps("d2h", copiers), link.gbps("h2d", copiers))


@dataclass(frozen=True)
class RankSlot:
    """One slot's ranks (they run in lockstep): their simulated step and what sharing the link cost them.

    Attributes:
        slot / ranks: the slot and how many ranks are in it.
        result: one of its ranks simulated with contended copy times and its stagger waits (with spans).
        slowdown_d2h / slowdown_h2d: copy time over alone, weighted by copy time, each way (1: never shared).
        mean_copiers: ranks copying the same way during its copies, time-weighted (1: alone).
        contention_ms: copy time lost to sharing the link: contended minus alone, summed over its copies, ms.
        wait_ms: the stagger waits it adds before its bursts, summed, ms.
        profile: the profile it was simulated on: copy times contended and waits folded in.
    """

    slot: int
    ranks: int
    result: SimResult
    slowdown_d2h: float
    slowdown_h2d: float
    mean_copiers: float
    contention_ms: float
    wait_ms: float
    profile: Profile = field(repr=False)


@dataclass(frozen=True)
class RanksResult:
    """One data-parallel step of ``ranks`` ranks on one host (NOTE [ Shared host link ]). Times ms, sizes bytes.

    Attributes:
        ranks / stagger_slots: ranks and stagger slots (1: no stagger).
        link_source: ``measured`` (the calibration's table) or ``fair share`` (one GPU's rate split evenly).
        allreduce_gbps: the all-reduce bus bandwidth used (GB/s), None for one rank.
        step_ms: the step: the slowest slot's, or the all-reduce's end when that is later.
        compute_ms: the slowest slot's simulated step (forward, loss, backward with its copies).
        allreduce_ms: the all-reduce's busy time; allreduce_exposed_ms: what of it is past ``compute_ms``.
        peak_bytes: a rank's peak: the simulated peak plus ``bucket_bytes`` (DDP's gradient buckets).
        mean_copiers / contention_ms: over all ranks, as ``RankSlot`` has them per slot.
        slots: per slot, its ranks' step.
        rounds: contention iterations run.
    """

    ranks: int
    stagger_slots: int
    link_source: LinkSource
    allreduce_gbps: float | None
    step_ms: float
    compute_ms: float
    allreduce_ms: float
    allreduce_exposed_ms: float
    peak_bytes: int
    bucket_bytes: int
    mean_copiers: float
    contention_ms: float
    slots: tuple[RankSlot, ...]
    rounds: int

    def samples_per_s(self, batch_per_rank: int) -> float:
        """Samples per second of all ranks together, each running ``batch_per_rank``."""
        return self.ranks * batch_per_rank / (self.step_ms / 1e3) if self.step_ms > 0 else 0.0

    def fits(self, budget_bytes: int) -> bool:
        """True when a rank's peak (DDP's buckets included) is within ``budget_bytes``."""
        return self.peak_bytes <= budget_bytes


class _Copies:
    """The profile's copies by owning stage (its storages' first saver, as ``storage_copy_ms`` prices them)."""

    def __init__(self, profile: Profile) -> None:
        n = profile.n_stages
        d2h, h2d = storage_copy_ms(profile)
        self.ms: dict[Direction, list[float]] = {"d2h": [0.0] * n, "h2d": [0.0] * n}
        self.bytes = [0] * n
        for sid, s in enumerate(profile.storages):
            if s.saved_by:
                k = min(s.saved_by)
                self.ms["d2h"][k] += d2h[sid]
                self.ms["h2d"][k] += h2d[sid]
                self.bytes[k] += s.bytes

    def profile_with(
        self, profile: Profile, slowdown: dict[Direction, list[float]], wait: dict[Direction, list[float]]
    ) -> Profile:
        """``profile`` with each stage's copies ``slowdown`` times as long plus ``wait`` ms (shared by bytes)."""
        if all(f == 1.0 for d in _DIRECTIONS for f in slowdown[d]) and not any(w for d in _DIRECTIONS for w in wait[d]):
            return profile  # alone and unstaggered: the profile itself, bit for bit
        stages = []
        for k, st in enumerate(profile.stages):
            if self.bytes[k] <= 0:
                stages.append(st)
                continue
            update = {f"{d}_ms": self.ms[d][k] * slowdown[d][k] + wait[d][k] for d in _DIRECTIONS}
            stages.append(st.model_copy(update={**update, "saved_bytes": self.bytes[k]}))
        return profile.model_copy(update={"stages": tuple(stages)})


def _link_for(profile: Profile, link: SharedLink | None, calibration: Calibration) -> SharedLink:
    """The given link, else the calibration's measured table, else one GPU's profile rates shared fairly."""
    if link is not None:
        return link
    measured = calibration.shared_link
    if measured is not None:
        return measured
    return SharedLink.fair_share(profile.device.d2h_gbps, profile.device.h2d_gbps)


def _allreduce_rate(profile: Profile, ranks: int, given: float | None, calibration: Calibration) -> float | None:
    if ranks == 1:
        return None
    if given is not None:
        if not given > 0:
            raise ValueError(f"allreduce_gbps must be > 0 (NCCL bus GB/s), got {given}")
        return given
    rate = calibration.allreduce_gbps(ranks)
    if rate is None:
        raise CalibrationError(
            f"no all-reduce rate for {ranks} ranks of GPU type {profile.device.key!r} (calibration field "
            f"'allreduce_gbps.{ranks}'): pass allreduce_gbps, or run `python -m benchmarks.shared_link OUT "
            f"--merge-into CALIBRATION.json` on a host with {ranks} such GPUs",
            field=f"allreduce_gbps.{ranks}",
        )
    return rate


_Windows = dict[Direction, list[tuple[int, float, float, float]]]
"""Per direction, a slot's copies as ``(stage, start ms, end ms, alone ms)``: link use after its stagger waits."""


def _windows(
    result: SimResult,
    owners: Sequence[int],
    copies: _Copies,
    slowdown: dict[Direction, list[float]],
    wait: dict[Direction, list[float]],
) -> tuple[_Windows, float]:
    """When a slot's copies use the link (NOTE [ Shared host link ]): each span's wait share moves to the front of
    its run of back-to-back spans (the runtime waits once before a burst), the copies follow it. Also returns the
    waits in all, ms."""
    out: _Windows = {"d2h": [], "h2d": []}
    waited_ms = 0.0
    for d in _DIRECTIONS:
        spans = sorted((a, b, owners[sid]) for kind, sid, a, b in result.spans if kind == d)
        runs: list[tuple[float, list[tuple[int, float, float, float, float]]]] = []  # start, its spans' items
        for a, b, k in spans:
            base = copies.ms[d][k]
            total = base * slowdown[d][k] + wait[d][k]
            share = (b - a) / total if total > 0 else 0.0
            item = (
                k,
                b,
                wait[d][k] * share,
                base * slowdown[d][k] * share,
                base * share,
            )  # stage, end, wait, copy, alone
            if runs and a <= runs[-1][1][-1][1] + 1e-9:  # back to back with the span before: one queue
                runs[-1][1].append(item)
            else:
                runs.append((a, [item]))
        for start, items in runs:  # a run's waits first, then its copies
            waits = sum(i[2] for i in items)
            waited_ms += waits
            t = start + waits
            for k, _, _, copy_ms, alone_ms in items:
                out[d].append((k, t, t + copy_ms, alone_ms))
                t += copy_ms
    return out, waited_ms


def _covered(a: float, b: float, others: Sequence[tuple[int, list[float], list[float]]]) -> list[tuple[float, int]]:
    """[a, b) cut where other slots' windows start or end: ``(ms, ranks of other slots copying)`` per piece.
    ``others``: per other slot, its ranks and its windows' starts and ends (sorted, not overlapping: one engine)."""
    cuts = {a, b}
    hits: list[tuple[int, float, float]] = []
    for n, starts, ends in others:
        i = bisect.bisect_right(ends, a)  # the first window that ends after a
        while i < len(starts) and starts[i] < b:
            x, y = max(starts[i], a), min(ends[i], b)
            if y > x:
                hits.append((n, x, y))
                cuts.update((x, y))
            i += 1
    out = []
    for p, q in itertools.pairwise(sorted(cuts)):
        mid = (p + q) / 2
        out.append((q - p, sum(n for n, x, y in hits if x <= mid < y)))
    return out


@dataclass(frozen=True)
class _Use:
    """What one slot's copies met on the link in one round."""

    slowdown: dict[Direction, list[float]]  # per stage: window length over the copy work done in it
    weighted: dict[Direction, float]  # copy-time-weighted slowdown
    mean_copiers: float
    contention_ms: float


def _link_use(
    windows: Sequence[_Windows], members: Sequence[int], link: SharedLink, old: Sequence[dict[Direction, list[float]]]
) -> list[_Use]:
    """Per slot, the slowdowns its copies' windows imply (NOTE [ Shared host link ]): each piece of a window runs at
    the rate of the ranks copying then (its slot's own and those of other slots whose windows cover it)."""
    out = []
    for s, own in enumerate(windows):
        slowdown = {d: list(old[s][d]) for d in _DIRECTIONS}
        weighted: dict[Direction, float] = {}
        copiers_ms = length_ms = lost_ms = 0.0
        for d in _DIRECTIONS:
            others = [
                (members[o], [w[1] for w in windows[o][d]], [w[2] for w in windows[o][d]])
                for o in range(len(windows))
                if o != s
            ]
            length: dict[int, float] = {}
            work: dict[int, float] = {}
            for k, a, b, alone in own[d]:
                for ms, other in _covered(a, b, others):
                    c = members[s] + other
                    work[k] = work.get(k, 0.0) + ms / link.slowdown(d, c)
                    copiers_ms += c * ms
                length[k] = length.get(k, 0.0) + (b - a)
                length_ms += b - a
                lost_ms += (b - a) - alone
            for k, ms in length.items():
                if work.get(k, 0.0) > 0:
                    slowdown[d][k] = ms / work[k]
            done = sum(work.values())
            weighted[d] = sum(length.values()) / done if done > 0 else 1.0
        mean = copiers_ms / length_ms if length_ms > 0 else 1.0
        out.append(_Use(slowdown, weighted, mean, lost_ms))
    return out


def _owners(sim: Simulator, plan: Plan) -> list[int]:
    """Per storage id of the simulator's spans, the stage that owns its copy time (its first saver; -1: none)."""
    table = sim.profile if plan.sync == "inline" else sim.tables.profile  # inline runs on the unmerged storages
    return [min(s.saved_by) if s.saved_by else -1 for s in table.storages]


def _buckets(profile: Profile, first_cap: int, cap: int) -> list[tuple[int, int]]:
    """DDP's gradient buckets as ``(bytes, stage)``: filled in backward order, a stage's parameters not split, each
    closed once it reaches its cap; ``stage`` is the one whose backward makes its last gradient (NOTE [ Shared
    host link ]). Parameters outside every stage go in the last bucket."""
    out: list[tuple[int, int]] = []
    size = 0
    for k in range(profile.n_stages - 1, -1, -1):
        size += profile.stages[k].param_bytes
        if size and size >= (first_cap if not out else cap):
            out.append((size, k))
            size = 0
    size += profile.outside_param_bytes
    if size:
        out.append((size, 0))
    return out


def _allreduce(
    profile: Profile, results: Sequence[SimResult], ranks: int, bus: float | None, caps: tuple[int, int]
) -> tuple[float, float]:
    """The all-reduce's end and busy time, ms: each bucket starts when every slot's backward has made it and the
    bucket before it is done (NOTE [ Shared host link ])."""
    if bus is None:
        return 0.0, 0.0
    end_all = max(r.step_ms for r in results)
    made = [0.0] * profile.n_stages
    seen = [False] * profile.n_stages
    for r in results:
        for kind, k, _, end in r.spans:
            if kind == "backward":
                made[k] = max(made[k], end)
                seen[k] = True
    t = busy = 0.0
    for nbytes, k in _buckets(profile, *caps):
        ms = ring_allreduce_ms(nbytes, ranks, bus)
        t = max(t, made[k] if seen[k] else end_all) + ms
        busy += ms
    return t, busy


def simulate_ranks(
    profile: Profile,
    plan: Plan,
    ranks: int,
    *,
    stagger_slots: int = 1,
    link: SharedLink | None = None,
    allreduce_gbps: float | None = None,
    optimizer: str = "sgd",
    bucket_caps: tuple[int, int] = (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES),
    calibration: Calibration | None = None,
) -> RanksResult:
    """Price one data-parallel step of ``ranks`` ranks of one host, each running ``plan`` on ``profile``'s batch
    (NOTE [ Shared host link ]).

    Args:
        profile: one rank's profile (its batch is the per-rank batch).
        plan: the plan every rank runs.
        ranks: data-parallel ranks (GPUs of one host), >= 1.
        stagger_slots: slots of the stagger schedule, 1..ranks (1: every rank copies when it likes).
        link: per-GPU copy rates by GPUs copying at once; None: the calibration's table, else a fair share.
        allreduce_gbps: NCCL bus bandwidth among ``ranks`` GPUs, GB/s; None: the calibration's (``allreduce_gbps``).
        optimizer: ``sgd``, ``adam`` or ``none`` (the simulator's optimizer state).
        bucket_caps: DDP's first and other bucket caps, bytes.
        calibration: the GPU type's calibration (shared link, all-reduce rate, compute scale); None looks it up once
            with ``calibration_for(profile.device.key)`` (NOTE [ Calibration is an input ] in
            ``memtune.tuner.calibration``).

    Returns:
        A ``RanksResult``: the step, a rank's peak (with DDP's buckets), the all-reduce and what the link cost.

    Raises:
        PlanError: ``plan`` does not fit ``profile``.
        CalibrationError: several ranks, no ``allreduce_gbps`` given and none in the calibration.
        ValueError: ``ranks`` or ``stagger_slots`` out of range.

    Example::

        >>> alone = simulate_ranks(profile, plan, 4, allreduce_gbps=150.0)
        >>> staggered = simulate_ranks(profile, plan, 4, stagger_slots=2, allreduce_gbps=150.0)
        >>> alone.contention_ms, staggered.contention_ms
    """
    cal = calibration if calibration is not None else calibration_for(profile.device.key)
    the_link = _link_for(profile, link, cal)
    stagger = [stagger_for(s, ranks, stagger_slots, the_link) for s in range(stagger_slots)]
    bus = _allreduce_rate(profile, ranks, allreduce_gbps, cal)
    plan.check(profile)
    slots, rounds = _contend(profile, plan, stagger, the_link, optimizer, cal)
    return _ranks_result(profile, ranks, stagger_slots, the_link, bus, slots, rounds, bucket_caps)


def _contend(
    profile: Profile, plan: Plan, stagger: Sequence[Stagger], link: SharedLink, optimizer: str, calibration: Calibration
) -> tuple[tuple[RankSlot, ...], int]:
    """Each slot's step with the slowdowns its copies meet, iterated to agree with the windows they give
    (NOTE [ Shared host link ]); returns the slots and the rounds run."""
    ranks, n_slots, n = stagger[0].ranks, len(stagger), profile.n_stages
    copies = _Copies(profile)
    scale = calibration.compute_scale_for(profile)  # the profile's, whatever its copies become below
    members = [len(range(s, ranks, n_slots)) for s in range(n_slots)]
    waits = [
        {d: [0.0 if plan.sync == "inline" else st.delay_ms(d, b) for b in copies.bytes] for d in _DIRECTIONS}
        for st in stagger
    ]
    first = ranks if n_slots == 1 else stagger[0].copiers  # lockstep: all copy together; staggered: x at most
    slow = [{d: [link.slowdown(d, first)] * n for d in _DIRECTIONS} for _ in stagger]
    rounds = 0
    while True:
        rounds += 1
        profiles = [copies.profile_with(profile, slow[s], waits[s]) for s in range(n_slots)]
        sims = [Simulator(p, optimizer, compute_scale=scale, calibration=calibration) for p in profiles]
        results = [sim.run(plan, timeline=True, check=False) for sim in sims]
        seen = [
            _windows(r, _owners(sim, plan), copies, slow[s], waits[s])
            for s, (sim, r) in enumerate(zip(sims, results, strict=True))
        ]
        use = _link_use([w for w, _ in seen], members, link, slow)
        moved = max(
            abs(u.slowdown[d][k] - slow[s][d][k]) / slow[s][d][k]
            for s, u in enumerate(use)
            for d in _DIRECTIONS
            for k in range(n)
        )
        if moved < _TOLERANCE or rounds == _MAX_ROUNDS:
            break
        slow = [
            {d: [(a + b) / 2 for a, b in zip(slow[s][d], u.slowdown[d], strict=True)] for d in _DIRECTIONS}
            for s, u in enumerate(use)
        ]
    slots = tuple(
        RankSlot(s, members[s], r, u.weighted["d2h"], u.weighted["h2d"], u.mean_copiers, u.contention_ms, waited, p)
        for s, (r, u, (_, waited), p) in enumerate(zip(results, use, seen, profiles, strict=True))
    )
    return slots, rounds


def _ranks_result(
    profile: Profile,
    ranks: int,
    n_slots: int,
    link: SharedLink,
    bus: float | None,
    slots: tuple[RankSlot, ...],
    rounds: int,
    caps: tuple[int, int],
) -> RanksResult:
    results = [s.result for s in slots]
    compute = max(r.step_ms for r in results)
    end, busy = _allreduce(profile, results, ranks, bus, caps)
    bucket_bytes = profile.param_bytes if ranks > 1 else 0
    return RanksResult(
        ranks=ranks,
        stagger_slots=n_slots,
        link_source=link.source,
        allreduce_gbps=bus,
        step_ms=max(compute, end),
        compute_ms=compute,
        allreduce_ms=busy,
        allreduce_exposed_ms=max(0.0, end - compute),
        peak_bytes=max(r.peak_bytes for r in results) + bucket_bytes,
        bucket_bytes=bucket_bytes,
        mean_copiers=sum(s.mean_copiers * s.ranks for s in slots) / ranks,
        contention_ms=sum(s.contention_ms * s.ranks for s in slots) / ranks,
        slots=slots,
        rounds=rounds,
    )


def ranks_prefetch_trigger(
    profile: Profile,
    plan: Plan,
    ranks: int,
    budget_bytes: int,
    *,
    stagger_slots: int = 1,
    link: SharedLink | None = None,
    allreduce_gbps: float | None = None,
    optimizer: str = "sgd",
    calibration: Calibration | None = None,
) -> PrefetchTrigger:
    """Per-layer swap-in triggers for ``plan`` at the copy rates its ranks really get (NOTE [ Shared host link ]).

    The per-layer trigger search (``memtune.tuner._prefetch_trigger``) runs on the slowest slot's contended copy times
    (its stagger waits included), within ``budget_bytes`` less DDP's gradient buckets; every rank then runs the plan it
    returns (a trigger changes when a copy starts, never the math). ``calibration`` as ``simulate_ranks``.

    Raises:
        PlanError / CalibrationError / ValueError: as ``simulate_ranks``.
        TunerError: the budget does not even hold DDP's gradient buckets.
    """
    cal = calibration if calibration is not None else calibration_for(profile.device.key)
    priced = simulate_ranks(
        profile,
        plan,
        ranks,
        stagger_slots=stagger_slots,
        link=link,
        allreduce_gbps=allreduce_gbps,
        optimizer=optimizer,
        calibration=cal,
    )
    if budget_bytes <= priced.bucket_bytes:
        raise TunerError(
            f"budget {budget_bytes} bytes does not hold DDP's gradient buckets ({priced.bucket_bytes} bytes, one more "
            "copy of the gradients); give a larger budget"
        )
    slowest = max(priced.slots, key=lambda s: s.result.step_ms)
    sim = Simulator(slowest.profile, optimizer, calibration=cal)
    within = budget_bytes - priced.bucket_bytes
    return prefetch_trigger(slowest.profile, plan, within, optimizer=optimizer, simulator=sim)

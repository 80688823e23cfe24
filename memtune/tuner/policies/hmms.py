"""The ``hmms`` policy: HMMS's offload planning (Jin et al. 2019, Split-CNN paper, Algorithm 1).

HMMS offloads every tensor storage object (TSO) once nothing writes it any more, and plans only when
compute synchronises with the copies (the *end of the offload*). It tracks an offload-capacity balance:
a **loss** equal to the TSO's size whenever a TSO starts to be offloaded, a **gain** equal to each
operation's execution time times the link bandwidth. When the balance is >= 0, or at the last
operation, compute synchronises with every outstanding copy and frees those TSOs; "by construction,
when such balance is positive, there will be no outstanding memory transfer", so the sync costs nothing.
The *start of the prefetch* is planned the same way in the opposite direction, from the last operation
of the backward pass to the first, with backward times and the host-to-device bandwidth.

In plan terms: every stage ``offload``; a TSO is a saved storage, lost at the stage that first saves it
(where its copy overlaps compute); ``sync="points"`` with the planned stages as ``sync_points``;
``prefetch_lookahead`` is the longest distance (in stages) between a prefetch's planned start and the
backward that needs it. The balance is reset to 0 whenever it reaches 0 or more: an idle copy engine
cannot bank time for later copies, which is what keeps the quoted invariant true.

# NOTE [ HMMS offload cap ]
The paper keeps "the ratio of offloaded and non-offloaded TSO's under the theoretical limit" and omits the
logic; its Figure 1 defines the limit: the cumulative *offloadable* data (each operation's time times the link
bandwidth) over the cumulative *generated* data (ResNet-50: 40%, VGG-19: all of it). Here the limit is
``min(1, sum of forward ms x D2H bytes/ms / sum of saved bytes)`` (``offload_limit``), and the policy offloads
the stages whose storages come first, in forward order, while their bytes stay within that share of the total:
the earliest storages have the most compute after them to hide their copy and are needed last in backward. The
other stages keep. ``hmms(..., cap=False)`` offloads every stage, as the algorithm alone does.
"""

from __future__ import annotations

from dataclasses import dataclass

from memtune.profiler import Profile
from memtune.tuner.plan import Action, Plan
from memtune.tuner.policies.storage_map import StorageMap

__all__ = ["HmmsSchedule", "capped_stages", "hmms", "hmms_schedule", "offload_limit"]


@dataclass(frozen=True)
class HmmsSchedule:
    """The outcome of HMMS's planning over one profile.

    Attributes:
        sync_points: stages at whose end compute waits for the outstanding offloads and frees them.
        balances: the offload-capacity balance after each stage's forward, bytes (before any reset).
        prefetch_starts: per stage, the stage whose backward starts the prefetch of the storages that
            stage's backward needs first (-1 where it needs none).
        prefetch_lookahead: the longest such distance, stages (at least 1).
    """

    sync_points: tuple[int, ...]
    balances: tuple[float, ...]
    prefetch_starts: tuple[int, ...]
    prefetch_lookahead: int


def offload_limit(profile: Profile) -> float:
    """HMMS's theoretical limit (NOTE [ HMMS offload cap ]): the share of the saved bytes the link can copy
    during the forward pass, ``min(1, sum(forward ms) x D2H bytes per ms / saved bytes)``; 1 with nothing saved."""
    storage_map = StorageMap.of(profile)
    generated = sum(storage_map.first_bytes(st.index) for st in profile.stages)
    if generated <= 0:
        return 1.0
    offloadable = sum(st.forward_ms for st in profile.stages) * profile.device.d2h_gbps * 1e6
    return min(1.0, offloadable / generated)


def capped_stages(profile: Profile, limit: float) -> frozenset[int]:
    """The stages HMMS offloads under ``limit`` (NOTE [ HMMS offload cap ]): in forward order, while the bytes of
    the storages they are first to save stay within ``limit`` of the total (a stage saving nothing new is kept
    with the stages before it)."""
    storage_map = StorageMap.of(profile)
    first = [storage_map.first_bytes(st.index) for st in profile.stages]
    allowed = limit * sum(first)
    taken, out = 0, set()
    for k, b in enumerate(first):
        if taken + b > allowed * (1 + 1e-12):
            break
        taken += b
        out.add(k)
    return frozenset(out)


def hmms_schedule(profile: Profile, offloaded: frozenset[int] | None = None) -> HmmsSchedule:
    """Run Algorithm 1 (offload sync points) and its mirror (prefetch starts) over ``profile``.

    Losses are bytes of the storages each stage is first to save (the model input is always resident), for the
    stages in ``offloaded`` (None: every stage); gains are forward ms (backward ms for prefetch) times the device
    bandwidth in bytes per ms.
    """
    storage_map = StorageMap.of(profile)
    n = profile.n_stages
    d2h_bw = profile.device.d2h_gbps * 1e6  # bytes per ms
    h2d_bw = profile.device.h2d_gbps * 1e6

    # ---- end of the offload: forward order --------------------------------------------------------
    balance = 0.0
    to_free: list[int] = []
    points: list[int] = []
    balances: list[float] = []
    for st in profile.stages:
        loss = storage_map.first_bytes(st.index) if offloaded is None or st.index in offloaded else 0
        if loss > 0:
            to_free.append(st.index)
            balance -= loss
        balance += st.forward_ms * d2h_bw
        balances.append(balance)
        if balance >= 0 or st.index == n - 1:
            if to_free:
                points.append(st.index)
                to_free.clear()
            balance = 0.0

    # ---- start of the prefetch: backward order, analysed from its last operation to its first --------
    need_bytes = [0] * n
    for s in profile.storages:
        if s.producer >= 0 and s.saved_by and (offloaded is None or min(s.saved_by) in offloaded):
            need_bytes[max(s.saved_by)] += s.bytes  # first backward reader
    starts = [-1] * n
    balance = 0.0
    waiting: list[int] = []
    for st in profile.stages:
        k = st.index
        if waiting:
            balance += st.backward_ms * h2d_bw  # stage k's backward runs before theirs
            if balance >= 0:
                for w in waiting:
                    starts[w] = k
                waiting.clear()
                balance = 0.0
        if need_bytes[k] > 0:
            waiting.append(k)
            balance -= need_bytes[k]
    for w in waiting:
        starts[w] = n - 1  # the first backward operation: as early as the pass allows
    lookahead = max((s - k for k, s in enumerate(starts) if s >= 0), default=1)
    return HmmsSchedule(
        sync_points=tuple(points),
        balances=tuple(balances),
        prefetch_starts=tuple(starts),
        prefetch_lookahead=min(1024, max(1, lookahead)),
    )


def hmms(profile: Profile, budget_bytes: int, *, cap: bool = True) -> Plan:
    """HMMS: offload the saved storages the link can carry, synchronise only where the capacity balance allows.

    See the module docstring for the rule, NOTE [ HMMS offload cap ] for the cap and ``hmms_schedule`` for the
    planning. ``budget_bytes`` is not used: the plan offloads what its rule says and places its syncs to cost no
    time.

    Args:
        profile: the chain's profile.
        budget_bytes: the memory budget, bytes (unused).
        cap: offload only up to the theoretical limit (the paper); False offloads every stage.

    Returns:
        A plan with the offloaded stages ``offload`` and the others ``keep``, ``sync="points"``, labelled
        ``hmms``. With nothing to offload the single sync point is the last stage (a no-op).
    """
    del budget_bytes
    n = profile.n_stages
    offloaded = capped_stages(profile, offload_limit(profile)) if cap else frozenset(range(n))
    schedule = hmms_schedule(profile, offloaded)
    return Plan(
        actions=tuple(Action.OFFLOAD if k in offloaded else Action.KEEP for k in range(n)),
        sync="points",
        sync_points=schedule.sync_points or (n - 1,),
        prefetch_lookahead=schedule.prefetch_lookahead,
        label="hmms",
    )

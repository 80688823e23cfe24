"""What a plan's simulated peak holds, part by part, and where the step's time goes.

# NOTE [ Peak parts ]
``Simulator.run(plan, timeline=True)`` lists every allocation and free tensor by tensor (``SimResult.blocks``), in
program order, on top of the resident ``base`` (parameters, optimizer state, the batch). Replayed from ``base`` their
running sum reaches the simulated peak at the same point as the event timeline (a test holds the two equal), so the
blocks live there are the peak's contents. Each is named by what the simulator allocated it for:

* ``parameters``, ``optimizer state``, ``input batch``: the resident base;
* ``parameter gradients``: made in the backward and kept to the optimizer step;
* ``activation gradients``: the gradient of each stage's input and output, the loss's gradient;
* ``workspace``: convolution algorithms' and stages' transients in forward and backward;
* ``kept activations``: saved storages of stages that keep (also those no one keeps, while the forward still reads
  them);
* ``offloads in flight``: offloaded storages whose copy compute has not yet waited for, so still on the GPU;
* ``prefetched activations``: offloaded storages brought back for the backward;
* ``recompute``: what re-running a segment or a selective stage makes, and clones at segment boundaries;
* ``loss``: the loss's own tensors, and the output a training loop holds.

Chains only: for a profile of module stages (gradient storages, stages that keep every input) the blocks are the
allocator placement model's approximation, and replayed they were seen to exceed the timeline's peak by up to 15%
(random plans of the committed U-Net and T5 profiles), so ``peak_parts`` refuses those.

``step_parts`` splits the step's time into compute and the waits for copies (``SimResult`` forward and backward
stalls), and counts the stages that waited.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memtune.tuner.plan import Plan, StorageFate, resolve_storages
from memtune.tuner.simulator import SimResult, Simulator, StorageTables

__all__ = ["PARTS", "PeakParts", "StepParts", "peak_parts", "step_parts"]

#: the parts of a peak, in the order reports list them (NOTE [ Peak parts ])
PARTS = (
    "parameters",
    "optimizer state",
    "input batch",
    "parameter gradients",
    "activation gradients",
    "workspace",
    "kept activations",
    "offloads in flight",
    "prefetched activations",
    "recompute",
    "loss",
)


@dataclass(frozen=True)
class PeakParts:
    """The simulated peak of one plan and what is live at it (NOTE [ Peak parts ]).

    Attributes:
        peak_bytes: the simulated peak, bytes (``SimResult.peak_bytes``).
        where: the timeline's label at the peak (``"bwd 2 start"``: stage 2's backward starts).
        stage: the name of the stage in that label, or ``""`` (the loss).
        parts: bytes per part of ``PARTS``, summing to ``peak_bytes``.
    """

    peak_bytes: int
    where: str
    stage: str
    parts: dict[str, int]


@dataclass(frozen=True)
class StepParts:
    """Where one simulated step's time goes, ms.

    Attributes:
        step_ms: the step (``SimResult.step_ms``).
        compute_ms: the compute stream busy: forward, loss, backward and re-runs.
        forward_stall_ms / backward_stall_ms: compute waiting for device-to-host copies in the forward, and for
            host-to-device copies in the backward.
        stalled_forward / stalled_backward: stages whose forward (backward) waited.
    """

    step_ms: float
    compute_ms: float
    forward_stall_ms: float
    backward_stall_ms: float
    stalled_forward: int
    stalled_backward: int


def peak_parts(sim: Simulator, plan: Plan, result: SimResult | None = None) -> PeakParts:
    """What ``plan``'s simulated peak holds (NOTE [ Peak parts ]); ``result``: its ``sim.run(plan, timeline=True)``
    when already made.

    Raises:
        ValueError: the profile is of module stages, or ``result`` has no blocks (it was not run with
            ``timeline=True``).
    """
    if sim.profile.modules:
        raise ValueError(
            f"peak_parts splits the peaks of chains; {sim.profile.model} is profiled as module stages, whose "
            "tensor-by-tensor blocks do not follow the simulator's timeline exactly (NOTE [ Peak parts ])"
        )
    r = result if result is not None else sim.run(plan, timeline=True)
    if not r.blocks:
        raise ValueError("peak_parts needs a result run with timeline=True (its blocks)")
    profile = sim.profile
    tab = sim.tables if plan.sync != "inline" else StorageTables(profile)  # inline plans run on unmerged storages
    fates = resolve_storages(tab.profile, plan.actions)
    blocks = _in_event_order(r.blocks)
    total, best, best_at = 0, 0, -1
    for j, (kind, _key, nbytes) in enumerate(blocks):
        total += nbytes if kind == "alloc" else -nbytes
        if total > best:
            best, best_at = total, j
    live: dict[tuple[object, int], int] = {}  # (key, allocation count of that key) -> bytes, at the peak
    made: dict[object, int] = {}
    open_: dict[object, list[int]] = {}  # key -> its live allocations' counts, the latest last
    for kind, key, nbytes in blocks[: best_at + 1]:
        if kind == "alloc":
            made[key] = made.get(key, 0) + 1
            live[(key, made[key])] = nbytes
            open_.setdefault(key, []).append(made[key])
        elif open_.get(key):
            live.pop((key, open_[key].pop()))
    parts = dict.fromkeys(PARTS, 0)
    parts["parameters"] = profile.param_bytes
    parts["input batch"] = profile.input_bytes
    parts["optimizer state"] = sim.base - profile.param_bytes - profile.input_bytes - profile.resident_bytes
    parts["workspace"] = profile.resident_bytes  # cuBLAS (NOTE [ Memory held before the step ])
    for (key, instance), nbytes in live.items():
        parts[_part(key, instance, fates)] += nbytes
    at = max(range(len(r.timeline)), key=lambda j: r.timeline[j][1])
    where = r.timeline[at][2]
    word = where.split()[1] if len(where.split()) > 1 else ""
    stage = profile.stages[int(word)].name if word.isdigit() and int(word) < profile.n_stages else ""
    if sum(parts.values()) != r.peak_bytes:
        raise RuntimeError(
            f"the simulator's blocks live at its peak sum to {sum(parts.values())} bytes, its timeline's peak is "
            f"{r.peak_bytes}: the two disagree for this plan, so its peak cannot be split into parts"
        )
    return PeakParts(r.peak_bytes, where, stage, parts)


def _in_event_order(blocks: Sequence[tuple[str, object, int]]) -> list[tuple[str, object, int]]:
    """``blocks`` with each inline fetch's free moved to just before the next other free: the blocks list a stage's
    fetches alone before its workspace and gradients, while its timeline event holds them together with those
    (NOTE [ Inline fetches ] in ``memtune.tuner.simulator``)."""
    ordered: list[tuple[str, object, int]] = []
    pending: list[tuple[str, object, int]] = []
    for block in blocks:
        kind, key, _ = block
        if kind == "free" and isinstance(key, tuple) and key[0] == "inline":
            pending.append(block)
            continue
        if kind == "free" and pending:
            ordered += pending
            pending = []
        ordered.append(block)
    return ordered + pending


def _part(key: object, instance: int, fates: Sequence[StorageFate]) -> str:
    """The part of ``PARTS`` a block live at the peak belongs to: ``key`` as the simulator names its blocks,
    ``instance`` its allocation's count for that key (an offloaded storage's second is its prefetch)."""
    kind = key[0] if isinstance(key, tuple) else str(key)
    if kind == "p":
        return "parameter gradients"
    if kind in ("g", "gs", "gr", "loss grad", "cast grad"):
        return "activation gradients"
    if kind in ("ws", "wsb"):
        return "workspace"
    if kind in ("r", "c", "clone", "sel"):
        return "recompute"
    if kind == "inline":  # NOTE [ Inline fetches ]: storages fetched back for one stage's backward
        return "prefetched activations"
    if kind == "s" and isinstance(key, tuple):
        if fates[key[1]].fate == "offload":
            return "offloads in flight" if instance == 1 else "prefetched activations"
        return "kept activations" if instance == 1 else "recompute"
    return "loss"


def step_parts(result: SimResult) -> StepParts:
    """Compute and copy waits of one simulated step (``StepParts``)."""
    fwd, bwd = sum(result.forward_stalls_ms), sum(result.backward_stalls_ms)
    return StepParts(
        step_ms=result.step_ms,
        compute_ms=result.step_ms - fwd - bwd,
        forward_stall_ms=fwd,
        backward_stall_ms=bwd,
        stalled_forward=sum(1 for s in result.forward_stalls_ms if s > 0.0),
        stalled_backward=sum(1 for s in result.backward_stalls_ms if s > 0.0),
    )

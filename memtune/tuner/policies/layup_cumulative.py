"""The ``layup_cumulative`` policy: the cumulative-threshold report's Algorithm 1 (checkpoint assignment).

From ``layup-cumulative-threshold-report.txt``, "Checkpoint Assignment (Algorithm 1)":
``Cumulative_Threshold = T_transfer / T_cumulative_compute``, where T_cumulative_compute is the forward
time summed from the last checkpoint to the current layer. "A layer is called a checkpoint layer if the
value of Threshold at layer i drops below 1"; its feature map is saved to the CPU and the cumulative sum
resets to 0. The input layer is a checkpoint by default; the other layers' outputs are dropped and
recomputed from the last checkpoint in backward (Algorithm 2).

In plan terms a checkpoint stage is ``offload`` and the others ``recompute``: each run of recompute
stages is one segment whose saved input is the previous checkpoint's output, copied to the host because
that checkpoint offloads (NOTE [ Plan semantics ]). The model input, the default first checkpoint, is
always resident. A checkpoint stage also offloads its own saved set, so T_transfer counts what the
plan copies for it: its saved storages and its output, each once.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from memtune.profiler import Profile
from memtune.tuner.plan import Action, Plan
from memtune.tuner.policies.storage_map import StorageMap

__all__ = [
    "CumulativeStep",
    "checkpoint_transfer_ms",
    "cumulative_steps",
    "layup_cumulative",
]


@dataclass(frozen=True)
class CumulativeStep:
    """One iteration of Algorithm 1 at one stage (times in ms)."""

    stage: int
    transfer_ms: float
    cumulative_ms: float
    ratio: float
    checkpoint: bool


def checkpoint_transfer_ms(storage_map: StorageMap, stage: int) -> float:
    """D2H ms of what a checkpoint at ``stage`` copies: its saved storages and its output, each once."""
    storages = set(storage_map.saved[stage])
    out = storage_map.output_storage(stage)
    if out is not None and stage + 1 < storage_map.profile.n_stages:
        storages.add(out)
    return storage_map.d2h_of(storages)


def cumulative_steps(profile: Profile, *, threshold: float = 1.0) -> tuple[CumulativeStep, ...]:
    """Run Algorithm 1 over the stages and return every step (the report's ``Profile`` function).

    ``t_cumulative_compute`` starts at 0 (the model input is the first checkpoint); for each stage the
    forward ms is added, ``ratio = T_transfer / t_cumulative_compute`` is computed, and when
    ``ratio < threshold`` the stage is a checkpoint and the sum resets to 0.
    """
    if not threshold > 0:
        raise ValueError(f"layup_cumulative threshold must be a positive number, not {threshold!r}")
    storage_map = StorageMap.of(profile)
    steps: list[CumulativeStep] = []
    cumulative = 0.0
    for st in profile.stages:
        cumulative += st.forward_ms
        transfer = checkpoint_transfer_ms(storage_map, st.index)
        if transfer <= 0.0:
            ratio = 0.0
        elif cumulative <= 0.0:
            ratio = math.inf
        else:
            ratio = transfer / cumulative
        is_ckpt = ratio < threshold
        steps.append(CumulativeStep(st.index, transfer, cumulative, ratio, is_ckpt))
        if is_ckpt:
            cumulative = 0.0
    return tuple(steps)


def layup_cumulative(profile: Profile, budget_bytes: int, *, threshold: float = 1.0) -> Plan:
    """Checkpoints by cumulative threshold (module docstring): checkpoints offload, the rest recompute.

    Copies run on a transfer stream beside compute (``sync="deferred"``) and compute waits for a
    checkpoint's copy one checkpoint interval later (``sync_delay``: the copy overlaps the next segment's
    forward, which is what the threshold compares it with); the previous checkpoint is fetched while the
    current segment is re-run, so the prefetch looks ahead one checkpoint interval (the longest gap
    between checkpoints, at least 1 stage). ``budget_bytes`` is not used: the rule is static; the search
    tunes ``threshold`` instead.

    Args:
        profile: the chain's profile.
        budget_bytes: the memory budget, bytes (unused).
        threshold: a stage becomes a checkpoint when T_transfer / T_cumulative_compute drops below it
            (the report: 1.0). Larger values make more checkpoints (more copies, less recompute).

    Returns:
        The plan, labelled ``layup_cumulative``.
    """
    del budget_bytes
    steps = cumulative_steps(profile, threshold=threshold)
    actions = tuple(Action.OFFLOAD if s.checkpoint else Action.RECOMPUTE for s in steps)
    ckpts = [-1] + [s.stage for s in steps if s.checkpoint]
    gap = max((b - a for a, b in itertools.pairwise(ckpts)), default=1)
    return Plan(
        actions=actions,
        sync="deferred",
        prefetch_lookahead=min(1024, max(1, gap)),
        sync_delay=min(1024, max(1, gap)),
        label="layup_cumulative",
    )

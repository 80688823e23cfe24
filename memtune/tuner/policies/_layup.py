"""The ``layup`` policy: Layup's per-layer threshold T_transfer / T_forward with watershed 2.

From the Layup paper as summarised in the cumulative-threshold report (``layup-cumulative-threshold-
report.txt``, "Selection of Layer-adaptive Dynamic Memory Optimization Methods"):
``Threshold_i = Cost_transfer / Cost_extra-forward`` (equation 1), and "Threshold = 2 is a watershed":
below 2 the layer is compute-sensitive and its input feature map is transferred to host memory
asynchronously; at 2 or above it is transfer-sensitive and its input feature map is dropped and
recovered in backward by an extra forward.
"""

from __future__ import annotations

import math

from memtune.profiler import Profile
from memtune.tuner.plan import Action, Plan
from memtune.tuner.policies.storage_map import StorageMap

__all__ = ["WATERSHED", "layup", "layup_thresholds"]

#: Layup's watershed between transfer (below) and extra forward (at or above)
WATERSHED = 2.0


def _ratio(transfer_ms: float, compute_ms: float) -> float:
    """transfer / compute; 0 when there is nothing to copy, infinity when there is no compute."""
    if transfer_ms <= 0.0:
        return 0.0
    if compute_ms <= 0.0:
        return math.inf
    return transfer_ms / compute_ms


def layup_thresholds(profile: Profile) -> tuple[float, ...]:
    """Per stage, Layup's threshold T_transfer / T_forward.

    T_transfer is the D2H time (ms) of everything the stage saves for backward (its input feature map,
    shared storages included; the model input is always resident and costs nothing); T_forward is the
    stage's forward ms, the cost of one extra forward.
    """
    storage_map = StorageMap.of(profile)
    return tuple(_ratio(storage_map.saved_d2h_ms(st.index), st.forward_ms) for st in profile.stages)


def layup(profile: Profile, budget_bytes: int, *, watershed: float = WATERSHED) -> Plan:
    """Layup's layer-adaptive choice: offload where T_transfer / T_forward < 2, else recompute.

    Each stage's threshold (``layup_thresholds``) is compared with the watershed: below it the stage is
    ``offload`` (the copy overlaps compute on a separate stream: ``sync="deferred"``, waited for two
    stages later, as a copy under the watershed takes less than two forward times), at or above it
    ``recompute`` (dropped in forward, re-made by an extra forward in backward). ``budget_bytes`` is
    not used: the rule is per layer and static.

    Args:
        profile: the chain's profile.
        budget_bytes: the memory budget, bytes (unused).
        watershed: the threshold value separating the two choices (Layup: 2).

    Returns:
        The plan, labelled ``layup``.
    """
    del budget_bytes
    if not watershed > 0:
        raise ValueError(f"layup watershed must be a positive number, not {watershed!r}")
    actions = tuple(Action.OFFLOAD if t < watershed else Action.RECOMPUTE for t in layup_thresholds(profile))
    return Plan(actions=actions, sync="deferred", sync_delay=2, label="layup")

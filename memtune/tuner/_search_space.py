"""The plan search's space (NOTE [ Search space ] in ``memtune.tuner.search``): its ranges, a trial's parameters as a
plan (``decode_params``) and a plan as parameters (``_params_for``), and the plan edits the local descent makes
(a plan's knobs, ``_Knobs``; one edit, ``_Move``).

Lookaheads count stages, sync delays count stages, workspace caps are MiB in parameters and bytes in plans.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution

from memtune.tuner._spatial_search import valid_splits
from memtune.tuner.plan import Action, Plan

__all__ = ["decode_params"]

_SYNCS = ("deferred", "layer")
_MAX_LOOKAHEAD = 8
_MAX_SYNC_DELAY = 16
_DEFAULT_SYNC_DELAY: int = Plan.model_fields["sync_delay"].default
_THRESHOLD_RANGE = (0.05, 20.0)
_CONV_RULES = ("default", "fastest", "memory_optimal", "fastest_within")
_PER_LAYER = (False, True)  # NOTE [ Search space ]: per_layer_prefetch
_MAX_WS_CAP_MIB = 16384
_Knobs = tuple[int, str, int, str, int | None]
"""lookahead, sync, sync_delay, conv_rule, conv workspace cap bytes: a plan's knobs in the local descent"""
_Move = tuple[int, Action | None, _Knobs]
"""one edit of the local descent: stage k takes action a (k = -1: the actions stay), and the knobs"""


def decode_params(params: dict[str, Any], n: int, threshold_actions: Callable[[float], Sequence[Action]]) -> Plan:
    """Turn one trial's parameters into a plan. See NOTE [ Search space ]."""
    base = threshold_actions(float(params.get("threshold", 1.0)))
    actions = []
    for k in range(n):
        choice = params.get(f"a{k:03d}", "auto")
        actions.append(base[k] if choice == "auto" else Action(choice))
    return Plan(
        actions=tuple(actions),
        prefetch_lookahead=int(params.get("lookahead", 2)),
        sync=params.get("sync", "deferred"),
        sync_delay=int(params.get("sync_delay", _DEFAULT_SYNC_DELAY)),
        label="optuna",
        **_conv_knobs(params.get("conv_rule", "default"), params.get("ws_cap_mib")),
    )


def _conv_knobs(rule: str, cap_mib: int | None) -> dict[str, Any]:
    """Plan fields for a convolution rule; the cap only matters (and is only set) for ``fastest_within``."""
    if rule == "fastest_within":
        return {"conv_rule": rule, "conv_workspace_limit_bytes": int(cap_mib or 0) << 20}
    return {"conv_rule": rule}


def _edited(actions: list[Action], k: int, a: Action | None) -> list[Action]:
    """``actions`` with stage ``k``'s action ``a`` (a copy), or ``actions`` itself where ``k`` is -1 (``_Move``)."""
    if k < 0 or a is None:
        return actions
    acts = actions.copy()
    acts[k] = a
    return acts


def _knobs_of(plan: Plan) -> _Knobs:
    """A plan's knobs as the local descent varies them."""
    return plan.prefetch_lookahead, plan.sync, plan.sync_delay, plan.conv_rule, plan.conv_workspace_limit_bytes


def _with_knobs(plan: Plan, actions: Sequence[Action], knobs: _Knobs) -> Plan:
    """``plan`` with ``actions`` and ``knobs`` (not validated again: both come from valid plans' moves). A new global
    lookahead replaces per-stage ones (NOTE [ Prefetch lookahead ] in ``memtune.tuner.plan``)."""
    la, sync, delay, rule, cap = knobs
    return plan.model_copy(
        update={
            "actions": tuple(actions),
            "prefetch_lookahead": la,
            "prefetch_lookaheads": plan.prefetch_lookaheads if la == plan.prefetch_lookahead else None,
            "sync": sync,
            "sync_delay": delay,
            "conv_rule": rule,
            "conv_workspace_limit_bytes": cap,
            "spatial_splits": valid_splits(plan.spatial_splits, actions),  # NOTE [ Searching splits ]
        }
    )


def _params_for(plan: Plan, with_conv: bool = False) -> dict[str, Any]:
    """Express a baseline plan in the search space (explicit per-stage actions)."""
    params: dict[str, Any] = {"threshold": 1.0}
    for k, a in enumerate(plan.actions):
        params[f"a{k:03d}"] = a.value
    params["lookahead"] = min(_MAX_LOOKAHEAD, plan.prefetch_lookahead)
    params["sync"] = plan.sync if plan.sync in _SYNCS else "layer"
    params["sync_delay"] = min(_MAX_SYNC_DELAY, plan.sync_delay)
    params["per_layer_prefetch"] = plan.prefetch_lookaheads is not None
    if with_conv:
        params["conv_rule"] = plan.conv_rule
        cap = plan.conv_workspace_limit_bytes
        params["ws_cap_mib"] = min(_MAX_WS_CAP_MIB, max(1, (cap or (256 << 20)) >> 20))
    return params


def _contains(d: BaseDistribution, value: Any) -> bool:
    """Whether a categorical distribution holds ``value`` (numbers are clamped to their range by ``_params_for``)."""
    return not isinstance(d, CategoricalDistribution) or value in d.choices

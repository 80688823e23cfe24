"""A memtune plan on every rank of a sharded run: ``planned`` over FSDP2's ``fully_shard``.

Each rank shards its replica with FSDP2, the repeated blocks as units of their own and the root over the rest
(``memtune.tuner._sharding.shard_units``, NOTE [ Sharded ranks ]), and wraps it with the plan
(``memtune.tuner.runtime._planned``). The plan's stages run inside FSDP2's hooks: a stage's parameters are gathered
before its wrapper runs, the offload
runtime leaves them on the device (NOTE [ Sharded parameters ] in ``memtune.tuner.runtime._planned_module``), and a
recomputed stage re-runs in the backward after FSDP2 has gathered them again. FSDP2 averages the gradients over the
ranks, so after a step each rank's shards hold the gradients of the unplanned model on the whole batch
(``tests/unit/runtime/test_fsdp_plans.py``, gloo on CPU). ``memtune.tuner._sharding.sharded_profile`` prices one rank's
step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from memtune.tuner import Plan, TunerError
from memtune.tuner._sharding import shard_units
from memtune.tuner.runtime._planned import PlannedBase, planned

__all__ = ["planned_fsdp", "shard"]


def shard(model: nn.Module, unit_names: Iterable[str], **fully_shard_options: Any) -> nn.Module:
    """``model`` sharded in place by FSDP2: each module named in ``unit_names`` a unit of its own, then the root.

    Raises:
        TunerError: no process group, or a name is not a submodule of ``model``.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise TunerError("sharding runs in a process group: call torch.distributed.init_process_group first")
    modules = dict(model.named_modules())
    names = list(unit_names)
    missing = [n for n in names if n not in modules]
    if missing:
        raise TunerError(f"units {missing} are not submodules of {type(model).__name__}")
    for name in names:
        fully_shard(modules[name], **fully_shard_options)
    fully_shard(model, **fully_shard_options)
    return model


def planned_fsdp(
    model: nn.Module,
    plan: Plan | Mapping[str, Any] | str | Path,
    *,
    units: Iterable[str] | None = None,
    pool_bytes: int = 0,
    **fully_shard_options: Any,
) -> PlannedBase:
    """This rank's replica of ``model`` sharded by FSDP2 and running ``plan``.

    Call it in every rank after ``torch.distributed.init_process_group``, with the model on this rank's device and
    the same parameters everywhere (each rank keeps its shard of them).

    Args:
        model: the module the plan was made for (its stages are named in ``plan.stages``).
        plan: a plan of module stages (``memtune.tune`` on the model, priced for a rank by
            ``memtune.tuner._sharding.sharded_profile``).
        units: submodules sharded as units of their own (default: the plan's repeated-block stages,
            ``memtune.tuner._sharding.shard_units``).
        pool_bytes: host bytes to reserve up front for offloaded storages.
        **fully_shard_options: passed to every ``fully_shard`` call (``mesh``, ``mp_policy``, ...).

    Returns:
        The planned model (its ``model`` is the sharded module).

    Raises:
        TunerError: no process group, or a unit is not a submodule. PlanError: the plan does not fit the model.
    """
    wrapped = planned(model, plan, pool_bytes=pool_bytes)  # checks the plan against the unsharded model
    unit_names = list(units) if units is not None else list(shard_units(wrapped.plan.stages or ()))
    shard(model, unit_names, **fully_shard_options)
    return wrapped

"""One rank's step under FSDP2 (``torch.distributed.fsdp.fully_shard``) as a profile the single-GPU simulator prices.

# NOTE [ Sharded ranks ]
FSDP2 shards every parameter, its gradient and its optimizer state over the ranks of a group; a rank gathers a
unit's whole parameters for that unit's forward and again for its backward, and reduce-scatters the unit's whole
gradients to its shard after the backward. Units are the modules ``fully_shard`` was called on: the repeated
blocks, and the root, which holds every parameter outside them (embedding, final norm, head) and, as FSDP2's root,
keeps them gathered from its forward to the end of its backward. memtune's plan decides a rank's activations as
on one GPU; only where the parameter bytes sit changes, so ``sharded_profile`` rewrites one GPU's profile (the
model's per-rank batch, measured unsharded) into one rank's, for the unchanged simulator and search:

* a unit stage of P bytes of parameters: its ``param_bytes`` becomes ``ceil(P / N)`` (the shard, and the sharded
  gradient its backward leaves for the rest of the step); its forward transient grows by its gathered parameters
  and the next unit's, which FSDP2 gathers ahead (P + P_next); each backward transient by its gathered parameters,
  its whole gradients before the reduce-scatter and the unit before it, gathered ahead (2 P + P_prev);
* a root stage: its ``param_bytes`` becomes its shard too, and what the root holds beyond its shards for the whole
  step, its gathered parameters and its whole gradients, ``2 P_root (N - 1) / N``, is added to ``input_bytes``,
  which the simulator holds resident with the batch (the gradients are made in the backward, so this is an upper
  bound until then);
* optimizer state follows the parameters: the simulator's ``param_bytes * (1 + state)`` is the shards' state.

Collectives are not priced: an all-gather or reduce-scatter runs on its own stream, ahead of or behind compute,
over NVLink (NCCL's all-reduce between two H100s measured 275.6 GB/s of bus bandwidth, ``benchmarks.shared_link``).
What they cost shows as the measured step above the simulated one (``benchmarks.fsdp_plans``: 3.8 to 4.5x on two
H100s, with every FSDP2 method's reserved memory at its cap).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from memtune.profiler import Profile, StageProfile
from memtune.tuner._tuner_errors import TunerError

__all__ = ["shard_units", "sharded_profile"]

_BLOCK = re.compile(r"\.\d+$")


def shard_units(stage_names: Iterable[str]) -> tuple[str, ...]:
    """The stages FSDP2 shards as units of their own by default: the repeated blocks, the stages whose qualified
    name ends in an index (``model.layers.3``, a child of a ``ModuleList`` or ``Sequential``). Every other stage's
    parameters belong to the root unit."""
    return tuple(name for name in stage_names if _BLOCK.search(name))


def _grown(value: int | None, extra: int) -> int | None:
    return None if value is None else value + extra


def sharded_profile(profile: Profile, world: int, *, units: Iterable[str] | None = None) -> Profile:
    """``profile`` (one GPU, the per-rank batch, parameters whole) as one of ``world`` FSDP2 ranks runs it
    (NOTE [ Sharded ranks ]).

    Args:
        profile: a module profile measured unsharded at the batch each rank runs.
        world: ranks the parameters are sharded over, >= 1 (1 gives ``profile`` back).
        units: stage names sharded as units of their own (default ``shard_units``); the rest are the root's.

    Raises:
        TunerError: ``world`` < 1, or a unit names no stage of the profile.
    """
    if world < 1:
        raise TunerError(f"world must be >= 1 rank, got {world}")
    names = [s.name for s in profile.stages]
    unit_names = set(shard_units(names) if units is None else units)
    unknown = sorted(unit_names - set(names))
    if unknown:
        raise TunerError(f"units {unknown} are not stages of {profile.model}; its stages are {names}")
    if world == 1:
        return profile
    is_unit = [s.name in unit_names for s in profile.stages]
    unit_bytes = [s.param_bytes if u else 0 for s, u in zip(profile.stages, is_unit, strict=True)]
    root_bytes = profile.outside_param_bytes + sum(
        s.param_bytes for s, u in zip(profile.stages, is_unit, strict=True) if not u
    )
    stages: list[StageProfile] = []
    for k, st in enumerate(profile.stages):
        shard = math.ceil(st.param_bytes / world)
        if not is_unit[k]:
            stages.append(st.model_copy(update={"param_bytes": shard}))
            continue
        p = st.param_bytes
        ahead = next((b for b in unit_bytes[k + 1 :] if b), 0)  # the next unit, gathered during this forward
        behind = next((b for b in reversed(unit_bytes[:k]) if b), 0)  # the unit before, gathered in this backward
        back = 2 * p + behind
        stages.append(
            st.model_copy(
                update={
                    "param_bytes": shard,
                    "forward_workspace_bytes": st.forward_workspace_bytes + p + ahead,
                    "lean_forward_workspace_bytes": _grown(st.lean_forward_workspace_bytes, p + ahead),
                    "backward_workspace_bytes": st.backward_workspace_bytes + back,
                    "backward_inline_bytes": _grown(st.backward_inline_bytes, back),
                    "chained_backward_bytes": _grown(st.chained_backward_bytes, back),
                    "lean_backward_workspace_bytes": _grown(st.lean_backward_workspace_bytes, back),
                    "selective_backward_bytes": _grown(st.selective_backward_bytes, back),
                    "recompute_backward_bytes": _grown(st.recompute_backward_bytes, back),
                }
            )
        )
    held_by_root = 2 * root_bytes * (world - 1) // world
    return profile.model_copy(
        update={
            "stages": tuple(stages),
            "outside_param_bytes": math.ceil(profile.outside_param_bytes / world),
            "input_bytes": profile.input_bytes + held_by_root,
            "compiler_points": (),  # measured on the unsharded model: not this rank's
            "step_peak": None,
        }
    )

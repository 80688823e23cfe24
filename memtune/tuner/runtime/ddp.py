"""A memtune plan on every rank of a data-parallel run: ``planned`` under ``DistributedDataParallel``.

Each rank wraps its own replica with the plan (``memtune.tuner.runtime._planned``), optionally staggering its copies
with the other ranks' (NOTE [ Staggered copies ] in ``memtune.tuner.runtime._stagger``), and hands it to PyTorch's
``DistributedDataParallel``, which sums the gradients with bucketed all-reduces during the backward. A plan never
changes the math and neither does a stagger, so the gradients are those of the unplanned model on the whole batch
(``tests/unit/runtime/test_ddp_plans.py`` checks it with gloo on CPU). ``memtune.tuner._ranks.simulate_ranks`` prices
the same step (NOTE [ Shared host link ] in ``memtune.tuner._ranks``).

One rank needs no all-reduce: with a world of one the planned model comes back without the DDP wrapper, as the
model prices it (no gradient buckets). ``spawn_ranks`` runs a function in N fresh processes of one process group
(gloo on CPU, NCCL on GPUs with NVLink multicast left off), the way the launcher ``python -m benchmarks.ddp_plans``
and the tests use it.
"""

from __future__ import annotations

import datetime
import os
import pickle
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from memtune.profiler import ModelChain
from memtune.tuner import Plan, Stagger, TunerError
from memtune.tuner.runtime._planned import PlannedBase, planned
from memtune.tuner.runtime._stagger import StaggeredRuntime, gpu_cycles_per_ms

__all__ = ["planned_ddp", "planned_of", "spawn_ranks"]


def planned_ddp(
    model: ModelChain | nn.Module,
    plan: Plan | Mapping[str, Any] | str | Path,
    *,
    stagger: Stagger | None = None,
    pool_bytes: int = 0,
    **ddp_options: Any,
) -> nn.Module:
    """This rank's replica of ``model`` running ``plan``, under ``DistributedDataParallel``.

    Call it in every rank after ``torch.distributed.init_process_group``, with the model on this rank's device
    (``cuda:<local rank>``, or CPU with the gloo backend) and the same parameters everywhere (DDP broadcasts rank 0's).

    Args:
        model: the chain or module the plan was made for.
        plan: anything ``planned`` takes.
        stagger: this rank's place in the stagger schedule (``memtune.tuner.stagger_for(rank, world, slots, link)``), or
        None
            to copy unstaggered. Its rank and ranks must be this process's.
        pool_bytes: host bytes to reserve up front for offloaded storages.
        **ddp_options: passed to ``DistributedDataParallel`` (``device_ids`` defaults to the model's CUDA device).

    Returns:
        The ``DistributedDataParallel`` module (the planned model is its ``module``; ``planned_of`` finds it), or the
        planned model itself in a world of one.

    Raises:
        TunerError: no process group, or ``stagger`` is another rank's or another world's.
        PlanError: the plan does not fit the model.

    Example::

        dist.init_process_group("nccl")
        model = planned_ddp(model.to(device), plan, stagger=stagger_for(rank, world, 2, link))
        loss_fn(model(x), y).backward()   # gradients all-reduced, copies staggered
    """
    if not dist.is_available() or not dist.is_initialized():
        raise TunerError("planned_ddp runs in a process group: call torch.distributed.init_process_group first")
    rank, world = dist.get_rank(), dist.get_world_size()
    if stagger is not None and (stagger.rank, stagger.ranks) != (rank, world):
        raise TunerError(
            f"the stagger is rank {stagger.rank} of {stagger.ranks}, but this process is rank {rank} of {world}: "
            "make it with memtune.tuner.stagger_for(rank, world_size, slots, link) in each process"
        )
    wrapped = planned(model, plan, pool_bytes=pool_bytes)
    if stagger is not None:
        device = next((p.device for p in wrapped.parameters()), torch.device("cpu"))
        if device.type == "cuda":
            gpu_cycles_per_ms(device.index if device.index is not None else torch.cuda.current_device())
        wrapped._runtime = StaggeredRuntime(stagger, reserve_bytes=pool_bytes)
    if world == 1:
        return wrapped
    options = dict(ddp_options)
    device = next((p.device for p in wrapped.parameters()), torch.device("cpu"))
    if device.type == "cuda":
        options.setdefault("device_ids", [device])
    return DistributedDataParallel(wrapped, **options)


def planned_of(model: nn.Module) -> PlannedBase:
    """The planned model inside what ``planned_ddp`` returned (its stats, pool and runtime).

    Raises:
        TunerError: ``model`` is not one ``planned_ddp`` made.
    """
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    if not isinstance(inner, PlannedBase):
        raise TunerError(f"expected what planned_ddp returns, got {type(model).__name__}")
    return inner


def _rank_main(
    rank: int, fn: Callable[..., Any], world: int, backend: str, init: str, timeout_s: float, out: str, args: tuple
) -> None:
    """One spawned rank: join the group, run ``fn(rank, world, *args)``, leave its result in ``out``."""
    if backend == "nccl":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend, init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
    )
    try:
        result = fn(rank, world, *args)
        Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    finally:
        dist.destroy_process_group()


def spawn_ranks(
    fn: Callable[..., Any], world: int, *args: Any, backend: str | None = None, timeout_s: float = 120.0
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` fresh processes of one process group; their results by rank.

    ``fn`` must be a module-level function and its arguments and result picklable (they travel between our own
    processes). Each process joins the group first (``backend``: ``nccl`` when CUDA has ``world`` devices, else
    ``gloo``; rank r on ``cuda:r`` under NCCL, with ``NCCL_NVLS_ENABLE=0``) and leaves it after ``fn``.

    Raises:
        TunerError: ``world`` < 1, or NCCL asked for with fewer GPUs than ranks.
        torch.multiprocessing.ProcessRaisedException: a rank raised (the others are stopped); its traceback is in the
            message. A collective that waits longer than ``timeout_s`` for a rank that died raises in the others.
    """
    if world < 1:
        raise TunerError(f"world must be >= 1 process, got {world}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    chosen = backend or ("nccl" if gpus >= world else "gloo")
    if chosen == "nccl" and gpus < world:
        raise TunerError(f"NCCL runs one rank per GPU: {world} ranks need {world} GPUs, this host has {gpus}")
    with tempfile.TemporaryDirectory(prefix="memtune-ranks-") as tmp:
        init = Path(tmp, "rendezvous").as_uri()
        done = [Path(tmp, f"rank{r}.pkl") for r in range(world)]
        try:
            mp.spawn(_rank_main, args=(fn, world, chosen, init, timeout_s, tmp, args), nprocs=world, join=True)
        except mp.ProcessExitedException:
            if not all(p.is_file() for p in done):
                raise
            # every rank returned its result and one died leaving the group (seen with gloo on a loaded CPU:
            # "terminate called without an active exception" at exit): the results stand
        return [pickle.loads(p.read_bytes()) for p in done]

"""Data-parallel training of a zoo model on N GPUs of one host within a per-GPU budget: the largest batch and its speed.

    python -m benchmarks.ddp_plans OUT --nproc 4 --model resnet50 --budget 12GiB --batches 64,96,128,160,192

Per method, in N processes of one group (``memtune.tuner.runtime.ddp.spawn_ranks``: NCCL with NVLink multicast off, or
gloo on CPU), each GPU runs its own share of the global batch (``--batches`` are per GPU) for ``--warmup`` then
``--steps`` timed steps (NOTE [ Bench step ] in ``memtune.tuner.measure.bench``: forward, cross-entropy, backward, SGD
momentum) under ``budget_guard`` at ``--budget``, from the smallest batch up to the first that does not train:

* ``unplanned``: ``DistributedDataParallel`` on the plain model;
* ``checkpoint``: ``checkpoint_sequential`` (√n segments, non-reentrant) under DDP;
* ``plan``: memtune's plan for that batch (tuned within the budget less DDP's gradient buckets) under DDP
  (``memtune.tuner.runtime.ddp.planned_ddp``);
* ``staggered``: the same plan with its copies staggered over ``--stagger-slots`` slots (NOTE [ Staggered copies ]);
* ``triggered``: the staggered plan with per-layer swap-in triggers chosen at the contended copy rate
  (``memtune.tuner.ranks_prefetch_trigger``), the multi-GPU vDNN paper's two changes together.

Each row: per-GPU batch, the step (median ms, the slowest rank's), samples per second of all GPUs, the largest peak
allocated on any rank, and beside it the prediction of ``memtune.tuner.simulate_ranks`` (NOTE [ Shared host link ]) for
the plans and the unplanned model. Plans are tuned on the committed measured profile of that batch where there is one,
else a modeled one, without whole-model compile plans; their convolution choices are dropped (the runtime leaves
convolutions to the framework here), and the prediction is for the plan as run. Copy rates with several GPUs copying
at once and the all-reduce rate come from the GPU type's calibration, else they are measured here first
(``memtune.tuner.measure.link_share``). Writes ``OUT/ddp-plans-<model>-<dtype>-x<N>.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import zoo_profile
from benchmarks.ranked import (
    add_rank_options,
    checked_rank_options,
    measure_steps,
    rank_rows,
    record_method,
    result_fields,
    rows_table,
    spawn_rows,
    start_ranks,
)
from memtune.profiler import Profile
from memtune.tuner import Plan, SharedLink, parse_budget, ranks_prefetch_trigger, simulate_ranks, stagger_for, tune
from memtune.tuner.calibration import calibration_for

__all__ = ["METHODS", "main"]

METHODS = ("unplanned", "checkpoint", "plan", "staggered", "triggered")
_PLANNED = ("plan", "staggered", "triggered")


@dataclass(frozen=True)
class _Config:
    """What every rank of one method's run needs (pickled to the spawned ranks)."""

    model: str
    params: dict[str, int]
    dtype: str
    method: str
    budget_bytes: int | None  # None on CPU: no cap
    warmup: int
    steps: int
    slots: int
    link: dict[str, dict[str, float]]
    plans: dict[int, dict[str, Any]] = field(default_factory=dict)  # per batch, the plan's JSON (planned methods)
    batches: tuple[int, ...] = ()
    rows_file: str | None = None  # NOTE [ A rank out of memory ] in benchmarks.ranked


def _wrap(cfg: _Config, chain: Any, batch: int, rank: int, world: int) -> tuple[Any, Any]:
    """The model this method trains, and the planned model inside it (None for PyTorch's own)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.checkpoint import checkpoint_sequential

    from memtune.tuner.measure.bench import checkpoint_segments
    from memtune.tuner.runtime.ddp import planned_ddp, planned_of

    seq = chain.as_sequential()
    device = next(seq.parameters()).device
    ids = [device] if device.type == "cuda" else None
    if cfg.method == "unplanned":
        return (DistributedDataParallel(seq, device_ids=ids) if world > 1 else seq), None
    if cfg.method == "checkpoint":
        segs = checkpoint_segments(chain)

        class _Checkpointed(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.seq = seq

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return checkpoint_sequential(self.seq, segs, x, use_reentrant=False)

        inner = _Checkpointed()
        return (DistributedDataParallel(inner, device_ids=ids) if world > 1 else inner), None
    plan = Plan.model_validate(cfg.plans[batch])
    stagger = stagger_for(rank, world, cfg.slots, SharedLink.from_table(cfg.link)) if cfg.method != "plan" else None
    model = planned_ddp(chain, plan, stagger=stagger if stagger is not None and stagger.slots > 1 else None)
    return model, planned_of(model)


def _measure(cfg: _Config, batch: int, rank: int, world: int) -> dict[str, Any]:
    """One batch on this rank: median step ms, peak bytes allocated, or the error that stopped it."""
    import torch

    from memtune.profiler import build
    from memtune.profiler.loss import step_loss
    from memtune.tuner.measure.bench import make_batch
    from memtune.tuner.runtime import PlanOutOfMemoryError, budget_guard

    cuda = torch.cuda.is_available() and cfg.budget_bytes is not None
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    chain = build(cfg.model, cfg.params)
    chain.as_sequential().to(device)
    try:
        model, pm = _wrap(cfg, chain, batch, rank, world)
        opt = torch.optim.SGD(chain.as_sequential().parameters(), lr=1e-4, momentum=0.9)
        x, y = make_batch(chain, batch, device)
        half = cfg.dtype != "float32" and cuda
        autocast = torch.autocast("cuda", dtype=getattr(torch, cfg.dtype)) if half else contextlib.nullcontext()

        def step() -> None:
            with autocast:
                loss = step_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        guard = budget_guard(cfg.budget_bytes, pm) if cuda and cfg.budget_bytes else None
        return measure_steps(step, warmup=cfg.warmup, steps=cfg.steps, cuda=cuda, guard=guard)
    except (torch.OutOfMemoryError, PlanOutOfMemoryError) as exc:  # wrapping the model
        return {"ok": False, "ms": None, "peak": None, "error": f"out of memory: {str(exc).splitlines()[0][:160]}"}
    finally:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def _rank_trials(rank: int, world: int, cfg: _Config) -> list[dict[str, Any]]:
    """This rank's rows (``benchmarks.ranked.rank_rows``)."""
    return rank_rows(rank, world, cfg.batches, lambda b: _measure(cfg, b, rank, world), cfg.rows_file)


def _link_and_bus(profile: Profile, nproc: int, measure: bool) -> tuple[SharedLink, float | None, str]:
    """The copy rates by GPUs copying at once and the all-reduce rate: the calibration's, else measured here."""
    cal = calibration_for(profile.device.key)
    link, bus = cal.shared_link, cal.allreduce_gbps(nproc)
    note = "calibration"
    if (link is None or (bus is None and nproc > 1)) and measure:
        from memtune.tuner.measure.link_share import measure_allreduce, measure_shared_link

        devices = list(range(nproc))
        if link is None:
            link = SharedLink.from_table(measure_shared_link(devices, repeats=3).table)
        if bus is None and nproc > 1:
            bus = measure_allreduce(devices).get(str(nproc))
        note = "measured by this run"
        import torch

        torch.cuda.empty_cache()  # the ranks' budgets are theirs: this process keeps no cached blocks
    if link is None:
        link, note = SharedLink.fair_share(profile.device.d2h_gbps, profile.device.h2d_gbps), "fair share"
    return link, bus, note


def _plans(args: argparse.Namespace, nproc: int, budget: int) -> tuple[dict[int, Profile], dict[str, dict[int, Plan]]]:
    """Per batch: its profile, and the plans of the planned methods (tuned within the budget less the buckets)."""
    profiles: dict[int, Profile] = {}
    plans: dict[str, dict[int, Plan]] = {m: {} for m in _PLANNED}
    for batch in args.batch_list:
        # whole-model compile plans are left out (each rank would compile its own replica first)
        prof = zoo_profile(args.model, batch, args.dtype, args.gpu, args.param_map).model_copy(
            update={"compiler_points": ()}
        )
        profiles[batch] = prof
        buckets = prof.param_bytes if nproc > 1 else 0
        headroom = calibration_for(prof.device.key).headroom
        best = tune(prof, budget - buckets, trials=args.trials, seed=0, headroom=headroom).best
        if best is None:
            continue
        plan = best.plan.with_(conv_rule="default", conv_algos={})  # the runtime leaves convolutions to the framework
        plans["plan"][batch] = plans["staggered"][batch] = plans["triggered"][batch] = plan
        if nproc == 1 or args.bus is not None:  # the trigger search prices the all-reduce too
            trig = ranks_prefetch_trigger(
                prof, plan, nproc, budget, stagger_slots=args.stagger_slots, link=args.link, allreduce_gbps=args.bus
            )
            plans["triggered"][batch] = trig.plan
    return profiles, plans


def _predict(args: argparse.Namespace, method: str, profile: Profile, plan: Plan | None) -> dict[str, Any] | None:
    """``simulate_ranks``'s step and peak for a row (None for checkpoint_sequential, or without an all-reduce rate)."""
    if method == "checkpoint" or (args.nproc > 1 and args.bus is None):
        return None
    if method == "unplanned":
        plan = Plan.uniform(profile.n_stages)
    if plan is None:
        return None
    slots = args.stagger_slots if method in ("staggered", "triggered") else 1
    r = simulate_ranks(profile, plan, args.nproc, stagger_slots=slots, link=args.link, allreduce_gbps=args.bus)
    return {
        "step_ms": round(r.step_ms, 3),
        "peak_bytes": r.peak_bytes,
        "samples_per_s": round(r.samples_per_s(profile.batch), 2),
        "contention_ms": round(r.contention_ms, 3),
        "allreduce_exposed_ms": round(r.allreduce_exposed_ms, 3),
        "link_source": r.link_source,
    }


def _run_method(args: argparse.Namespace, method: str, plans: dict[int, Plan], budget: int | None) -> list[dict]:
    """One method's rows from its own spawn of N ranks (a rank that dies ends the method with an error row)."""
    batches = tuple(b for b in args.batch_list if method not in _PLANNED or b in plans)
    cfg = _Config(
        model=args.model,
        params=args.param_map,
        dtype=args.dtype,
        method=method,
        budget_bytes=budget,
        warmup=args.warmup,
        steps=args.steps,
        slots=args.stagger_slots,
        link=args.link.to_data(),
        plans={b: p.model_dump(mode="json") for b, p in plans.items()},
        batches=batches,
    )
    return spawn_rows(_rank_trials, args.nproc, cfg, batches=batches, backend=args.backend, timeout_s=args.timeout)


def _table(result: dict[str, Any]) -> str:
    return rows_table(
        result,
        rate="samples_per_s",
        rate_label="samples/s",
        predicted=lambda _m, r: r.get("predicted"),
        label="predicted",
    )


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rank_options(ap, METHODS, budget="12GiB", batches="64,96,128,160,192", steps=5)
    ap.add_argument("--model", default="resnet50", help="zoo model")
    ap.add_argument("--params", default="", help="zoo parameters, e.g. image_size=64,num_classes=10")
    ap.add_argument("--dtype", default="float32", help="float32, or bfloat16/float16 under autocast")
    ap.add_argument("--stagger-slots", type=int, default=None, help="stagger slots (default: --nproc)")
    ap.add_argument("--allreduce-gbps", type=float, default=None, help="all-reduce bus GB/s (default: calibration)")
    ap.add_argument("--no-measure", action="store_true", help="never measure the link here (fair share instead)")
    args = ap.parse_args(argv)
    checked_rank_options(ap, args, METHODS)
    args.param_map = {k: int(v) for k, v in (kv.split("=") for kv in args.params.split(",") if kv)}
    args.stagger_slots = args.stagger_slots or args.nproc
    if not 1 <= args.stagger_slots <= args.nproc:
        ap.error(f"--stagger-slots must be in 1..{args.nproc}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    import optuna
    import torch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    allocator = start_ranks(args.nproc, args.cpu)

    from memtune.profiler.devices import gpu_key

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    args.backend = "gloo" if args.cpu else "nccl"
    props = torch.cuda.get_device_properties(0) if gpus else None
    args.gpu = gpu_key(props.name, props.total_memory) if props else "h100"
    budget = parse_budget(args.budget, props.total_memory if props else 80 << 30)
    probe = zoo_profile(args.model, args.batch_list[0], args.dtype, args.gpu, args.param_map)
    args.link, bus, link_note = _link_and_bus(probe, args.nproc, measure=not args.cpu and not args.no_measure)
    args.bus = args.allreduce_gbps if args.allreduce_gbps is not None else bus
    profiles, plans = _plans(args, args.nproc, budget)
    result: dict[str, Any] = {
        "model": args.model,
        "params": args.param_map,
        "dtype": args.dtype,
        "nproc": args.nproc,
        "gpu": args.gpu,
        "device": props.name if props else "cpu",
        "budget_bytes": budget,
        "stagger_slots": args.stagger_slots,
        "link": {"source": args.link.source, "from": link_note, "shared_link_gbps": args.link.to_data()},
        "allreduce_gbps": args.bus,
        "profiles": {b: p.source for b, p in profiles.items()},
        "plans": {m: {b: p.compact() for b, p in by.items()} for m, by in plans.items()},
        **result_fields("ddp_plans", argv, allocator),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ddp-plans-{args.model}-{args.dtype}-x{args.nproc}.json"
    for method in args.method_list:
        by_batch = plans.get(method, {})
        rows = _run_method(args, method, by_batch, None if args.cpu else budget)
        for row in rows:
            if row["batch"] is not None:
                row["predicted"] = _predict(args, method, profiles[row["batch"]], by_batch.get(row["batch"]))
            if row["fits"]:
                row["samples_per_s"] = round(args.nproc * row["batch"] / (row["step_ms"] / 1e3), 2)
        record_method(result, method, rows, path)
    print(_table(result), end="")
    print(f"written to {path}")


if __name__ == "__main__":
    main()

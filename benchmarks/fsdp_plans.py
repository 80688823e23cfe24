"""A Llama-style model sharded by FSDP2 on N GPUs of one host within a per-GPU budget: the largest batch and its speed.

    python -m benchmarks.fsdp_plans OUT --nproc 2 --budget 14GiB --batches 1,2,4,6,8

The model (Hugging Face ``LlamaForCausalLM`` built from a config: 16 layers, hidden 2048, intermediate 5632, 16
heads, vocabulary 32,000, sequence 2,048 by default; 0.95 B parameters) trains with AdamW under bf16 autocast. Its
parameters, gradients and AdamW state (16 bytes a parameter, 15.2 GB) do not fit one GPU's 14 GiB budget, so every
method shards them with FSDP2 (``fully_shard`` on each decoder layer, then the root) over ``--nproc`` ranks, each
running its own share of the global batch (``--batches`` are per GPU):

* ``fsdp``: FSDP2 alone;
* ``hf_checkpointing``: FSDP2 with Hugging Face gradient checkpointing (``gradient_checkpointing_enable``,
  non-reentrant), the usual answer;
* ``plan``: FSDP2 with memtune's activation plan on each rank (``memtune.tuner.runtime.fsdp.planned_fsdp``): the model
is
  profiled unsharded on one GPU at the per-rank batch (``memtune.profile``), the profile rewritten as one rank's
  (``memtune.tuner._sharding.sharded_profile``, NOTE [ Sharded ranks ]) and searched within the budget with AdamW's
  state.

Per method, in N processes of one group (``memtune.tuner.runtime.ddp.spawn_ranks``: NCCL with NVLink multicast off, or
gloo on CPU), from the smallest batch up to the first that does not train: ``--warmup`` then ``--steps`` timed steps
(forward with labels, Hugging Face's loss, backward, AdamW) under ``budget_guard`` at ``--budget``. Each row: the
step (median ms, the slowest rank's), tokens per second of all GPUs, the largest peak allocated on any rank, and for
``fsdp`` and ``plan`` the simulated step and peak of one rank (collectives not priced). Writes
``OUT/fsdp-plans-llama-<dtype>-x<N>.json`` and prints the table. ``--cpu`` runs a gloo smoke test with no budget.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
from dataclasses import dataclass, field
from typing import Any

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

__all__ = ["METHODS", "main"]

METHODS = ("fsdp", "hf_checkpointing", "plan")
LLAMA = {
    "num_hidden_layers": 16,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 32000,
}
SEQ = 2048


@dataclass(frozen=True)
class _Config:
    """What every rank of one method's run needs (pickled to the spawned ranks)."""

    llama: dict[str, int]
    seq: int
    dtype: str
    method: str
    budget_bytes: int | None  # None on CPU: no cap
    warmup: int
    steps: int
    batches: tuple[int, ...] = ()
    plans: dict[int, dict[str, Any]] = field(default_factory=dict)  # per batch, the plan's JSON (method ``plan``)
    rows_file: str | None = None  # NOTE [ A rank out of memory ] in benchmarks.ranked


def _model(cfg: _Config, device: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    options: dict[str, Any] = {**cfg.llama, "max_position_embeddings": cfg.seq, "use_cache": False}
    config = LlamaConfig(**options)
    with torch.device(device):
        return LlamaForCausalLM(config)


def _tokens(cfg: _Config, batch: int, rank: int, device: Any) -> Any:
    import torch

    g = torch.Generator().manual_seed(1 + rank)
    return torch.randint(0, cfg.llama["vocab_size"], (batch, cfg.seq), generator=g).to(device)


def _measure(cfg: _Config, batch: int, rank: int) -> dict[str, Any]:
    """One batch on this rank: median step ms, peak bytes allocated, or the error that stopped it."""
    import torch

    from memtune.tuner import Plan, shard_units
    from memtune.tuner.runtime import PlanOutOfMemoryError, budget_guard
    from memtune.tuner.runtime.fsdp import planned_fsdp, shard

    cuda = torch.cuda.is_available() and cfg.budget_bytes is not None
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    model = _model(cfg, device)
    pm = None
    try:
        if cfg.method == "plan":
            pm = planned_fsdp(model, Plan.model_validate(cfg.plans[batch]))
            run: Any = pm
        else:
            if cfg.method == "hf_checkpointing":
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            layers = [f"model.layers.{i}" for i in range(cfg.llama["num_hidden_layers"])]
            run = shard(model, shard_units(layers))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        ids = _tokens(cfg, batch, rank, device)
        half = cfg.dtype != "float32" and cuda
        autocast = torch.autocast("cuda", dtype=getattr(torch, cfg.dtype)) if half else contextlib.nullcontext()

        def step() -> None:
            with autocast:
                loss = run(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        guard = budget_guard(cfg.budget_bytes, pm) if cuda and cfg.budget_bytes else None
        return measure_steps(step, warmup=cfg.warmup, steps=cfg.steps, cuda=cuda, guard=guard)
    except (torch.OutOfMemoryError, PlanOutOfMemoryError) as exc:  # sharding or wrapping the model
        return {"ok": False, "ms": None, "peak": None, "error": f"out of memory: {str(exc).splitlines()[0][:200]}"}
    finally:
        del model, pm
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def _rank_trials(rank: int, world: int, cfg: _Config) -> list[dict[str, Any]]:
    """This rank's rows (``benchmarks.ranked.rank_rows``)."""
    return rank_rows(rank, world, cfg.batches, lambda b: _measure(cfg, b, rank), cfg.rows_file)


def _plans(args: argparse.Namespace, cfg: _Config) -> tuple[dict[int, Any], dict[int, dict[str, Any]]]:
    """Per batch: memtune's plan for one rank within the budget, and what was simulated for ``fsdp`` and ``plan``."""
    import torch

    import memtune
    from memtune.tuner import Plan, planning_headroom, sharded_profile, simulate, tune

    device = torch.device("cpu" if args.cpu else "cuda", 0)
    plans: dict[int, Any] = {}
    predicted: dict[int, dict[str, Any]] = {}
    for batch in args.batch_list:
        model = _model(cfg, device)
        ids = _tokens(cfg, batch, 0, device)
        prof = memtune.profile(
            model, {"input_ids": ids, "labels": ids}, loss_fn=lambda o: o.loss, dtype=args.dtype, progress=False
        )
        del model, ids
        gc.collect()
        if not args.cpu:
            torch.cuda.empty_cache()  # the ranks' budgets are theirs: this process keeps no cached blocks
        rank_prof = sharded_profile(prof, args.nproc)
        keep = Plan.uniform(prof.n_stages).model_copy(update={"stages": tuple(s.name for s in prof.stages)})
        plain = simulate(rank_prof, keep, optimizer="adam")
        rows: dict[str, dict[str, Any]] = {"fsdp": {"step_ms": round(plain.step_ms, 3), "peak_bytes": plain.peak_bytes}}
        budget = args.budget_bytes or plain.peak_bytes
        # without a budget the budget is the unplanned peak itself: no headroom, or a model whose peak is mostly the
        # bytes a step holds throughout (cuBLAS's workspaces, NOTE [ Memory held before the step ]) has no plan
        headroom = planning_headroom(prof) if args.budget_bytes else 0.0
        result = tune(rank_prof, budget, trials=args.trials, seed=0, optimizer="adam", headroom=headroom)
        if result.best is not None:
            plans[batch] = result.best.plan
            rows["plan"] = {
                "step_ms": round(result.best.step_ms, 3),
                "peak_bytes": result.best.peak_bytes,
                "label": result.best.plan.compact(),
            }
        predicted[batch] = rows
    return plans, predicted


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rank_options(ap, METHODS, budget="14GiB", batches="1,2,4,6,8", steps=3)
    ap.add_argument("--llama", default="", help="config overrides, e.g. num_hidden_layers=2,hidden_size=64")
    ap.add_argument("--seq", type=int, default=SEQ, help="tokens per sequence")
    ap.add_argument("--dtype", default="bfloat16", help="float32, or bfloat16/float16 under autocast")
    args = ap.parse_args(argv)
    checked_rank_options(ap, args, METHODS)
    overrides = {k: int(v) for k, v in (kv.split("=") for kv in args.llama.split(",") if kv)}
    unknown = sorted(set(overrides) - set(LLAMA))
    if unknown:
        ap.error(f"--llama: unknown {unknown}; choose from {', '.join(LLAMA)}")
    args.llama_config = {**LLAMA, **overrides}
    return args


def _table(result: dict[str, Any]) -> str:
    def simulated(method: str, row: dict[str, Any]) -> dict[str, Any] | None:
        return (result["predicted"].get(str(row["batch"])) or {}).get(method)

    return rows_table(result, rate="tokens_per_s", rate_label="tokens/s", predicted=simulated, label="simulated")


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    import optuna
    import torch

    from memtune.tuner import parse_budget

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    allocator = start_ranks(args.nproc, args.cpu)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    props = torch.cuda.get_device_properties(0) if gpus and not args.cpu else None
    args.budget_bytes = None if args.cpu else parse_budget(args.budget, props.total_memory if props else 80 << 30)
    base = _Config(args.llama_config, args.seq, args.dtype, "", args.budget_bytes, args.warmup, args.steps)
    plans, predicted = _plans(args, base)
    params = sum(p.numel() for p in _model(base, "meta").parameters())
    result: dict[str, Any] = {
        "model": "LlamaForCausalLM",
        "config": args.llama_config,
        "seq": args.seq,
        "parameters": params,
        "dtype": args.dtype,
        "nproc": args.nproc,
        "device": props.name if props else "cpu",
        "budget_bytes": args.budget_bytes,
        "predicted": {str(b): rows for b, rows in predicted.items()},
        "plans": {str(b): p.compact() for b, p in plans.items()},
        **result_fields("fsdp_plans", argv, allocator),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"fsdp-plans-llama-{args.dtype}-x{args.nproc}.json"
    for method in args.method_list:
        batches = tuple(b for b in args.batch_list if method != "plan" or b in plans)
        cfg = _Config(
            args.llama_config,
            args.seq,
            args.dtype,
            method,
            args.budget_bytes,
            args.warmup,
            args.steps,
            batches,
            {b: p.model_dump(mode="json") for b, p in plans.items()} if method == "plan" else {},
        )
        backend = "gloo" if args.cpu else "nccl"
        rows = spawn_rows(_rank_trials, args.nproc, cfg, batches=batches, backend=backend, timeout_s=args.timeout)
        for row in rows:
            if row["fits"]:
                row["tokens_per_s"] = round(args.nproc * row["batch"] * args.seq / (row["step_ms"] / 1e3), 1)
        record_method(result, method, rows, path)
    print(_table(result), end="")
    print(f"written to {path}")


if __name__ == "__main__":
    main()

"""Per-layer prefetch triggers on the GPU: the same plan with one global lookahead and with the per-layer trigger's.

    python -m benchmarks.prefetch_trigger OUT [model:batch:dtype:fraction ...] [--trials 150] [--plans 2]
    python -m benchmarks.prefetch_trigger OUT --simulate-only      # no GPU: the plans and the simulator's figures

For each config (a zoo model, batch and dtype, and the budget as a fraction of the unconstrained simulated peak;
by default ResNet-50 and VGG-16, batch 128, fp32), on this GPU type's measured profile (the shipped one, or the one
``memtune bench`` would measure), plans are searched at the budget less the GPU type's calibrated headroom, as ``memtune
bench`` does (NOTE [ Headroom ] in ``memtune.tuner.search``). The candidates are the tuned plan and the offloading
baselines (``vdnn_all_p``, ``vdnn_conv_p``, ``vdnn_dyn``, ``hmms``, ``layup_cumulative``); for each the per-layer
trigger (NOTE [ Per-layer prefetch trigger ] in ``memtune.tuner._prefetch_trigger``) is chosen at the search budget, and
the ``--plans`` candidates where it gains the most over the best global lookahead within the budget (simulated step
saved, then peak) are kept. Each kept plan runs three ways, each row in a fresh process under the budget's cap (NOTE [
Bench isolation ] in ``memtune.tuner.measure.bench``):

* ``own``: the plan with its own global lookahead;
* ``best global``: the same actions with the global lookahead the trigger starts from (the fastest that fits);
* ``per-layer``: the same actions with the trigger's per-stage lookaheads.

A row holds the measured median step ms and peak bytes (``max_memory_allocated``) beside the simulated step, peak and
stall, and the bench's capped prediction. Rows stop being measured once ``--deadline-s`` is spent (the rest are listed
as skipped). VGG-16 b128 fp32 has no cuDNN algorithm tables in its shipped H100 profile: no plan goes below 88% of its
peak, which is the first convolutions' backward, so with the calibrated 10% headroom the budget at which its plans must
offload is 99% of the peak. Writes ``OUT/prefetch-trigger-<model>-b<batch>-<dtype>.json`` per config and prints a table.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from memtune.profiler import Profile
from memtune.tuner import POLICIES, Plan, SimResult, Simulator, prefetch_trigger, tune
from memtune.tuner.budget import search_budget
from memtune.tuner.calibration import calibration_for
from memtune.tuner.plan import PlanKind

__all__ = ["CONFIGS", "Config", "Variant", "main", "parse_config", "variants_for"]

CONFIGS = ("resnet50:128:float32:0.5", "vgg16:128:float32:0.99")
CANDIDATES = ("vdnn_all_p", "vdnn_conv_p", "vdnn_dyn", "hmms", "layup_cumulative")
GiB = 1 << 30


@dataclass(frozen=True)
class Config:
    """One benchmark configuration: zoo model, batch, dtype and the budget as a fraction of the unconstrained
    simulated peak."""

    model: str
    batch: int
    dtype: str
    fraction: float

    @property
    def tag(self) -> str:
        return f"{self.model}-b{self.batch}-{self.dtype}"


def parse_config(text: str) -> Config:
    """``model:batch:dtype:fraction``, e.g. ``resnet50:128:float32:0.5``.

    Raises:
        ValueError: not four fields, the batch not an integer or the fraction not in (0, 1].
    """
    parts = text.split(":")
    if len(parts) != 4 or not parts[1].isdigit():
        raise ValueError(f"a config is model:batch:dtype:fraction, e.g. resnet50:128:float32:0.5, not {text!r}")
    fraction = float(parts[3])
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"{text!r}: the budget fraction of the unconstrained peak must be in (0, 1], not {fraction}")
    return Config(parts[0], int(parts[1]), parts[2], fraction)


@dataclass(frozen=True)
class Variant:
    """One plan to measure and what the simulator says of it (ms, bytes)."""

    source: str  # the candidate: "tuned" or a baseline's name
    variant: str  # "own", "best global" or "per-layer"
    plan: Plan
    simulated_step_ms: float
    simulated_peak_bytes: int
    simulated_stall_ms: float

    @property
    def name(self) -> str:
        return f"{self.source}: {self.variant}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "variant": self.variant,
            "lookahead": self.plan.prefetch_lookahead,
            "lookaheads": list(self.plan.prefetch_lookaheads) if self.plan.prefetch_lookaheads else None,
            "actions": self.plan.compact(),
            "simulated_step_ms": round(self.simulated_step_ms, 4),
            "simulated_peak_bytes": self.simulated_peak_bytes,
            "simulated_stall_ms": round(self.simulated_stall_ms, 4),
        }


def _variant(source: str, variant: str, plan: Plan, r: SimResult) -> Variant:
    return Variant(source, variant, plan, r.step_ms, r.peak_bytes, r.stall_ms)


def variants_for(
    profile: Profile, budget_bytes: int, search_bytes: int, *, trials: int, headroom: float, plans: int
) -> list[list[Variant]]:
    """The kept candidates, each as its ``own``, ``best global`` (where that differs) and ``per-layer`` variants, the
    trigger's largest simulated gain first (module docstring). A candidate is kept where the trigger's plan fits
    ``search_bytes`` and is faster or smaller than the best global lookahead that fits."""
    sim = Simulator(profile)
    found = tune(profile, budget_bytes, trials=trials, headroom=headroom, seed=0).best
    named = [("tuned", found.plan)] if found is not None and found.plan.kind is not PlanKind.WHOLE_COMPILE else []
    named += [(name, POLICIES[name](profile, search_bytes)) for name in CANDIDATES]
    named = [(source, plan.with_(prefetch_lookaheads=None)) for source, plan in named]  # own: one global lookahead
    if not profile.has_conv_algos:  # no tables: every convolution rule runs the framework's algorithms
        named = [(s, p.with_(conv_rule="default", conv_workspace_limit_bytes=None, conv_algos={})) for s, p in named]
    scored: list[tuple[tuple[float, int], list[Variant]]] = []
    seen: set[str] = set()
    for source, plan in named:
        key = plan.model_dump_json(exclude={"label"})
        if key in seen:
            continue
        seen.add(key)
        trig = prefetch_trigger(profile, plan, search_bytes, simulator=sim)
        own = sim.run(plan)
        r = trig.result
        if not trig.fits or trig.plan.prefetch_lookaheads is None:
            continue
        # against the best fitting global lookahead (the trigger's start): what per-layer triggers add
        gain = (trig.start.step_ms - r.step_ms, trig.start.peak_bytes - r.peak_bytes)
        if gain[0] <= 1e-9 and gain[1] <= 0:
            continue
        rows = [_variant(source, f"own (lookahead {plan.prefetch_lookahead})", plan, own)]
        if trig.start_lookahead != plan.prefetch_lookahead:
            start = plan.with_(prefetch_lookahead=trig.start_lookahead)
            rows.append(_variant(source, f"best global (lookahead {trig.start_lookahead})", start, trig.start))
        rows.append(_variant(source, "per-layer", trig.plan, r))
        scored.append(((-gain[0], -gain[1]), rows))
    scored.sort(key=lambda s: s[0])
    return [rows for _, rows in scored[:plans]]


def _measure(
    cfg: Config, profile: Profile, budget_bytes: int, chosen: list[list[Variant]], args: argparse.Namespace, t0: float
) -> tuple[list[dict[str, Any]], list[str]]:
    """Measure the unconstrained step and every variant on the GPU, until the deadline; rows as dicts, skipped
    names."""
    from memtune.profiler import build
    from memtune.tuner.measure.bench import bench_plans

    factory = functools.partial(build, cfg.model, {})
    measured: list[dict[str, Any]] = []
    skipped: list[str] = []
    first = True
    for rows in chosen:
        if time.monotonic() - t0 > args.deadline_s:
            skipped += [v.name for v in rows]
            continue
        plans = [(v.name, "variant", v.plan) for v in rows]
        got = bench_plans(
            None,
            profile,
            cfg.batch,
            cfg.dtype,
            budget_bytes,
            plans,
            pytorch_builtins=False,
            warmup=args.warmup,
            iters=args.iters,
            chain_factory=factory,
            unconstrained=first,
            progress=lambda name: print(f"  measuring {name}", flush=True),
        )
        if first:
            measured.append({"variant": None, "row": got[0].to_dict()})
            got = got[1:]
        first = False
        measured += [{"variant": v.to_dict(), "row": row.to_dict()} for v, row in zip(rows, got, strict=True)]
    return measured, skipped


def _profile(cfg: Config, simulate_only: bool, gpu: str) -> Profile:
    if simulate_only:
        from benchmarks.common import zoo_profile

        return zoo_profile(cfg.model, cfg.batch, cfg.dtype, gpu=gpu)
    from memtune.tuner.measure.first_use import zoo_profile as present_profile

    return present_profile(cfg.model, None, cfg.batch, cfg.dtype, progress=lambda what: print(f"{what} …"))


def _print(cfg: Config, chosen: list[list[Variant]], measured: list[dict[str, Any]]) -> None:
    by_name = {m["row"]["name"]: m["row"] for m in measured}
    print(f"\n{cfg.tag} at {cfg.fraction:.0%} of the unconstrained simulated peak")
    print("| plan | lookaheads | simulated ms | measured ms | simulated GiB | measured GiB | fits |")
    print("|---|---|---|---|---|---|---|")
    for rows in chosen:
        for v in rows:
            row = by_name.get(v.name, {})
            ms = f"{row['step_ms']:.1f}" if row.get("step_ms") is not None else row.get("error") or "not measured"
            gib = f"{row['peak_bytes'] / GiB:.2f}" if row.get("peak_bytes") is not None else "-"
            la = "per stage" if v.plan.prefetch_lookaheads else f"global {v.plan.prefetch_lookahead}"
            print(
                f"| {v.name} | {la} | {v.simulated_step_ms:.1f} | {ms} | {v.simulated_peak_bytes / GiB:.2f} | {gib} "
                f"| {row.get('fits', '-')} |"
            )


def run_config(cfg: Config, args: argparse.Namespace, t0: float) -> dict[str, Any]:
    """Choose, measure (unless ``--simulate-only``) and describe one config; returns what is written as JSON."""
    profile = _profile(cfg, args.simulate_only, args.gpu)
    peak = Simulator(profile).run(Plan.uniform(profile.n_stages)).peak_bytes
    budget = int(cfg.fraction * peak)
    headroom = calibration_for(profile.device.key).headroom if args.headroom is None else args.headroom
    searched = search_budget(budget, headroom)
    chosen = variants_for(profile, budget, searched, trials=args.trials, headroom=headroom, plans=args.plans)
    measured, skipped = ([], []) if args.simulate_only else _measure(cfg, profile, budget, chosen, args, t0)
    _print(cfg, chosen, measured)
    return {
        "model": cfg.model,
        "batch": cfg.batch,
        "dtype": cfg.dtype,
        "device": profile.device.model_dump(),
        "profile_source": profile.source,
        "fraction": cfg.fraction,
        "unconstrained_simulated_peak_bytes": peak,
        "budget_bytes": budget,
        "headroom": headroom,
        "search_budget_bytes": searched,
        "variants": [v.to_dict() | {"plan": v.plan.model_dump(mode="json")} for rows in chosen for v in rows],
        "measured": measured,
        "skipped": skipped,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="directory for the JSON results")
    ap.add_argument("configs", nargs="*", default=list(CONFIGS), help="model:batch:dtype:fraction")
    ap.add_argument("--trials", type=int, default=150, help="Optuna trials of the tuned candidate")
    ap.add_argument("--plans", type=int, default=2, help="candidates measured per config")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--deadline-s", type=float, default=330.0, help="measure no new plan after this many seconds")
    ap.add_argument("--headroom", type=float, default=None, help="default: the GPU type's calibrated headroom")
    ap.add_argument("--simulate-only", action="store_true", help="no GPU: choose the plans and simulate them")
    ap.add_argument("--gpu", default="h100", help="with --simulate-only: whose shipped profiles to use")
    args = ap.parse_args(argv)
    try:
        configs = [parse_config(c) for c in args.configs]
    except ValueError as exc:
        ap.error(str(exc))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not args.simulate_only:
        from memtune.tuner.runtime.guard import configure_allocator

        print(f"allocator: PYTORCH_CUDA_ALLOC_CONF={configure_allocator()}")
    from benchmarks.common import environment

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    for cfg in configs:
        result = run_config(cfg, args, t0)
        result["environment"] = environment()
        result["wall_s"] = round(time.monotonic() - t0, 1)
        path = args.out / f"prefetch-trigger-{cfg.tag}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

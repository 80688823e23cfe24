"""The search's optimality gap against the exact optimum, on chains small enough to enumerate.

    python -m benchmarks.optimality_gap [--stages 7] [--trials 300] [--seeds 3]

Chains: the first ``--stages`` stages of VGG-16, ResNet-50 and AlexNet at batch 256 and of the GPT-style
model at batch 16 (H200 profiles). The exact optimum enumerates every plan of the exact space (3^n actions × 9
lookaheads × (n + 1) sync settings: ``layer``, and ``deferred`` with each ``sync_delay`` 1..n; ``memtune.tuner._exact``)
once per chain, keeping its time–memory Pareto front. Budgets are the peaks of front points at 10%, 40% and 70% of the
front (ordered from the smallest peak up), so every budget is feasible and binding: a smaller budget would make the
exact optimum slower. Convolution algorithm tables are removed from the profiles, so both explore the same actions
(the framework's algorithms). Gap = (search step ms − exact step ms) / exact step ms. The search may also give a
plan per-layer prefetch triggers (``per_layer_prefetch``), which the exact space lacks, so a gap can be negative.

Seven stages (157,464 plans a chain) keep the whole run within 10 minutes on the 2-core development machine; nine
(1,771,470 plans a chain) took 3–4.5 minutes of enumeration per chain on 2026-11-21, and more since. The table is
deterministic (fixed seeds); how long each enumeration took goes to standard error.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import optuna

from benchmarks.common import environment, zoo_profile
from memtune.tuner import exact_front, tune

__all__ = ["main"]

CHAINS = [("vgg16", 256, {}), ("resnet50", 256, {}), ("alexnet", 256, {}), ("gpt", 16, {"layers": 12})]
FRACTIONS = (0.1, 0.4, 0.7)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--stages", type=int, default=7)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"environment: {environment()}")
    print("| chain | profile | budget (front point) | exact ms | search ms (worst seed) | gap (worst) | gap (mean) |")
    print("|---|---|---|---|---|---|---|")
    gaps = []
    for model, batch, params in CHAINS:
        full = zoo_profile(model, batch, params=params).prefix(args.stages)
        profile = full.model_copy(update={"stages": tuple(st.model_copy(update={"convs": ()}) for st in full.stages)})
        t0 = time.perf_counter()
        front = exact_front(profile)
        enum_s = time.perf_counter() - t0
        by_peak = sorted(peak for _, peak, _ in front.points)
        for frac in FRACTIONS:
            budget = by_peak[round(frac * (len(by_peak) - 1))]
            exact = front.best_within(budget)
            if exact.plan is None:
                raise AssertionError("budgets at or above the smallest peak are always feasible")
            found = []  # the search on the simulator alone (no placement ranking), as the exact optimum
            for seed in range(args.seeds):
                r = tune(profile, budget, trials=args.trials, seed=seed, placement=False)
                assert r.best is not None
                found.append(r.best.step_ms)
            g = [(s - exact.step_ms) / exact.step_ms for s in found]
            gaps.extend(g)
            print(
                f"| {profile.model} b{batch} | {profile.source} | {frac:.0%} | {exact.step_ms:.2f} | "
                f"{max(found):.2f} | {max(g):.2%} | {statistics.mean(g):.2%} |"
            )
        print(f"<!-- {profile.model}: {front.evaluated} plans, front of {len(by_peak)} -->")
        print(f"{profile.model}: enumerated in {enum_s:.0f} s", file=sys.stderr, flush=True)
    print(f"\nworst gap over all chains, budgets and seeds: {max(gaps):.2%}; mean {statistics.mean(gaps):.2%}")


if __name__ == "__main__":
    main()

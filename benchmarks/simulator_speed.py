"""Simulator plan evaluations per second on one core, for VGG-16 and ResNet-50 (batch 256, H200 profile).

    python -m benchmarks.simulator_speed [--plans 3000]

Plans are random (seeded) mixes of keep/offload/recompute with random lookahead and sync, the kind of
plans the search evaluates; timing covers ``Simulator.run`` as the search calls it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.common import environment, zoo_profile
from tuner import Plan, Simulator
from tuner.plan import stage_actions

__all__ = ["main"]


def measure(model: str, plans: int, seed: int = 0) -> tuple[int, float, str]:
    profile = zoo_profile(model, 256)
    sim = Simulator(profile)
    rng = random.Random(seed)
    batch = [
        Plan(
            actions=tuple(rng.choice(acts) for acts in stage_actions(profile)),
            prefetch_lookahead=rng.randint(0, 8),
            sync=rng.choice(["deferred", "layer"]),
        )
        for _ in range(plans)
    ]
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        for plan in batch:
            sim.run(plan, check=False)
        rates.append(plans / (time.perf_counter() - t0))
    return profile.n_stages, statistics.median(rates), profile.source


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--plans", type=int, default=3000)
    args = ap.parse_args()
    print(f"environment: {environment()}")
    print("| model | stages | profile | plan evaluations / s (median of 3) |")
    print("|---|---|---|---|")
    for model in ("vgg16", "resnet50"):
        n, rate, source = measure(model, args.plans)
        print(f"| {model} b256 | {n} | {source} | {rate:,.0f} |")


if __name__ == "__main__":
    main()

"""How fast any plan can be, per budget, beside the search's best (NOTE [ Budget bound ] in ``memtune.tuner.bound``).

    python -m benchmarks.budget_bound vgg16:256:float32 resnet50:256:float32 gpt:16:bfloat16 --fractions 0.6

Printed per budget: the bound's step and its ratio to the unconstrained step (the goal is 1.10× at
60% of the peak), how it pays (offload, re-made bytes, algorithm, waits), and the search's best plan: its simulated
step, and in brackets what the search ranked it by (the step plus the allocator retries the placement model
predicts under the budget, NOTE [ Placement ranking ] in ``memtune.tuner.search``; ``--no-placement``: the step alone).
"""

from __future__ import annotations

import argparse

from benchmarks.common import budget_table_args
from memtune.tuner import Plan, Simulator, tune
from memtune.tuner.bound import step_lower_bound

__all__ = ["main"]

GIB = float(1 << 30)


def _no_placement(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--no-placement",
        dest="placement",
        action="store_false",
        help="rank the search's plans by the simulator alone, without the allocator retries it predicts",
    )


def main() -> None:
    args, profiles, fractions = budget_table_args(__doc__, fractions="0.6", trials=300, extra=_no_placement)
    print(
        "| config | budget | bound (ms) | bound / unconstrained | on host / re-made (GiB) | "
        "re-runs / algorithms / waits (ms) | binding moments | search's best, simulated (ms, ×) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for cfg, prof in profiles:
        sim = Simulator(prof)
        peak = sim.run(Plan.uniform(prof.n_stages)).peak_bytes
        for frac in fractions:
            budget = int(frac * peak)
            b = step_lower_bound(sim, budget)
            best = tune(prof, budget, trials=args.trials, seed=0, placement=args.placement).best
            found = "no plan fits"
            if best is not None:
                alone = sim.run(best.plan).step_ms
                found = f"{alone:.1f}, {alone / b.unconstrained_ms:.3f}× ({best.step_ms:.1f} with retries)"
            where = ", ".join(b.binding[:3]) + (f" (+{len(b.binding) - 3})" if len(b.binding) > 3 else "")
            print(
                f"| {cfg} | {frac:.0%} ({budget / GIB:.2f} GiB) | {b.step_ms:.1f} | {b.ratio:.3f}× | "
                f"{b.offload_bytes / GIB:.2f} / {b.recompute_bytes / GIB:.2f} | "
                f"{b.recompute_ms:.1f} / {b.algorithm_ms:.1f} / {b.stall_ms:.1f} | {where} | {found} |",
                flush=True,
            )
        print(f"<!-- {cfg}: unconstrained {b.unconstrained_ms:.1f} ms, peak {peak / GIB:.2f} GiB -->")


if __name__ == "__main__":
    main()

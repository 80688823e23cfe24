"""Do offload plans slow down because of the budget cap? Measure tuned plans with and without it.

    python scripts/cap_experiment.py resnet50 256 float32 0.6

Tunes plans at a budget (a fraction of the unconstrained simulated peak), then measures each under
``budget_guard(budget)`` and under a cap of the whole GPU, printing step ms and peak beside the prediction.
"""

from __future__ import annotations

import sys

import optuna
import torch

from api.cli import resolve_profile
from profiler.zoo import build
from tuner.plan import Action, Plan
from tuner.runtime.bench import bench_plans
from tuner.search import tune
from tuner.simulator import simulate

__all__: list[str] = []


def main() -> None:
    model, batch, dtype, frac = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    chain = build(model, {})
    prof = resolve_profile(chain, batch, dtype, "h200")
    peak = simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes
    budget = int(frac * peak)
    best = tune(prof, budget, trials=300).best
    assert best is not None
    plans = [
        ("tuned", "tuned", best.plan),
        ("tuned, layer", "variant", best.plan.with_(sync="layer")),
        ("all offload, deferred", "variant", Plan.uniform(prof.n_stages, Action.OFFLOAD)),
    ]
    total = torch.cuda.get_device_properties(0).total_memory
    for cap_name, cap in (("capped", budget), ("uncapped", int(total * 0.95))):
        rows = bench_plans(chain, prof, batch, dtype, cap, plans, pytorch_builtins=False, warmup=2, iters=6)
        for r in rows:
            print(
                f"{cap_name:9s} {r.name:24s} step {r.step_ms and round(r.step_ms, 1)} ms (sim "
                f"{r.predicted_step_ms and round(r.predicted_step_ms, 1)}) peak "
                f"{r.peak_bytes and round(r.peak_bytes / 2**30, 2)} GiB (sim "
                f"{r.predicted_peak_bytes and round(r.predicted_peak_bytes / 2**30, 2)}) {r.error or ''}"[:200]
            )


if __name__ == "__main__":
    main()

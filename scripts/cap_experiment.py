"""Do offload plans slow down because of the budget cap? Measure tuned plans with and without it.

    python scripts/cap_experiment.py OUT.json resnet50:256:float32:0.6 [vgg16:256:float32:0.6 ...]

For each configuration: tunes a plan at a budget (a fraction of the unconstrained simulated peak), then
measures it and a few variants under ``budget_guard(budget)`` and under a cap of the whole GPU, printing
step ms, peak allocated and peak reserved beside the prediction. Rows go to OUT.json as they come.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import torch
from configs import read_config

from memtune.tuner import Action, Plan, tune
from memtune.tuner.measure.bench import BenchRow, bench_plans

__all__: list[str] = []


def _gib(b: int | None) -> float | None:
    return None if b is None else round(b / 2**30, 2)


def main() -> None:
    out = Path(sys.argv[1])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results: list[dict[str, object]] = []
    for cfg in sys.argv[2:]:
        c = read_config(cfg)
        chain, prof, batch, dtype, budget = c.chain, c.profile, c.batch, c.dtype, c.budget_bytes
        n = prof.n_stages
        best = tune(prof, budget, trials=300).best
        plans = [("all offload, layer", "variant", Plan.uniform(n, Action.OFFLOAD, sync="layer"))]
        plans.append(("all offload, deferred 1", "variant", Plan.uniform(n, Action.OFFLOAD, sync_delay=1)))
        if best is not None:
            plans.insert(0, ("tuned", "tuned", best.plan))
            plans.insert(1, ("tuned, layer", "variant", best.plan.with_(sync="layer")))
        total = torch.cuda.get_device_properties(0).total_memory
        for cap_name, cap in (("capped", budget), ("uncapped", int(total * 0.95))):

            def show(r: BenchRow, cfg: str = cfg, cap_name: str = cap_name, cap: int = cap) -> None:
                print(
                    f"{cfg} {cap_name:9s} {r.name:24s} step {r.step_ms and round(r.step_ms, 1)} ms (sim "
                    f"{r.predicted_step_ms and round(r.predicted_step_ms, 1)}) peak {_gib(r.peak_bytes)} GiB (sim "
                    f"{_gib(r.predicted_peak_bytes)}) reserved {_gib(r.reserved_bytes)} {r.error or ''}"[:240],
                    flush=True,
                )
                results.append({"config": cfg, "cap": cap_name, "cap_bytes": cap, **r.to_dict()})
                out.write_text(json.dumps(results, indent=1) + "\n")

            bench_plans(chain, prof, batch, dtype, cap, plans, pytorch_builtins=False, warmup=2, iters=6, on_row=show)


if __name__ == "__main__":
    main()

"""One plan of the compiled-regions benchmark run uncapped: its simulated peak beside the peak it reaches on this GPU.

    python scripts/region_plan_peak.py benchmarks/results/h100/compiled-regions resnet50 0.3

Reads ``<folder>/<model>.json`` (``benchmarks.compiled_regions``), takes the plan served at the given fraction of the
compiled peak and the region profile it was priced on (the ``partitions`` entry with its regions, budget and save
rule), simulates it (``memtune.tuner.simulator.simulate``), and trains the model under it without a cap: one warm-up
step and three timed ones (``memtune.tuner.measure.module_bench.measure_step``, the output held through the
backward, as the benchmark measures). Prints the predicted and the measured peak, allocated, in GiB, and the step.
It is how a plan that ran out of memory under ``budget_guard`` is told apart from a simulator that under-predicts it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GiB = float(1 << 30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("model")
    ap.add_argument("fraction", type=float)
    args = ap.parse_args()

    import torch

    import memtune
    from benchmarks.compiled_regions import build
    from memtune.profiler import Profile
    from memtune.tuner import Plan, simulate
    from memtune.tuner.measure.module_bench import measure_step

    row = json.loads((args.folder / f"{args.model}.json").read_text())
    entry = next((p for p in row.get("plans", []) if p["fraction"] == args.fraction and "plan" in p), None)
    if entry is None:
        raise SystemExit(f"{args.model}: no plan served at {args.fraction:g} in {args.folder}")
    plan = Plan.model_validate(entry["plan"])
    priced = next(
        (
            e
            for e in row["partitions"]
            if tuple(e["regions"]) == plan.stages
            and e["budget"] == plan.compile_budget
            and e.get("saves") == plan.compile_saves
            and "profile" in e
        ),
        None,
    )
    if priced is None:
        raise SystemExit("the plan's region profile is not in the folder (a whole-model or eager plan?)")
    prof = Profile.from_json((args.folder / priced["profile"]).read_text())
    predicted = simulate(prof, plan.named(prof), optimizer=row["optimizer"]).peak_bytes
    torch.manual_seed(0)
    model, inputs, loss, optimizer = build(args.model, row.get("batch"))
    model.train()
    run = memtune.planned(model, plan)
    got = measure_step(model, run, inputs, loss, warmup=1, steps=3, optimizer=optimizer, output_held=True)
    print(
        f"{args.model} at {args.fraction:.0%} ({entry['budget_bytes'] / GiB:.2f} GiB), {plan.compact()}: predicted "
        f"{predicted / GiB:.2f} GiB, measured uncapped {got['peak_bytes'] / GiB:.2f} GiB allocated, "
        f"{got['reserved_bytes'] / GiB:.2f} GiB reserved, {got['step_ms']:.1f} ms on {torch.cuda.get_device_name()}"
    )


if __name__ == "__main__":
    main()

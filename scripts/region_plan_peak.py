"""One plan of the compiled-regions benchmark run uncapped: its simulated peak beside the peak it reaches on this GPU.

    python scripts/region_plan_peak.py benchmarks/results/h100/compiled-regions resnet50 0.3

Reads ``<folder>/<model>.json`` (``benchmarks.compiled_regions``), takes the plan served at the given fraction of the
compiled peak and the region profile it was priced on (the ``partitions`` entry with its regions, budget and save
rule), simulates it (``memtune.tuner.simulator.simulate``), and trains the model under it without a cap: one warm-up
step and three timed ones (``memtune.tuner.measure.module_bench.measure_step``, the output held through the
backward, as the benchmark measures). Prints the predicted and the measured peak, allocated, in GiB, and the step.
It is how a plan that ran out of memory under ``budget_guard`` is told apart from a simulator that under-predicts it.

With ``--trace`` it also finds where: one more step runs with hooks at each stage's forward (start, end, and its re-run
in the backward) and backward (when the backward reaches the stage's output), which read the allocator's live and
peak bytes between them (``torch.cuda.max_memory_allocated``, reset at each hook), and prints them stage by stage
beside the simulated timeline's live bytes, grouped the same way.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

GiB = float(1 << 30)
MiB = float(1 << 20)


def simulated_phases(timeline: tuple[tuple[float, int, str], ...]) -> dict[str, tuple[int, int]]:
    """The simulated timeline's live bytes grouped by phase: ``"fwd k"`` from stage ``k``'s forward start, ``"bwd k"``
    for stage ``k``'s backward with the prefetches, re-runs and (for the last stage) the loss before it; per phase its
    live bytes at the first event and its maximum."""
    phases: dict[str, tuple[int, int]] = {}
    pending: list[int] = []
    for _, live, label in timeline:
        words = label.split()
        if words[0] in ("fwd", "bwd") and words[1].isdigit():
            key = f"{words[0]} {words[1]}"
            lives = [*pending, live]
            pending = []
            first, top = phases.get(key, (lives[0], lives[0]))
            phases[key] = (first, max(top, *lives))
        else:
            pending.append(live)
    return phases


def traced_phases(model: Any, stages: tuple[str, ...], step: Callable[[], None]) -> dict[str, tuple[int, int]]:
    """Run ``step`` once with hooks at each stage's forward and backward: per phase (as ``simulated_phases`` names
    them, plus ``"rerun k"`` and ``"after"``) the allocated bytes at its start and the peak until the next phase."""
    import torch

    phases: dict[str, tuple[int, int]] = {}
    now = ["before", torch.cuda.memory_allocated()]
    backward = [False]

    def mark(key: str) -> None:
        top = torch.cuda.max_memory_allocated()
        first, old = phases.get(str(now[0]), (int(now[1]), 0))
        phases[str(now[0])] = (first, max(old, top))
        now[0], now[1] = key, torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    def hooks(k: int) -> tuple[Callable[..., None], Callable[..., None]]:
        def pre(_m: Any, _args: Any) -> None:
            mark(f"rerun {k}" if backward[0] else f"fwd {k}")

        def post(_m: Any, _args: Any, out: Any) -> None:
            if backward[0]:
                return
            first = (
                out
                if isinstance(out, torch.Tensor)
                else next(
                    (t for t in (out if isinstance(out, (tuple, list)) else ()) if isinstance(t, torch.Tensor)), None
                )
            )
            if first is not None and first.grad_fn is not None:

                def reached(_grads: Any) -> None:
                    backward[0] = True
                    mark(f"bwd {k}")

                first.grad_fn.register_prehook(reached)

        return pre, post

    handles = []
    for k, name in enumerate(stages):
        pre, post = hooks(k)
        m = model.get_submodule(name)
        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    try:
        step()
        mark("after")
        mark("end")
    finally:
        for h in handles:
            h.remove()
    phases.pop("end", None)
    return phases


def print_phases(sim: dict[str, tuple[int, int]], got: dict[str, tuple[int, int]]) -> None:
    """Simulated and measured phases side by side, MiB: start and peak of each, and the peak's miss."""
    print(f"{'phase':>10} {'sim start':>10} {'got start':>10} {'sim peak':>10} {'got peak':>10} {'miss':>8}")
    for key in [*sim, *(k for k in got if k not in sim)]:
        s0, s1 = sim.get(key, (0, 0))
        g0, g1 = got.get(key, (0, 0))
        miss = f"{(g1 - s1) / MiB:+8.0f}" if key in sim and key in got else ""
        print(f"{key:>10} {s0 / MiB:10.0f} {g0 / MiB:10.0f} {s1 / MiB:10.0f} {g1 / MiB:10.0f} {miss}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("model")
    ap.add_argument("fraction", type=float)
    ap.add_argument("--trace", action="store_true", help="also compare the peaks stage by stage (see above)")
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
    sim = simulate(prof, plan.named(prof), optimizer=row["optimizer"], timeline=args.trace)
    predicted = sim.peak_bytes
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
    if args.trace:
        from memtune.profiler.module_profile import as_inputs
        from memtune.tuner.measure.step_timing import training_step

        opt = (
            torch.optim.AdamW(model.parameters(), lr=1e-6)
            if row["optimizer"] == "adam"
            else (torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9))
        )
        step = training_step(run, as_inputs(inputs), loss, opt, output_held=True)
        step()  # the optimizer's state made, as in the timed steps
        print_phases(simulated_phases(sim.timeline), traced_phases(model, plan.stages, step))


if __name__ == "__main__":
    main()

"""Where a plan's peak lives: the allocator's peak between stage boundaries of one CUDA step, beside the simulator's
timeline, for the plans ``benchmarks.promises`` tuned (its committed rows).

    python scripts/phase_peaks.py [MODEL] [--out FILE]      # on one GPU; MODEL defaults to unet

Forward pre- and post-hooks on every stage module read ``torch.cuda.max_memory_allocated`` and reset it, so each
line is the peak since the line before (forward hooks change no allocation). Backward boundaries use full backward
hooks, which wrap the stages' inputs and outputs and so hold some tensors longer: read their absolute values with
that in mind, and compare forward phases first. Three steps per plan (SGD with momentum, the output held through the
backward); the last step's lines are printed and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MiB = float(1 << 20)


def main() -> None:
    from benchmarks.promises import MODELS
    from memtune.profiler import Profile
    from memtune.tuner import Plan, simulate
    from memtune.tuner.runtime import planned
    from memtune.tuner.runtime.guard import configure_allocator

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="unet", choices=sorted(MODELS))
    parser.add_argument("--out", type=Path, help="write the phases and the simulated timelines here as JSON")
    args = parser.parse_args()
    configure_allocator()
    row = json.loads(Path(f"benchmarks/results/h100/promises/{args.model}.json").read_text())
    prof = Profile.from_json(json.dumps(row["profile"]))
    torch.manual_seed(0)
    model, inputs, loss_fn, _ = MODELS[args.model](args.model)
    model.train()
    events: list[tuple[str, int, int]] = []

    def mark(label: str) -> None:
        torch.cuda.synchronize()
        events.append((label, torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()))
        torch.cuda.reset_peak_memory_stats()

    for k, s in enumerate(prof.stages):
        m = model.get_submodule(s.name)
        m.register_forward_pre_hook(lambda _m, _a, k=k: mark(f"fwd {k} start"))
        m.register_forward_hook(lambda _m, _a, _o, k=k: mark(f"fwd {k} end"))
        m.register_full_backward_pre_hook(lambda _m, _g, k=k: mark(f"bwd {k} start"))
        m.register_full_backward_hook(lambda _m, _gi, _go, k=k: mark(f"bwd {k} end"))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
    plans = {"keep": Plan.uniform(prof.n_stages).named(prof)}
    plans.update({f"{e['fraction']:.0%}": Plan.model_validate(e["plan"]) for e in row["fractions"] if "plan" in e})
    result: dict[str, Any] = {}
    for name, plan in plans.items():
        run = planned(model, plan) if name != "keep" else model
        for _ in range(3):
            events.clear()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            out = run(**inputs) if isinstance(inputs, dict) else run(inputs)
            loss = loss_fn(out)
            mark("loss")
            loss.backward()
            mark("backward end")
            opt.step()
            del out, loss
        sim = simulate(prof, plan, optimizer="sgd", timeline=True)
        result[name] = {
            "compact": plan.compact(),
            "phases": list(events),
            "simulated_peak_bytes": sim.peak_bytes,
            "simulated_timeline": [list(t) for t in sim.timeline or ()],
        }
        print(f"{name} {plan.compact()}: simulated peak {sim.peak_bytes / MiB:.0f} MiB")
        for label, peak, now in events:
            print(f"  {label:14s} peak since the line before {peak / MiB:8.0f} MiB, allocated now {now / MiB:8.0f}")
        del run
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()

"""Where the host's time goes in a model's compiled training steps: the whole model compiled beside the
compiled-region plans of a ``benchmarks.module_peers`` row, kept and as planned (NOTE [ Host issue time ] in
``memtune.tuner._host_time``).

    python -m benchmarks.host_issue --model mobilenet_v2 --fractions 0.45,0.75 --out DIR     # on one GPU

Per variant, in one process: ``benchmarks.step_time.measure`` (wall, the host's issue and the GPU's own time, with
the garbage collector on and off; medians of 10 steps, SGD), written to ``<model>-times.json``; then Python's profiler
(``cProfile``) over five steps after three untimed ones, its 40 functions of most own time and 60 of most cumulative
time, written to ``<model>-<variant>.txt``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
from pathlib import Path
from typing import Any

import torch

__all__ = ["main", "profiled_steps"]


def profiled_steps(model: Any, run: Any, args: Any, loss_fn: Any, path: Path, steps: int = 5) -> None:
    """Python's profiler over ``steps`` SGD steps of ``run`` (after three untimed ones), its tables written to
    ``path``; the model's gradients dropped after."""
    from memtune.profiler.module_stages import call_model

    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(call_model(run, args)).backward()
        opt.step()

    for _ in range(3):
        step()
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    for _ in range(steps):
        prof.enable()
        step()
        prof.disable()
        torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(60)
    path.write_text(text.getvalue())
    opt.state.clear()
    for p in model.parameters():
        p.grad = None


def main() -> None:
    from benchmarks.module_peers import build
    from benchmarks.step_time import measure
    from memtune.profiler.module_profile import as_inputs
    from memtune.tuner import Action, Plan
    from memtune.tuner.runtime import planned

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--rows", type=Path, default=Path("benchmarks/results/h200/module-peers"))
    parser.add_argument("--fractions", default="0.45,0.75")
    parser.add_argument("--out", type=Path, default=Path("."))
    a = parser.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    fractions = [float(f) for f in a.fractions.split(",")]
    committed = json.loads((a.rows / f"{a.model}.json").read_text())
    torch.manual_seed(0)
    model, inputs, loss_fn, opt, _ = build(a.model)
    args = as_inputs(inputs)
    out: dict[str, Any] = {}
    whole = torch.compile(model)
    out["whole"] = measure(model, whole, inputs, loss_fn, opt, 10)
    profiled_steps(model, whole, args, loss_fn, a.out / f"{a.model}-whole.txt")
    del whole
    torch._dynamo.reset()
    gc.collect()
    for e in committed["plans"]:
        plan = Plan.model_validate(e["plan_json"]) if "plan_json" in e else None
        if e["fraction"] not in fractions or plan is None or plan.stages is None:
            continue  # not compiled regions
        keep = plan.with_(actions=[Action.KEEP] * len(plan.stages))
        for label, p in (("keep", keep), ("plan", plan)):
            pm = planned(model, p)
            name = f"{e['fraction']:g}-{label}"
            out[name] = {"compact": p.compact(), **measure(model, pm, inputs, loss_fn, opt, 10)}
            print(name, out[name], flush=True)
            profiled_steps(model, pm, args, loss_fn, a.out / f"{a.model}-{name}.txt")
            pm.release()
            del pm
            gc.collect()
            torch.cuda.empty_cache()
    (a.out / f"{a.model}-times.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

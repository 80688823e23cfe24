"""Where a planned step's time goes on a GPU: the host's issue time, the GPU's own time and the wall time, beside the
simulator's step, for the plans ``benchmarks.promises`` tuned (its committed rows).

    python -m benchmarks.step_time --models densenet121,mobilenet_v2 --out DIR    # on one GPU
    python -m benchmarks.step_time --table DIR                                     # the Markdown table of DIR

# NOTE [ Host-bound steps ]
The simulator prices the GPU's work: kernels and copies on their streams. A step can also wait for the host: Python
and the framework issue every kernel, and a plan adds host work of its own (an offloaded storage is packed, copied out,
fetched and unpacked by Python hooks; a recomputed stage issues its forward again). Where the host issues more slowly
than the GPU runs, the GPU idles and the step takes the host's time. Per plan, in one CUDA process:

* ``wall_ms``: the step, from the host's start to a synchronisation after it (the median of ``--steps``);
* ``issue_ms``: the host's time until the step's Python returns (forward, loss, backward, optimizer), before that
  synchronisation: with the GPU behind, the host never waits for it, so this is the host's own work;
* ``gpu_ms``: the GPU's time for the same step when the host cannot hold it up: the stream first runs a sleep kernel
  longer than the host takes to issue the step, then CUDA events around the step time the GPU alone;
* the same three with Python's garbage collector off during the steps (``gc.disable()``), since the hooks of a plan
  make Python objects per saved tensor.

A step whose ``issue_ms`` is above its ``gpu_ms`` is bound by the host; the simulator's step is then to be compared
with ``gpu_ms``. Each tuned plan is also run with its offloaded stages kept (``offload->keep``) and with its recomputed
stages kept (``recompute->keep``), which splits the host time a plan adds between the two actions.

Per model ``<out>/<model>.json`` with NOTE [ Run record ] (``benchmarks.common.model_rows``); T5 also gets the spread
of the whole-step recompute measurement that prices its recompute (NOTE [ Recompute priced as measured ] in
``memtune.tuner.simulator``): the plain and the every-stage-recomputed step measured four times in this process, and the
simulated step of the tuned ``rkk`` plan priced with each.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import model_rows

__all__ = ["main", "measure", "plan_variants", "run_model", "sleep_cycles_per_ms", "table"]

PROMISES = Path("benchmarks/results/h100/promises")
MODELS = ("bert_mlm", "densenet121", "gpt2", "llama", "mobilenet_v2", "resnet50", "t5_small", "unet", "vit_b_16")


def sleep_cycles_per_ms() -> float:
    """Clock cycles of ``torch.cuda._sleep`` per ms on this GPU."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    torch.cuda.synchronize()
    return 50_000_000 / start.elapsed_time(end)


def _times(step: Any, steps: int, cycles_per_ms: float) -> dict[str, float]:
    """``wall_ms``, ``issue_ms`` and ``gpu_ms`` of ``step`` (NOTE [ Host-bound steps ]), medians of ``steps``."""
    wall, issue, gpu = [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        issue.append((t1 - t0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
    lead_ms = 1.5 * max(issue) + 20.0
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(lead_ms * cycles_per_ms))
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end))
    med = statistics.median
    return {"wall_ms": med(wall), "issue_ms": med(issue), "gpu_ms": med(gpu)}


def measure(model: nn.Module, run: nn.Module, inputs: Any, loss_fn: Any, optimizer: str, steps: int) -> dict[str, Any]:
    """The three times of one training step of ``run`` (sharing ``model``'s parameters), with the garbage collector
    on, then off (``*_gc_off``), after two warm-up steps; the output held through the backward, as the promises run."""
    from memtune.profiler.module_profile import as_inputs
    from memtune.profiler.module_stages import call_model

    params = model.parameters()
    opt = torch.optim.AdamW(params, lr=1e-6) if optimizer == "adam" else torch.optim.SGD(params, lr=1e-6, momentum=0.9)
    args = as_inputs(inputs)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = call_model(run, args)
        loss_fn(out).backward()
        opt.step()

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    cycles = sleep_cycles_per_ms()
    row: dict[str, Any] = dict(_times(step, steps, cycles))
    gc.collect()
    gc.disable()
    try:
        row.update({f"{k}_gc_off": v for k, v in _times(step, steps, cycles).items()})
    finally:
        gc.enable()
    for p in model.parameters():
        p.grad = None
    opt.state.clear()
    return row


def plan_variants(plan: Any) -> dict[str, Any]:
    """The plan, and the plan with its offloaded, then its recomputed, stages kept."""
    from memtune.tuner import Action

    acts = plan.actions
    out = {"plan": plan}
    for action, name in ((Action.OFFLOAD, "offload->keep"), (Action.RECOMPUTE, "recompute->keep")):
        if action in acts:
            out[name] = plan.with_(actions=[Action.KEEP if a is action else a for a in acts])
    return out


def run_model(kind: str, steps: int) -> dict[str, Any]:
    """The row of one model: every tuned plan of its promises row and its variants (NOTE [ Host-bound steps ])."""
    from benchmarks.promises import MODELS as BUILD
    from memtune.profiler import Profile
    from memtune.tuner import Action, Plan, simulate
    from memtune.tuner.plan import resolve_storages
    from memtune.tuner.runtime import planned

    committed = json.loads((PROMISES / f"{kind}.json").read_text())
    prof = Profile.from_json(json.dumps(committed["profile"]))
    torch.manual_seed(0)
    model, inputs, loss_fn, opt = BUILD[kind](kind)
    model.train()
    row: dict[str, Any] = {"model": kind, "optimizer": opt, "device": torch.cuda.get_device_name()}
    row["unplanned"] = measure(model, model, inputs, loss_fn, opt, steps)
    row["plans"] = []
    keep = Plan.uniform(prof.n_stages, Action.KEEP).named(prof)
    tuned = [(f"{e['fraction']:.0%}", Plan.model_validate(e["plan"])) for e in committed["fractions"] if "plan" in e]
    for label, base in [("keep", keep), *tuned]:
        for variant, plan in plan_variants(base).items():
            fates = resolve_storages(prof, plan.actions)
            entry: dict[str, Any] = {
                "fraction": label,
                "variant": variant,
                "compact": plan.compact(),
                "copied_storages": sum(1 for f in fates if f.copied),
                "recomputed_stages": sum(1 for a in plan.actions if a is Action.RECOMPUTE),
                "simulated_ms": simulate(prof, plan, optimizer=opt).step_ms,
            }
            pm = planned(model, plan)
            try:
                entry.update(measure(model, pm, inputs, loss_fn, opt, steps))
            except Exception as exc:  # a failed run is a result
                entry["error"] = f"{type(exc).__name__}: {exc}"[:400]
            del pm
            gc.collect()
            torch.cuda.empty_cache()
            row["plans"].append(entry)
            print(kind, label, variant, {k: v for k, v in entry.items() if k.endswith("ms")}, flush=True)
    if kind == "t5_small":
        row["recompute_spread"] = _recompute_spread(model, inputs, loss_fn, prof, opt, tuned)
    return row


def _recompute_spread(model: nn.Module, inputs: Any, loss_fn: Any, prof: Any, opt: str, tuned: list[Any]) -> dict:
    """The plain and every-stage-recomputed steps measured four times, and each tuned plan simulated with each."""
    from memtune.profiler.module_profile import _recompute_step_ms, _step_ms, as_inputs
    from memtune.tuner import simulate

    dev = torch.device("cuda")
    args = as_inputs(inputs)
    modules = [model.get_submodule(s.name) for s in prof.stages]
    plain = [_step_ms(model, args, loss_fn, prof.dtype, dev, 2, 5) for _ in range(4)]
    whole = [_recompute_step_ms(model, args, loss_fn, prof.dtype, dev, (2, 5), modules) for _ in range(4)]
    sims = {
        label: [simulate(prof.model_copy(update={"recompute_step_ms": w}), p, optimizer=opt).step_ms for w in whole]
        for label, p in tuned
    }
    return {"profiled": prof.recompute_step_ms, "plain_ms": plain, "recompute_step_ms": whole, "simulated_ms": sims}


def table(folder: Path) -> str:
    """The Markdown table of the rows in ``folder``: per plan the simulated step beside the three measured times."""
    lines = [
        "| model | plan | variant | copied storages | recomputed stages | simulated ms | wall ms | host issue ms "
        "| GPU-only ms | simulated vs wall | simulated vs GPU-only | wall, GC off |",
        "|" + "---|" * 12,
    ]
    for path in sorted(folder.glob("*.json")):
        row = json.loads(path.read_text())
        if "plans" not in row:
            continue
        u = row["unplanned"]
        lines.append(
            f"| {row['model']} | unplanned | | | | | {u['wall_ms']:.1f} | {u['issue_ms']:.1f} | {u['gpu_ms']:.1f} "
            f"| | | {u['wall_ms_gc_off']:.1f} |"
        )
        for e in row["plans"]:
            if "error" in e:
                lines.append(f"| {row['model']} | {e['fraction']} | {e['variant']} | | | | {e['error'][:80]} |")
                continue
            sim = e["simulated_ms"]
            lines.append(
                f"| {row['model']} | {e['fraction']} `{e['compact']}` | {e['variant']} | {e['copied_storages']} "
                f"| {e['recomputed_stages']} | {sim:.1f} | {e['wall_ms']:.1f} | {e['issue_ms']:.1f} "
                f"| {e['gpu_ms']:.1f} | {(sim - e['wall_ms']) / e['wall_ms']:+.1%} "
                f"| {(sim - e['gpu_ms']) / e['gpu_ms']:+.1%} | {e['wall_ms_gc_off']:.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="densenet121,mobilenet_v2,t5_small")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--table", type=Path, help="print the Markdown table of the rows in this folder and stop")
    args = parser.parse_args()
    if args.table is not None:
        print(table(args.table))
        return
    model_rows(args.models, MODELS, lambda kind: run_model(kind, args.steps), args.out)


if __name__ == "__main__":
    main()

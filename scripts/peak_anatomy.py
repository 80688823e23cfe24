"""What is live at a planned step's measured peak, beside the simulator's peak; and what an out-of-memory leaves.

    python scripts/peak_anatomy.py OUT_DIR MODEL [PLAN ...] [--from FILE] [--oom]

MODEL is a model of ``benchmarks.promises`` (built as that benchmark builds it, on CUDA). Each PLAN is a compact
plan (``kokorroosrroorook``, one letter per stage of the model's profile); ``--from FILE`` adds the tuned plans of a
``benchmarks.promises`` JSON row (their knobs included). The model is profiled by ``memtune.profile`` (output held)
and each plan run as that benchmark runs it: one warm-up step, then one step under the CUDA allocator's history
(``torch.cuda.memory._record_memory_history``). From the history: the measured peak (allocated bytes), the stage
running at it (markers allocated by hooks at every stage's forward and backward and around the loss), and the blocks
live at the peak that the step allocated, grouped by the Python frame that allocated them; beside it, the simulator's
peak, its label and the events around it. With ``--oom`` each plan is then run under ``budget_guard`` at 80% of its
measured peak (an out-of-memory expected) and the bytes still allocated afterwards are compared with before, then
the uncapped step is measured again.

Environment: ``ANATOMY_INTERVALS=1`` reads, instead of the history, the peak allocated between consecutive markers
beside the simulator's peak over the same labels (on torch 2.11 the history's Python stacks made the backward of
torchvision ResNet-50 and DenseNet-121 plans fail with ``SystemError: ... returned NULL without setting an
exception``); ``ANATOMY_BACKWARD_MARKS=0`` leaves out the backward markers. Each plan also reports what is still
allocated once its step is over, before and after ``gc.collect()`` (a difference is a reference cycle).

Writes ``OUT_DIR/anatomy-MODEL.json`` and prints a summary per plan.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

MiB = float(1 << 20)
MARK = 512  # a marker block's size unit: marker i allocates (i + 1) * 512 bytes
_OWN = ("transformers/", "torchvision/", "/tuner/", "/profiler/", "/benchmarks/", "/tests/", "torch/nn/", "checkpoint")


def _where(frames: list[dict[str, Any]]) -> str:
    """The first two frames of the project, the model's library or torch.nn that allocated a block."""
    own = [f for f in frames if any(k in f["filename"] for k in _OWN)]
    if not own:
        return "<autograd engine or C++>"
    return " < ".join(f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in own[:2])


class Markers:
    """Tiny allocations at stage boundaries, recognisable in the allocator's history by size and frame."""

    def __init__(self, backward: bool = True, intervals: bool = False) -> None:
        self.labels: list[str] = []
        self.backward = backward
        self.intervals: list[tuple[str, float, float]] | None = [] if intervals else None

    def mark(self, label: str) -> None:
        if self.intervals is not None:  # the peak since the last marker, and what is allocated now, GiB
            last = self.labels[-1] if self.labels else "start"
            peak, now = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
            self.intervals.append((last, round(peak / 2**30, 3), round(now / 2**30, 3)))
            torch.cuda.reset_peak_memory_stats()
            self.labels.append(label)
            return
        self.labels.append(label)
        torch.empty(len(self.labels) * MARK, dtype=torch.uint8, device="cuda")  # freed at once

    def install(self, stages: list[tuple[str, nn.Module]]) -> list[Any]:
        handles = []
        for k, (name, m) in enumerate(stages):

            def pre(_m: nn.Module, _args: Any, k: int = k, name: str = name) -> None:
                self.mark(f"fwd {k} {name}")

            def post(_m: nn.Module, _args: Any, out: Any, k: int = k, name: str = name) -> None:
                from memtune.profiler.module_stages import tensor_leaves

                first = next((t for t in tensor_leaves(out) if t.grad_fn is not None), None)
                if first is not None:
                    first.grad_fn.register_prehook(lambda _g: self.mark(f"bwd {k} {name}"))  # type: ignore[union-attr]

            handles.append(m.register_forward_pre_hook(pre))
            if self.backward:
                handles.append(m.register_forward_hook(post))
        return handles


def _is_marker(e: dict[str, Any]) -> bool:
    return any(f["name"] == "mark" and "peak_anatomy" in f["filename"] for f in e.get("frames", []))


def anatomy(trace: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    """The peak of one step's allocator history and what was live at it (blocks the step allocated)."""
    live: dict[int, tuple[int, str]] = {}
    markers: set[int] = set()
    total, peak, peak_at = 0, 0, -1
    label, peak_label = "before the first stage", ""
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            if _is_marker(e):
                markers.add(e["addr"])
                k = e["size"] // MARK - 1
                label = labels[k] if 0 <= k < len(labels) else f"marker {k}"
                continue
            live[e["addr"]] = (e["size"], _where(e.get("frames", [])))
            total += e["size"]
            if total > peak:
                peak, peak_at, peak_label = total, i, label
        elif e["action"] == "free_requested":
            if e["addr"] in markers:
                markers.discard(e["addr"])
            elif e["addr"] in live:
                total -= live.pop(e["addr"])[0]
            else:
                total -= e["size"]  # a block from before the step (it counts in the start)
    live_at: dict[int, tuple[int, str]] = {}  # replayed to the peak
    for e in trace[: peak_at + 1]:
        if e["action"] == "alloc" and not _is_marker(e):
            live_at[e["addr"]] = (e["size"], _where(e.get("frames", [])))
        elif e["action"] == "free_requested":
            live_at.pop(e["addr"], None)
    groups: dict[str, list[int]] = defaultdict(list)
    for size, where in live_at.values():
        groups[where].append(size)
    top = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:14]
    return {
        "peak_above_start_MiB": round(peak / MiB, 1),
        "peak_during": peak_label,
        "live_at_peak": [{"where": w, "MiB": round(sum(s) / MiB, 1), "blocks": len(s)} for w, s in top],
    }


def _left_after_step(pm: nn.Module) -> dict[str, Any]:
    """What the offload runtime still holds on the device once a step is over, before and after a collection."""
    step = getattr(pm, "_step", None)
    entries = [] if step is None else list({id(e): e for e in [*step.all_entries, *(step._order or ())]}.values())
    left = [
        {"need": e.need, "MiB": round(e.nbytes / MiB, 1), "pending": e.pending, "handles": e.handles,
         "device_buf": e.device_buf is not None, "hold": e.hold is not None, "alive": e.storage_ref() is not None}
        for e in entries
        if e.device_buf is not None or e.hold is not None or e.storage_ref() is not None
    ]  # fmt: skip
    now = torch.cuda.memory_allocated()
    gc.collect()
    return {"allocated_GiB": round(now / 2**30, 3), "after_gc_GiB": round(torch.cuda.memory_allocated() / 2**30, 3),
            "entries": left, "held": 0 if step is None else len(step.held)}  # fmt: skip


def measure_plan(
    model: nn.Module,
    prof: Any,
    plan: Any,
    inputs: Any,
    loss_fn: Any,
    opt: str,
    stages: list[tuple[str, nn.Module]],
    *,
    oom: bool,
    warmup: int,
) -> dict[str, Any]:
    """One plan's anatomy (see the module docstring)."""
    from memtune.tuner import simulate
    from memtune.tuner.measure.module_bench import measure_step
    from memtune.tuner.runtime import budget_guard, planned

    args = (inputs,) if isinstance(inputs, torch.Tensor) else ()
    kwargs = inputs if isinstance(inputs, dict) else {}
    from memtune.tuner import Action, Plan

    pm = model if plan is None else planned(model, plan)
    sim = simulate(prof, plan or Plan.uniform(prof.n_stages, Action.KEEP).named(prof), optimizer=opt, timeline=True)
    at = max(range(len(sim.timeline)), key=lambda j: sim.timeline[j][1])
    intervals = os.environ.get("ANATOMY_INTERVALS") == "1"  # peaks between markers instead of the history
    markers = Markers(backward=os.environ.get("ANATOMY_BACKWARD_MARKS", "1") == "1", intervals=intervals)
    optim = (
        torch.optim.AdamW(model.parameters(), lr=1e-6)
        if opt == "adam"
        else torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
    )

    def step(mark: bool) -> None:
        optim.zero_grad(set_to_none=True)
        out = pm(*args, **kwargs)
        if mark:
            markers.mark("loss forward")
        loss = loss_fn(out)
        if mark:
            markers.mark("loss backward")
        loss.backward()
        if mark:
            markers.mark("optimizer")
        optim.step()

    warm_peaks = []
    for _ in range(warmup):  # the pool, the optimizer state, cuDNN's choices; each step's peak, as a loop runs them
        torch.cuda.reset_peak_memory_stats()
        step(False)
        warm_peaks.append(round(torch.cuda.max_memory_allocated() / 2**30, 3))
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    handles = markers.install(stages)
    if not intervals:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    step(True)
    torch.cuda.synchronize()
    if intervals:
        markers.mark("end")
        assert markers.intervals is not None
        seen = markers.intervals
        peak = int(max(p for _l, p, _n in seen) * 2**30)
        found: dict[str, Any] = {"intervals": seen, "peak_during": max(seen, key=lambda r: r[1])[0]}
    else:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peak = torch.cuda.max_memory_allocated()
        found = anatomy(snap["device_traces"][0], markers.labels)
        del snap
    for h in handles:
        h.remove()
    found["after_step"] = _left_after_step(pm)
    sim_by_label: dict[str, float] = {}
    for _t, b, lab in sim.timeline:
        key = " ".join(lab.split()[:2])
        sim_by_label[key] = max(sim_by_label.get(key, 0.0), round(b / 2**30, 3))
    entry: dict[str, Any] = {
        "plan": "unplanned" if plan is None else plan.compact(),
        "sim_peak_GiB": round(sim.peak_bytes / 2**30, 3),
        "sim_peak_label": sim.timeline[at][2],
        "sim_around_peak": [(lab, round(b / 2**30, 3)) for _t, b, lab in sim.timeline[max(0, at - 6) : at + 4]],
        "measured_peak_GiB": round(peak / 2**30, 3),
        "start_GiB": round(start / 2**30, 3),
        "warm_peaks_GiB": warm_peaks,
        "sim_by_label": sim_by_label,
        **found,
    }
    optim.zero_grad(set_to_none=True)
    optim.state.clear()
    if oom and plan is not None:
        gc.collect()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        try:
            with budget_guard(int(0.8 * peak), pm):
                step(False)
                step(False)
            entry["capped"] = "fits"
        except Exception as exc:  # the out-of-memory this part is for
            entry["capped"] = f"{type(exc).__name__}"
        optim.zero_grad(set_to_none=True)
        optim.state.clear()
        gc.collect()
        torch.cuda.empty_cache()
        entry["left_after_oom_MiB"] = round((torch.cuda.memory_allocated() - before) / MiB, 1)
        again = measure_step(model, pm, inputs, loss_fn, warmup=1, steps=2, output_held=True, optimizer=opt)
        entry["uncapped_after_oom_GiB"] = round(again["peak_bytes"] / 2**30, 3)
    return entry


def run(
    out_dir: Path,
    kind: str,
    compacts: list[str],
    plans_from: Path | None,
    fractions: list[float] | None,
    *,
    oom: bool,
    warmup: int,
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import memtune
    from benchmarks.promises import MODELS
    from memtune.tuner import Plan, peak_check
    from memtune.tuner.runtime.guard import configure_allocator

    configure_allocator()
    torch.manual_seed(0)
    model, inputs, loss_fn, opt = MODELS[kind](kind)
    model.train()
    prof = memtune.profile(model, inputs, loss_fn=loss_fn, progress=False)
    check = peak_check(prof)
    plans: list[Any] = [None if c == "unplanned" else Plan.from_actions(c).named(prof) for c in compacts]
    if plans_from is not None:
        row = json.loads(plans_from.read_text())
        plans += [
            Plan.model_validate(e["plan"])
            for e in row["fractions"]
            if "plan" in e and (fractions is None or e["fraction"] in fractions)
        ]
    stages = [(s.name, model.get_submodule(s.name)) for s in prof.stages]
    result: dict[str, Any] = {"model": kind, "self_check": str(check), "plans": []}

    for plan in plans:
        entry = measure_plan(model, prof, plan, inputs, loss_fn, opt, stages, oom=oom, warmup=warmup)
        result["plans"].append(entry)
        print(json.dumps(entry, indent=1), flush=True)
        gc.collect()
        torch.cuda.empty_cache()
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"anatomy-{kind}.json").write_text(json.dumps(result, indent=1))


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("model")
    parser.add_argument("plans", nargs="*")
    parser.add_argument("--from", dest="plans_from", type=Path)
    parser.add_argument("--fractions", help="with --from: only the plans of these fractions (0.4,0.5)")
    parser.add_argument("--oom", action="store_true")
    parser.add_argument("--warmup", type=int, default=1, help="steps before the recorded one (each one's peak kept)")
    a = parser.parse_args()
    fractions = None if a.fractions is None else [float(f) for f in a.fractions.split(",")]
    run(a.out, a.model, a.plans, a.plans_from, fractions, oom=a.oom, warmup=a.warmup)


if __name__ == "__main__":
    main()

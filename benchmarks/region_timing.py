"""Where a compiled-region plan's step goes on a GPU, region by region, beside the profile it was searched on (the plans
of ``benchmarks.module_peers`` rows).

    python -m benchmarks.region_timing --rows benchmarks/results/h200/module-peers --models llama --out DIR
    python -m benchmarks.region_timing --table DIR        # the Markdown tables of DIR

Per model, in one process, built as ``benchmarks.module_peers`` builds it with its row's ``use_cache``, for every plan
of the row that runs compiled regions: the plan with every region kept (``keep``), the plan itself, and the plan with
its offloaded, then its recomputed, regions kept (``benchmarks.step_time``'s variants). For each, without a cap:

* ``wall_ms``, ``issue_ms``, ``gpu_ms`` of the training step (forward, loss, backward, the optimizer's update; NOTE
  [ Host-bound steps ] in ``benchmarks.step_time``), and ``fb_gpu_ms``, the GPU's time of the forward and backward
  alone (gradients made and dropped, no update): what the simulator's step is (``simulated_ms``);
* with ``--trace DIR``, one step traced by ``torch.profiler`` (``benchmarks.stream_trace``): the compute stream's
  kernel, idle and span ms, the copies on the other streams, the host's blocked ms and its stream waits;
* region by region, the GPU's time of its forward and of its backward inside the step (CUDA events: a forward from
  the region's pre-hook to its hook, a backward from its output's gradient to its input's; a recompute runs inside
  its region's backward), medians of the timed steps, beside the profile's times of the region.

The regions' spans summed, less the forward and backward step, is the time spent between them: the loss, the
copies' waits, the host's hooks while the GPU idles.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import model_rows

__all__ = ["RegionSpans", "main", "run_model", "table"]

MODELS = ("bert_mlm", "efficientnet_b0", "gpt2", "llama", "mobilenet_v2", "resnet50", "vit_b_16")


def _first_grad_tensor(value: Any) -> torch.Tensor | None:
    """The first tensor that requires grad in ``value``: a tensor, or tuples, lists and dicts of them."""
    if isinstance(value, torch.Tensor):
        return value if value.requires_grad else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    for item in items:
        found = _first_grad_tensor(item)
        if found is not None:
            return found
    return None


class RegionSpans:
    """CUDA events around every region's forward and backward, one step at a time (see the module docstring)."""

    def __init__(self, modules: dict[str, nn.Module]) -> None:
        self.modules = modules
        self.steps: list[list[tuple[str, str, Any, Any]]] = []
        self._started: dict[str, Any] = {}
        self._backward_began = False

    def _event(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _pre(self, name: str) -> Callable[..., None]:
        def pre(_m: nn.Module, args: Any, kwargs: Any) -> None:
            self._started[name] = self._event()
            x = _first_grad_tensor((args, kwargs))
            if x is not None and not self._backward_began:
                x.register_hook(lambda _g: self._close(name, "backward"))

        return pre

    def _post(self, name: str) -> Callable[..., None]:
        def post(_m: nn.Module, _args: Any, _kwargs: Any, out: Any) -> None:
            phase = "recompute" if self._backward_began else "forward"  # a region called again inside the backward
            self.steps[-1].append((name, phase, self._started.pop(name), self._event()))
            y = _first_grad_tensor(out)
            if y is not None and phase == "forward":
                y.register_hook(lambda _g: self._open(name))

        return post

    def _open(self, name: str) -> None:
        self._backward_began = True
        self._started[f"{name}/backward"] = self._event()

    def _close(self, name: str, phase: str) -> None:
        start = self._started.pop(f"{name}/{phase}", None)
        if start is not None:
            self.steps[-1].append((name, phase, start, self._event()))

    @contextmanager
    def hooked(self) -> Iterator[RegionSpans]:
        """The hooks on the regions inside the block; call ``next_step`` before each step."""
        handles = []
        for name, m in self.modules.items():
            handles.append(m.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            handles.append(m.register_forward_hook(self._post(name), with_kwargs=True))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def next_step(self) -> None:
        self.steps.append([])
        self._started.clear()
        self._backward_began = False

    def medians(self) -> dict[str, dict[str, float]]:
        """Per region, the median ms of its forward and of its backward over the steps (after they synchronised)."""
        spans: dict[str, dict[str, list[float]]] = {}
        for step in self.steps:
            for name, phase, a, b in step:
                spans.setdefault(name, {}).setdefault(phase, []).append(float(a.elapsed_time(b)))
        return {n: {p: statistics.median(v) for p, v in phases.items()} for n, phases in spans.items()}


def _fb_gpu_ms(model: nn.Module, run: nn.Module, args: Any, loss_fn: Any, steps: int) -> float:
    """The GPU's time of the forward and backward alone, gradients dropped (no update), the median of ``steps``."""
    from benchmarks.step_time import sleep_cycles_per_ms
    from memtune.profiler.module_stages import call_model

    def step() -> None:
        loss_fn(call_model(run, args)).backward()
        for p in model.parameters():
            p.grad = None

    step()
    torch.cuda.synchronize()
    cycles, times = sleep_cycles_per_ms(), []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(300 * cycles))  # the host issues ahead of the GPU (NOTE [ Host-bound steps ])
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _region_ms(model: nn.Module, run: nn.Module, args: Any, loss_fn: Any, names: list[str], steps: int) -> dict:
    """``RegionSpans.medians`` of ``steps`` training steps of ``run`` (AdamW, as the language models train)."""
    from memtune.profiler.module_stages import call_model

    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    spans = RegionSpans({n: model.get_submodule(n) for n in names})
    with spans.hooked():
        for _ in range(steps + 1):
            spans.next_step()
            opt.zero_grad(set_to_none=True)
            loss_fn(call_model(run, args)).backward()
            opt.step()
            torch.cuda.synchronize()
    spans.steps = spans.steps[1:]  # the first step warms up
    medians = spans.medians()
    opt.state.clear()
    for p in model.parameters():
        p.grad = None
    return medians


def _variant_row(model: nn.Module, run: nn.Module, inputs: Any, loss_fn: Any, opt: str, names: list[str],
                 steps: int, trace: Path | None) -> dict[str, Any]:  # fmt: skip
    from benchmarks.step_time import measure
    from memtune.profiler.module_profile import as_inputs

    args = as_inputs(inputs)
    row: dict[str, Any] = dict(measure(model, run, inputs, loss_fn, opt, steps))
    row["fb_gpu_ms"] = _fb_gpu_ms(model, run, args, loss_fn, steps)
    row["regions"] = _region_ms(model, run, args, loss_fn, names, steps)
    if trace is not None:
        row["trace"] = _traced(model, run, args, loss_fn, trace)
    return row


def _traced(model: nn.Module, run: nn.Module, args: Any, loss_fn: Any, path: Path) -> dict[str, Any]:
    """``benchmarks.stream_trace.summary`` of one training step of ``run`` traced to ``path``."""
    from benchmarks.stream_trace import summary, trace_step
    from memtune.profiler.module_stages import call_model

    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(call_model(run, args)).backward()
        opt.step()

    got = summary(trace_step(step, path))
    opt.state.clear()
    for p in model.parameters():
        p.grad = None
    return {**got, "file": path.name}


def run_model(
    kind: str, rows: Path, steps: int, fractions: list[float] | None = None, trace: Path | None = None
) -> dict[str, Any]:
    """The row of one model (see the module docstring)."""
    from benchmarks.module_peers import build, hf_cache
    from benchmarks.peer_rows import plan_profile, row_update_ms
    from benchmarks.step_time import plan_variants
    from memtune.tuner import Action, Plan, simulate
    from memtune.tuner.runtime import planned

    committed = json.loads((rows / f"{kind}.json").read_text())
    torch.manual_seed(0)
    model, inputs, loss_fn, opt, _ = build(kind)
    hf_cache(model, "off" if committed.get("use_cache") is False else "default")
    out: dict[str, Any] = {"model": kind, "device": torch.cuda.get_device_name(), "plans": []}
    out["update_ms"] = row_update_ms(committed)
    for e in committed.get("plans", []):
        plan = Plan.model_validate(e["plan_json"]) if "plan_json" in e else None
        if plan is None or plan.compile_budget is None or plan.stages is None:
            continue  # not compiled regions
        if fractions is not None and e["fraction"] not in fractions:
            continue
        prof = plan_profile(committed, plan)
        names = list(plan.stages)
        profiled = {s.name: {"forward": s.forward_ms, "backward": s.backward_ms} for s in prof.stages}
        keep = plan.with_(actions=[Action.KEEP] * len(names))
        for variant, p in {"keep": keep, **plan_variants(plan)}.items():
            entry: dict[str, Any] = {"fraction": e["fraction"], "variant": variant, "compact": p.compact(),
                                     "simulated_ms": simulate(prof, p, optimizer=opt).step_ms,
                                     "profile_loss_ms": prof.loss_ms, "profiled": profiled}  # fmt: skip
            pm = planned(model, p)
            try:
                where = trace / f"{kind}-{e['fraction']:g}-{variant.replace('->', '-to-')}.json.gz" if trace else None
                entry.update(_variant_row(model, pm, inputs, loss_fn, opt, names, steps, where))
            except Exception as exc:  # a failed run is a result
                entry["error"] = f"{type(exc).__name__}: {exc}"[:400]
            pm.release()
            del pm
            gc.collect()
            torch.cuda.empty_cache()
            out["plans"].append(entry)
            print(kind, e["fraction"], variant, {k: round(v, 1) for k, v in entry.items() if k.endswith("_ms")
                                                  and isinstance(v, float)}, flush=True)  # fmt: skip
    return out


def table(folder: Path) -> str:
    """Per model: each variant's times beside the simulated step, then the regions of each plan, measured beside
    profiled."""
    lines = []
    for path in sorted(folder.glob("*.json")):
        row = json.loads(path.read_text())
        lines += [
            f"### {row['model']} ({row['device']}, update {row.get('update_ms') or 0:.1f} ms)",
            "",
            "| budget | variant | plan | simulated ms | forward+backward GPU ms | step GPU ms | wall ms "
            "| issue ms | regions' sum ms | between regions ms |",
            "|" + "---|" * 10,
        ]
        for e in row["plans"]:
            head = f"| {e['fraction']:.0%} | {e['variant']} | `{e['compact']}` | {e['simulated_ms']:.1f}"
            if "error" in e:
                lines.append(f"{head} | {e['error'][:100]} | | | | | |")
                continue
            summed = sum(p.get("forward", 0.0) + p.get("backward", 0.0) for p in e["regions"].values())
            times = " | ".join(f"{e[k]:.1f}" for k in ("fb_gpu_ms", "gpu_ms", "wall_ms", "issue_ms"))
            lines.append(f"{head} | {times} | {summed:.1f} | {e['fb_gpu_ms'] - summed:.1f} |")
        traced = [e for e in row["plans"] if "trace" in e]
        if traced:
            lines += [
                "",
                "| budget | variant | compute stream: kernels ms / idle ms / span ms | copies ms, other streams "
                "| host blocked ms | stream waits | trace |",
                "|---|---|---|---|---|---|---|",
            ]
        for e in traced:
            t = e["trace"]
            others = sum(v["copy_ms"] for k, v in t["streams"].items() if k != t.get("compute_stream"))
            own = t["streams"].get(t.get("compute_stream"), {}).get("kernel_ms", 0.0)
            lines.append(f"| {e['fraction']:.0%} | {e['variant']} | {own:.1f} / {t.get('compute_idle_ms', 0):.1f} / "
                         f"{t.get('compute_span_ms', 0):.1f} | {others:.1f} | {t['host_blocked_ms']:.1f} "
                         f"| {t['stream_waits']} | `{t['file']}` |")  # fmt: skip
        lines += ["", "| budget | variant | region | forward ms, profiled / measured | backward ms, profiled / "
                  "measured |", "|---|---|---|---|---|"]  # fmt: skip
        for e in row["plans"]:
            for name, got in e.get("regions", {}).items():
                was = e["profiled"].get(name, {})
                cells = [f"{was.get(p, 0):.2f} / {got[p]:.2f}" if p in got else "-" for p in ("forward", "backward")]
                lines.append(f"| {e['fraction']:.0%} | {e['variant']} | {name} | {cells[0]} | {cells[1]} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama")
    parser.add_argument("--rows", type=Path, default=Path("benchmarks/results/h200/module-peers"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--fractions", help="only the plans at these budgets, e.g. 0.9 (default: every one)")
    parser.add_argument("--trace", type=Path, help="also trace one step of each variant into this folder "
                        "(benchmarks.stream_trace) and keep what it says of the streams in the row")  # fmt: skip
    parser.add_argument("--table", type=Path, help="print the Markdown tables of the rows in this folder and stop")
    args = parser.parse_args()
    if args.table is not None:
        print(table(args.table))
        return
    fractions = [float(f) for f in args.fractions.split(",")] if args.fractions else None
    model_rows(args.models, MODELS, lambda kind: run_model(kind, args.rows, args.steps, fractions, args.trace),
               args.out)  # fmt: skip


if __name__ == "__main__":
    main()

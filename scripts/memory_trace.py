"""Where does a plan's measured memory part from the simulator's? A per-stage trace of both.

    python scripts/memory_trace.py OUT_DIR model:batch:dtype:frac[:nochoice][:policy=NAME][:plan=FILE] ...

For each configuration: tunes a plan at ``frac`` of the unconstrained simulated peak (with the calibrated
headroom; ``nochoice`` drops the cuDNN algorithm tables first), or takes the plan JSON in ``FILE`` (e.g. a bench row's
``plan_json``), or the baseline policy ``NAME``'s plan
at that budget, then runs it on CUDA twice, uncapped and
under ``budget_guard(budget)``, recording at every stage boundary (forward pre-hooks of the stage modules,
the runtime's backward pre-hooks) the bytes allocated and the peak since the previous boundary, beside the
simulator's live bytes over the same stretch of its timeline. A capped step that runs out of memory prints
the allocator's whole message and statistics; with ``MEMTRACE_HISTORY=1`` it also leaves a memory snapshot
(``torch.cuda.memory``) in OUT_DIR for ``python -m torch.cuda._memory_viz``, and always the capped run's
allocator events (from before its warm-up, so every block's life is in it) as ``events-*.json.gz``: one
``[action, addr, size, stream]`` row per event (a retry shows as a run of ``segment_unmap`` events before
the allocation that needed it; NOTE [ Allocator retries ] in ``memtune/tuner/runtime/guard.py``).
Everything goes to OUT_DIR/trace-*.json as it comes.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import torch

from memtune.api.cli import resolve_profile
from memtune.profiler import build
from memtune.profiler.loss import step_loss
from memtune.tuner import Plan, run_policy, simulate, tune
from memtune.tuner.calibration import calibration_for
from memtune.tuner.measure.bench import _autocast, make_batch
from memtune.tuner.runtime import budget_guard, planned
from memtune.tuner.runtime.conv import apply_conv_choices
from memtune.tuner.runtime.offload import StepState

__all__: list[str] = []

GiB = 2**30


def _sim_stretches(plan: Plan, profile: Any) -> dict[str, tuple[int, float]]:
    """Peak simulated live bytes and duration (ms) per stretch, keyed like the measured ones: ``fwd k`` from
    stage k's start to stage k+1's (the last one also covers the loss), ``bwd k`` from the end of backward
    stage k+1 to the end of backward stage k (prefetches and recomputation included)."""
    res = simulate(profile, plan, timeline=True)
    peaks: dict[str, int] = {}
    starts: dict[str, float] = {}
    key = "start"
    pending, pending_t = 0, 0.0  # backward events before the next "bwd k start"
    in_backward = False
    for t, live, label in res.timeline:
        parts = label.split()
        if parts[0] == "fwd" and parts[2] == "start":
            key = f"fwd {parts[1]}"
            starts[key] = t
        if parts[0] == "bwd" and parts[2] == "start":
            key = f"bwd {parts[1]}"
            peaks[key] = max(pending, live)
            starts[key] = pending_t if pending else t
            pending = 0
            continue
        if in_backward and not key.startswith("bwd"):
            if not pending:
                pending_t = t
            pending = max(pending, live)
            continue
        peaks[key] = max(peaks.get(key, 0), live)
        if parts[0] == "bwd" and parts[2] == "end":
            key = "between"
            in_backward = True
    keys = list(starts)
    ends = [starts[k] for k in keys[1:]] + [res.step_ms]
    return {k: (peaks[k], end - starts[k]) for k, end in zip(keys, ends, strict=True)}


class Tracer:
    """Records (stretch, allocated, peak since the previous mark, a CUDA event) at stage boundaries.

    Reads only the allocator's host-side counters and records events: the host is not synchronized, so the
    step runs as it does untraced.
    """

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.events: list[torch.cuda.Event] = []
        self.label = "start"

    def mark(self, label: str) -> None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.events.append(ev)
        self.rows.append(
            {
                "stretch": self.label,
                "peak_bytes": torch.cuda.max_memory_allocated(),
                "reserved_bytes": torch.cuda.memory_reserved(),
                "allocated_at_end": torch.cuda.memory_allocated(),
                "retries_so_far": torch.cuda.memory_stats().get("num_alloc_retries", 0),
            }
        )
        torch.cuda.reset_peak_memory_stats()
        self.label = label

    def finish(self) -> None:
        """Fill each row's ``ms`` (GPU time from its start mark to its end mark) after the step."""
        torch.cuda.synchronize()
        for i, row in enumerate(self.rows):
            row["ms"] = self.events[i - 1].elapsed_time(self.events[i]) if i > 0 else 0.0


def _install(pm: Any, tracer: Tracer) -> Callable[[], None]:
    handles = []
    for k, m in enumerate(pm.stage_modules()):
        handles.append(
            m.register_forward_pre_hook(
                lambda _m, _a, k=k: tracer.mark(f"fwd {k}") if pm.running[0] == "forward" else None
            )
        )
    original = StepState.on_backward

    def on_backward(self: StepState, stage: int) -> None:
        tracer.mark(f"bwd {stage}")
        original(self, stage)

    StepState.on_backward = on_backward  # type: ignore[method-assign]

    def undo() -> None:
        StepState.on_backward = original  # type: ignore[method-assign]
        for h in handles:
            h.remove()

    return undo


def _dump_events(path: Path) -> None:
    """Write the recorded allocator events (device 0) as gzipped JSON rows ``[action, addr, size, stream]``."""
    snap = torch.cuda.memory._snapshot()
    # .get: an "oom" event (a capped step that ran out of memory) has no address
    rows = [[e["action"], e.get("addr"), e.get("size"), e.get("stream")] for e in snap["device_traces"][0]]
    with gzip.open(path, "wt") as f:
        json.dump({"retries": torch.cuda.memory_stats().get("num_alloc_retries", 0), "events": rows}, f)
    print(f"  {len(rows)} allocator events -> {path.name}", flush=True)


def run_config(out_dir: Path, cfg: str, history: bool) -> None:
    parts = cfg.split(":")
    model, batch, dtype, frac = parts[0], int(parts[1]), parts[2], float(parts[3])
    nochoice = "nochoice" in parts[4:]
    policy = next((p.removeprefix("policy=") for p in parts[4:] if p.startswith("policy=")), None)
    plan_file = next((Path(p.removeprefix("plan=")) for p in parts[4:] if p.startswith("plan=")), None)
    chain = build(model, {})
    prof = resolve_profile(chain, batch, dtype, "h200")
    if nochoice:
        prof = prof.without_conv_algos()
    base_peak = simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes
    budget = int(frac * base_peak)
    headroom = calibration_for("h200").headroom
    record: dict[str, Any] = {"config": cfg, "budget_bytes": budget, "base_peak_bytes": base_peak}
    name = ":".join(p for p in parts if not p.startswith("plan=")) + (f":{plan_file.stem}" if plan_file else "")
    path = out_dir / f"trace-{name.replace(':', '-').replace('=', '-')}.json"
    if plan_file is not None:
        plan = Plan.model_validate_json(plan_file.read_text())
    elif policy is not None:
        plan = run_policy(policy, prof, budget)
    else:
        best = tune(prof, budget, trials=300, headroom=headroom).best
        if best is None:
            record["error"] = "no plan fits"
            path.write_text(json.dumps(record, indent=1))
            print(cfg, "no plan fits", flush=True)
            return
        plan = best.plan
    sim = simulate(prof, plan)
    record.update(plan=plan.compact(), sim_step_ms=sim.step_ms, sim_peak_bytes=sim.peak_bytes)
    record["sim_stretches"] = _sim_stretches(plan, prof)
    print(
        f"{cfg}: budget {budget / GiB:.2f} GiB, sim peak {sim.peak_bytes / GiB:.2f} GiB, {sim.step_ms:.1f} ms",
        flush=True,
    )
    device = torch.device("cuda")
    seq = chain.as_sequential().to(device)
    x, y = make_batch(chain, batch, device)
    opt = torch.optim.SGD(seq.parameters(), lr=1e-4, momentum=0.9)
    chooses = plan.conv_rule != "default" or bool(plan.conv_algos)
    total = torch.cuda.get_device_properties(0).total_memory
    with apply_conv_choices(chain, plan, prof) if chooses else contextlib.nullcontext():
        pm = planned(chain, plan)

        def step() -> None:
            with _autocast(dtype):
                loss = step_loss(pm(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for cap_name, cap in (("uncapped", int(total * 0.95)), ("capped", budget)):
            tracer = Tracer()
            try:
                with budget_guard(cap, pm):
                    if cap_name == "capped":
                        # no stacks: recording them on frees loses checkpoint's early-stop exception (see below)
                        torch.cuda.memory._record_memory_history(context=None, stacks="python", max_entries=2_000_000)
                    for _ in range(2):
                        step()
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    undo = _install(pm, tracer)
                    if cap_name == "capped" and history:
                        # NOTE: not by default: recording stacks on frees while checkpoint's early-stop exception
                        # unwinds loses that exception (run_backward "returned NULL without setting an exception",
                        # seen on the H200 with torch 2.11)
                        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
                    retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
                    try:
                        step()
                        tracer.mark("end")
                        tracer.finish()
                    finally:
                        undo()
                    retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries
                record[cap_name] = {"rows": tracer.rows, "alloc_retries": retries}
                total_ms = sum(r["ms"] for r in tracer.rows)
                print(f"  {cap_name}: ok, {total_ms:.1f} ms traced, {retries} allocation retries", flush=True)
            except Exception as exc:
                stats = torch.cuda.memory_stats()
                keep = (
                    "allocated_bytes.all.current",
                    "reserved_bytes.all.current",
                    "inactive_split_bytes.all.current",
                    "num_alloc_retries",
                    "num_ooms",
                    "active_bytes.all.current",
                )
                detail = getattr(exc, "detail", "") or str(exc)
                record[cap_name] = {
                    "rows": tracer.rows,
                    "error": str(exc),
                    "detail": detail,
                    "stats": {k: stats.get(k) for k in keep},
                    "trace": traceback.format_exc()[-3000:],
                }
                print(f"  {cap_name}: {type(exc).__name__}: {detail[:1200]}", flush=True)
                if cap_name == "capped" and history:
                    torch.cuda.memory._dump_snapshot(str(out_dir / f"snapshot-{name}.pickle"))
            finally:
                if cap_name == "capped":
                    _dump_events(out_dir / f"events-{name}.json.gz")
                torch.cuda.memory._record_memory_history(enabled=None)
                opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
            path.write_text(json.dumps(record, indent=1))
            sims = record["sim_stretches"]
            for r in tracer.rows:
                sp, sms = sims.get(r["stretch"], (0, float("nan")))
                print(
                    f"    {r['stretch']:8s} peak {r['peak_bytes'] / GiB:6.2f} sim {sp / GiB:6.2f} GiB  "
                    f"{r.get('ms', float('nan')):7.2f} ms sim {sms:7.2f}  reserved {r['reserved_bytes'] / GiB:6.2f} "
                    f"retries {r['retries_so_far']}",
                    flush=True,
                )


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    for cfg in sys.argv[2:]:
        run_config(out_dir, cfg, history=os.environ.get("MEMTRACE_HISTORY") == "1")


if __name__ == "__main__":
    main()

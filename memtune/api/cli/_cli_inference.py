"""``memtune tune MODEL --inference``: an inference plan (mmCNN) within a working-set budget, priced and optionally
run (NOTE [ Inference plans ] in ``memtune.tuner.inference._inference_plan``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from memtune.tuner import (
    InferenceFacts,
    InferencePlan,
    InferenceSim,
    format_bytes,
    parse_budget,
    plan_inference,
    simulate_inference,
)
from memtune.tuner.budget import Budget
from memtune.tuner.inference import facts_from_profile, plain_plan, working_sets

if TYPE_CHECKING:
    import torch

    from memtune.profiler import ModelChain, Profile
    from memtune.tuner.inference import ConvWorkspace

__all__ = ["tune_inference"]


def tune_inference(
    chain: ModelChain,
    *,
    batch: int,
    dtype: str,
    budget: str | Budget,
    device: str,
    measure: bool,
    profile: Callable[[], Profile],
    as_json: bool,
    plan_out: Path | None,
    out: Console,
    err: Console,
    repeats: int = 5,
    conv_workspace: str = "framework",
) -> None:
    """Plan ``chain``'s inference at ``batch`` within ``budget`` (per layer's working set) and print the plan and its
    priced latency; with ``measure``, take the facts from ``device`` and run the plan there too.

    Without ``measure`` the facts are ``profile()``'s (as ``tune`` finds one), the layers' bytes the model's own.
    Budgets follow NOTE [ Budget grammar ] (text, or a ``Budget`` already read): a fraction of the peak is of the
    plain model's largest working set (every weight resident), one of the GPU of its memory.

    ``conv_workspace`` (``InferencePlan.conv_workspace``): ``"none"`` runs convolutions without cuDNN workspace; it
    needs ``measure``, since a profile's times are those of the framework's algorithms.

    Raises:
        ValueError: ``device`` is not ``cpu`` or ``cuda``, or ``cuda`` is not here; ``conv_workspace`` is not
            ``framework`` or ``none``, or is ``none`` without ``measure``.
        ProfilerError, TunerError: the model is not a chain of supported layers, the budget is not understood, or no
            plan fits it (the messages name the layer).
    """
    import torch

    if conv_workspace not in ("framework", "none"):
        raise ValueError(f"--conv-workspace {conv_workspace!r}: 'framework' or 'none'")
    if conv_workspace == "none" and not measure:
        raise ValueError(
            "--conv-workspace none needs --measure: the layers are timed as they will run, and a profile timed the "
            "framework's convolution algorithms"
        )
    if measure and device not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: inference runs on cpu or cuda")
    if measure and device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU here; measure with --device cpu")
    torch_dtype = getattr(torch, dtype)  # checked by the caller: float32, bfloat16 or float16
    for stage in chain.stages:
        stage.module.to(torch_dtype).eval()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((batch, *chain.input_shape), generator=gen).to(torch_dtype)
    if measure:
        err.print(f"measuring {chain.name}'s layers on {device} …")
    facts, gpu_bytes = _facts(chain, x, device if measure else None, profile, conv_workspace)
    peak = max(ws.total_bytes for ws in working_sets(facts, plain_plan(facts)))
    budget_bytes = parse_budget(budget, gpu_bytes, peak_bytes=peak)
    plan = plan_inference(facts, budget_bytes)
    sim = simulate_inference(facts, plan)
    measured = _measure(chain, plan, x, device, repeats) if measure else None
    if plan_out is not None:
        plan_out.write_text(plan.model_dump_json(indent=1) + "\n")
    if as_json:
        sys.stdout.write(json.dumps(_as_dict(facts, plan, sim, budget_bytes, peak, measured)) + "\n")
        return
    where = f"measured on {facts.device}" if measure else f"{facts.source} profile of {facts.device}"
    out.print(f"[bold]{chain.name}[/] inference, batch {batch} {dtype}, facts {where}")
    out.print(_plan_table(facts, plan, sim))
    out.print(
        f"[bold green]priced latency {sim.latency_ms:.3f} ms[/] within {format_bytes(budget_bytes)} per layer "
        f"(largest working set {format_bytes(sim.peak_bytes)}; every weight resident: {format_bytes(peak)}); "
        f"{sim.copies} copies, {format_bytes(sim.h2d_bytes)} in, {format_bytes(sim.d2h_bytes)} out, "
        f"{sim.stall_ms:.3f} ms waiting for copies"
    )
    if measured is not None:
        same = "equals" if measured["equal"] else "[bold red]differs from[/]"
        out.print(
            f"[bold]measured latency {measured['latency_ms']:.3f} ms[/] on {facts.device} (median of {repeats}; the "
            f"plain model {measured['plain_ms']:.3f} ms); the output {same} the plain model's "
            f"(max |difference| {measured['max_abs_diff']:.3g})"
        )


def _facts(
    chain: ModelChain, x: torch.Tensor, device: str | None, profile: Callable[[], Profile], conv_workspace: str
) -> tuple[InferenceFacts, int | None]:
    """The facts to plan with and the GPU's memory, bytes (None on the CPU): measured on ``device``, or (None) the
    profile's times with the model's bytes."""
    import torch

    from memtune.tuner.measure.inference_measure import measure_facts
    from memtune.tuner.runtime.inference_facts import layer_shapes

    shapes = layer_shapes(chain, tuple(x.shape), x.dtype)  # first: a layer no plan runs is named before any work
    if device is not None:
        gpu = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else None
        workspace: ConvWorkspace = "none" if conv_workspace == "none" else "framework"
        return measure_facts(chain, x, device, name=chain.name, conv_workspace=workspace), gpu
    prof = profile()
    return facts_from_profile(prof, shapes), prof.device.memory_bytes


def _plan_table(facts: InferenceFacts, plan: InferencePlan, sim: InferenceSim) -> Table:
    table = Table("layer", "kind", "parts", "weights", "output", "working set", "ms", title=f"inference plan "
                  f"({plan.label})")  # fmt: skip
    for f, lp, ws, t in zip(facts.layers, plan.layers, sim.working_sets, sim.layers, strict=True):
        weights = "-" if not f.has_weights else ("prefetch" if lp.weights == "host_prefetch" else "resident")
        table.add_row(f.name, f.kind, str(lp.channel_parts), weights, lp.output, format_bytes(ws.total_bytes),
                      f"{t.end_ms - t.start_ms:.3f}")  # fmt: skip
    return table


def _measure(chain: ModelChain, plan: InferencePlan, x: torch.Tensor, device: str, repeats: int) -> dict[str, Any]:
    """Run ``plan`` and the plain model on ``device``: median latencies of ``repeats`` calls and whether the outputs
    agree (fp32: rtol 1e-5, atol 1e-6, TF32 off; half types: rtol 1e-2, atol 1e-3)."""
    import torch

    from memtune.tuner.measure.inference_measure import runner_median_ms
    from memtune.tuner.runtime import InferenceRunner

    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32 in both runs
    try:
        plain = InferenceRunner(chain, InferencePlan.resident([lp.name for lp in plan.layers]), device=device)
        ref = plain(x.clone())
        plain_ms = runner_median_ms(plain, x, repeats)
        del plain
        runner = InferenceRunner(chain, plan, device=device)
        y = runner(x.clone())
        latency = runner_median_ms(runner, x, repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    tol = (1e-5, 1e-6) if x.dtype == torch.float32 else (1e-2, 1e-3)
    diff = float((y.float() - ref.float()).abs().max())
    equal = bool(torch.allclose(y, ref, rtol=tol[0], atol=tol[1]))
    return {"latency_ms": latency, "plain_ms": plain_ms, "equal": equal, "max_abs_diff": diff, "repeats": repeats}


def _as_dict(
    facts: InferenceFacts,
    plan: InferencePlan,
    sim: InferenceSim,
    budget_bytes: int,
    resident_peak: int,
    measured: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "model": facts.model,
        "batch": facts.batch,
        "dtype": facts.dtype,
        "device": facts.device,
        "facts_source": facts.source,
        "budget_bytes": budget_bytes,
        "resident_peak_bytes": resident_peak,
        "plan": plan.model_dump(mode="json"),
        "priced": {
            "latency_ms": sim.latency_ms,
            "peak_bytes": sim.peak_bytes,
            "stall_ms": sim.stall_ms,
            "copies": sim.copies,
            "h2d_bytes": sim.h2d_bytes,
            "d2h_bytes": sim.d2h_bytes,
            "working_set_bytes": [ws.total_bytes for ws in sim.working_sets],
        },
        "measured": measured,
    }

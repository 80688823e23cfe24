"""Inference latency against the working-set budget (mmCNN, NOTE [ Inference plans ] in
``memtune.tuner.inference._inference_plan``).

    python -m benchmarks.inference_budget OUT_DIR [--device cuda] [--image-sizes 224,32] [--budgets ...]

For each input size: the zoo's VGG-16 (``memtune.profiler.zoo``, torchvision's layout) at batch 1, its layers measured
on the device (``memtune.tuner.measure.inference_measure.measure_facts``), then per budget the plan
(``memtune.tuner.plan_inference``), its priced latency and largest working set (``memtune.tuner.simulate_inference``),
and the plan run for real (``memtune.tuner.runtime.InferenceRunner``): the median latency of ``--repeats`` calls,
whether the output equals the plain model's (fp32, TF32 off: allclose rtol 1e-5, atol 1e-6) and, on CUDA, the peak of
allocated device memory during a call beyond what was allocated before it, plus the resident weights and the input:
comparable with the working set, which leaves out convolution workspaces (NOTE [ Inference plans ]). ``unlimited`` is
the plain model (every weight resident, nothing split). On CUDA every row runs twice: convolutions with the framework's
algorithms, and with cuDNN's workspace-free one (``--conv-workspace``). A budget no plan fits is recorded with the layer
that does not fit and what it needs. Writes ``inference-budget-<model>-<device>.json`` into ``OUT_DIR``.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment
from memtune.profiler import ModelChain, build
from memtune.tuner import InferenceFacts, InferencePlan, LayerFitError, parse_budget, plan_inference, simulate_inference
from memtune.tuner.inference import plain_plan
from memtune.tuner.measure.inference_measure import measure_facts, runner_median_ms
from memtune.tuner.runtime import InferenceRunner
from memtune.tuner.runtime.inference_facts import chain_layers

__all__ = ["main"]

DEFAULT_BUDGETS = "unlimited,64MiB,24MiB,16MiB,4MiB,1MiB"


def _run(
    chain: ModelChain, plan: InferencePlan, x: torch.Tensor, ref: torch.Tensor | None, device: str, repeats: int
) -> tuple[dict[str, Any], torch.Tensor]:
    """Run ``plan``: its measured numbers and its output (on the host).

    On CUDA, ``allocated_bytes`` is the working set as the allocator saw it during the second call: its peak of
    allocated memory above what was allocated just before (library workspaces kept from earlier calls, ...), plus the
    resident weights and the input, which the working set counts and which were allocated before."""
    runner = InferenceRunner(chain, plan, device=device)
    cuda = runner.device.type == "cuda"
    xd = x.to(runner.device)
    y = runner(xd.clone())  # the warm-up call
    out: dict[str, Any] = {"allocated_bytes": None}
    if cuda:
        inp = xd.clone()
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        runner(inp)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - before
        out["allocated_bytes"] = extra + runner.resident_bytes + inp.numel() * inp.element_size()
        del inp
    out["latency_ms"] = runner_median_ms(runner, xd, repeats)
    y = y.cpu()
    if ref is not None:
        out["max_abs_diff"] = float((y - ref).abs().max())
        out["equal"] = bool(torch.allclose(y, ref, rtol=1e-5, atol=1e-6))
    del runner, xd
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out, y


def _plan_summary(plan: InferencePlan) -> dict[str, Any]:
    return {
        "partitions": sum(lp.channel_parts for lp in plan.layers),
        "prefetched_layers": sum(lp.weights == "host_prefetch" for lp in plan.layers),
        "output_to_host_layers": sum(lp.output == "host" for lp in plan.layers),
        "compact": plan.compact(),
        "plan": plan.model_dump(mode="json"),
    }


def _budget_row(
    chain: ModelChain, facts: InferenceFacts, text: str, x: torch.Tensor, ref: torch.Tensor, args: argparse.Namespace
) -> dict[str, Any]:
    if text == "unlimited":
        budget, plan = None, plain_plan(facts)
    else:
        budget = parse_budget(text)
        try:
            plan = plan_inference(facts, budget)
        except LayerFitError as exc:
            return {"budget": text, "budget_bytes": budget, "feasible": False, "layer": exc.layer,
                    "need_bytes": exc.need_bytes, "error": str(exc)}  # fmt: skip
    sim = simulate_inference(facts, plan)
    measured, _ = _run(chain, plan, x, ref, args.device, args.repeats)
    row = {"budget": text, "budget_bytes": budget, "feasible": True, **_plan_summary(plan)}
    row["priced"] = {"latency_ms": sim.latency_ms, "peak_bytes": sim.peak_bytes, "stall_ms": sim.stall_ms,
                     "copies": sim.copies, "h2d_bytes": sim.h2d_bytes, "d2h_bytes": sim.d2h_bytes}  # fmt: skip
    row["measured"] = measured
    return row


def _shown(r: dict[str, Any]) -> str:
    if not r["feasible"]:
        return f"no plan fits: {r['layer']} needs {r['need_bytes'] / 2**20:.2f} MiB"
    m = r["measured"]
    allocated = "" if m["allocated_bytes"] is None else f", {m['allocated_bytes'] / 2**20:.2f} MiB allocated"
    ws = r["priced"]["peak_bytes"] / 2**20
    return (f"{r['priced']['latency_ms']:.2f} ms priced, {m['latency_ms']:.2f} ms measured, {r['partitions']} "
            f"partitions, working set {ws:.2f} MiB{allocated}, equal {m['equal']}")  # fmt: skip


def _size_run(model: str, size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every budget at one input size, once per way of running convolutions (``--conv-workspace``)."""
    chain = build(model, {"image_size": size})
    for stage in chain.stages:
        stage.module.eval()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((args.batch, *chain.input_shape), generator=gen)
    names = [n for n, _ in chain_layers(chain)]
    _, ref = _run(chain, InferencePlan.resident(names), x, None, args.device, 1)  # the plain model's output
    modes = []
    for mode in args.conv_workspace.split(","):
        facts = measure_facts(chain, x, args.device, repeats=args.repeats, name=chain.name, conv_workspace=mode)
        plain_run, _ = _run(chain, plain_plan(facts), x, ref, args.device, args.repeats)
        rows = []
        for text in args.budgets.split(","):
            rows.append(_budget_row(chain, facts, text.strip(), x, ref, args))
            print(f"{model} {size}px b{args.batch} {args.device} convs {mode} {text}: {_shown(rows[-1])}", flush=True)
        modes.append({"conv_workspace": mode, "plain": plain_run, "facts": facts.to_dict(), "budgets": rows})
    return {"image_size": size, "modes": modes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path, help="directory to write the JSON into")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    ap.add_argument("--model", default="vgg16", help="zoo model (a chain of supported layers)")
    ap.add_argument("--image-sizes", default="224,32", help="input sizes, pixels, comma-separated")
    ap.add_argument("--budgets", default=DEFAULT_BUDGETS, help="working-set budgets ('unlimited' = plain model)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per plan (median)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of torch (on a shared CPU, 1 times steadily)")
    ap.add_argument("--conv-workspace", default=None,
                    help="how convolutions run, comma-separated: framework, none (cuDNN without workspace); "
                    "default: both on CUDA, framework on the CPU")  # fmt: skip
    args = ap.parse_args()
    if args.conv_workspace is None:
        args.conv_workspace = "framework,none" if args.device == "cuda" else "framework"
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: the outputs are compared exactly
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    runs = [_size_run(args.model, int(s), args) for s in args.image_sizes.split(",")]
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    result = {
        "benchmark": "inference_budget",
        "model": args.model,
        "batch": args.batch,
        "device": device,
        "environment": environment(),
        "repeats": args.repeats,
        "cpu_threads": args.threads,
        "runs": runs,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"inference-budget-{args.model}-{args.device}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

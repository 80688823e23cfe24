"""Where ResNet-50's compiled regions lose against the whole model compiled: the memory layout of their convolutions.

    python -m benchmarks.region_layout --out benchmarks/results/h200/region-layout        # every case, one process
    python -m benchmarks.region_layout --cases whole,regions,blocks --out DIR

torchvision ResNet-50, batch 128, fp32, SGD with momentum, in one process on one GPU; each case's training step timed
by ``benchmarks.step_time.measure`` (wall, the host's issue, the GPU's time; 10 steps after 2 warm-up, with the
garbage collector on, then off), the graphs dynamo compiled, and where asked the GPU's kernel time of one step
(``torch.profiler``). The regions are the grid row's 22 (the stem's four modules, each bottleneck block, the pooling
and the classifier; ``benchmarks/results/h200/module-peers/resnet50.json``'s plan at 30%), every one kept, compiled at
activation budget 1, the stem's batch norm and in-place ReLU eager as there.

Cases: ``eager``; ``whole`` (``torch.compile`` of the model); ``regions`` (memtune's regions: ``memtune.planned``);
``blocks`` (each bottleneck and the classifier compiled alone by ``nn.Module.compile``, inductor's defaults);
``blocks_keep_strides_off`` (the same with ``keep_output_stride`` off, as memtune compiles its regions);
``blocks_forced`` (the same with ``force_layout_optimization`` too); ``cl_*`` the model and its input channels-last;
``regions_cl_input`` the input alone channels-last. What ``regions`` measures depends on the commit: before memtune
compiled regions in the whole model's layout (NOTE [ Regions in the whole model's layout ] in
``memtune.profiler.region_layout``) each region took the compiler's decision for itself; the committed results say
their commit.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["CASES", "main", "run_case"]

ROW = Path("benchmarks/results/h200/module-peers/resnet50.json")

CASES = ("eager", "whole", "regions", "blocks", "blocks_keep_strides_off", "blocks_forced", "cl_eager", "cl_whole",
         "cl_regions", "regions_cl_input")  # fmt: skip


def _kept_regions() -> Any:
    """The row's 22-region plan with every region kept, compiled at activation budget 1."""
    from memtune.tuner import Action, Plan

    row = json.loads(ROW.read_text())
    plan = Plan.model_validate(next(e for e in row["plans"] if e["fraction"] == 0.3)["plan_json"])
    return plan.with_(actions=[Action.KEEP] * len(plan.actions), compile_budget=1.0)


def _blocks(options: dict[str, Any] | None) -> Callable[[nn.Module], nn.Module]:
    def make(model: nn.Module) -> nn.Module:
        for name in _kept_regions().stages:
            if name.startswith("layer") or name == "fc":
                model.get_submodule(name).compile(options=options)
        return model

    return make


def _kernel_ms(model: nn.Module, run: nn.Module, x: torch.Tensor, loss_fn: Any) -> tuple[float, int]:
    """The GPU's kernel time of one training step (ms) and its kernels, by ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(run(x)).backward()
        opt.step()

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    for p in model.parameters():
        p.grad = None
    return sum(e.device_time_total for e in events) / 1e3, sum(e.count for e in events)


def run_case(case: str) -> dict[str, Any]:
    """One case's row (see the module docstring); a failure is the row's ``error``."""
    from torch._dynamo.utils import counters

    from benchmarks.module_peers import build
    from benchmarks.step_time import measure
    from memtune.tuner.runtime import planned

    makers: dict[str, Callable[[nn.Module], nn.Module]] = {
        "eager": lambda m: m,
        "whole": lambda m: torch.compile(m),  # type: ignore[return-value]
        "regions": lambda m: planned(m, _kept_regions()),
        "blocks": _blocks(None),
        "blocks_keep_strides_off": _blocks({"keep_output_stride": False}),
        "blocks_forced": _blocks({"keep_output_stride": False, "force_layout_optimization": True}),
    }
    base = case.removeprefix("cl_").removesuffix("_cl_input")
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model, x, loss_fn, opt, _ = build("resnet50")
    if case.startswith("cl_"):
        model = model.to(memory_format=torch.channels_last)
    if case.startswith("cl_") or case.endswith("_cl_input"):
        x = x.contiguous(memory_format=torch.channels_last)
    torch._dynamo.reset()
    before = dict(counters["stats"])
    row: dict[str, Any] = {"case": case}
    try:
        run = makers[base](model)
        row.update({k: round(v, 2) for k, v in measure(model, run, x, loss_fn, opt, 10).items()})
        row["graphs"] = {k: v - before.get(k, 0) for k, v in counters["stats"].items()}
        kernel_ms, kernels = _kernel_ms(model, run, x, loss_fn)
        row.update(kernel_ms=round(kernel_ms, 2), kernels=kernels)
    except Exception as exc:  # a case that fails is a result
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
    row["seconds"] = round(time.perf_counter() - t0, 1)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    from memtune.profiler.provenance import run_record

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"--cases: {', '.join(unknown)} not of {', '.join(CASES)}")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.region_layout times CUDA steps: no CUDA device here")
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "run": run_record(), "cases": []}
    for case in cases:
        out["cases"].append(run_case(case))
        print(json.dumps(out["cases"][-1]), flush=True)
        (args.out / "layout.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

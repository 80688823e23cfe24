"""Spatially split recompute segments on the GPU: peak memory and step time against the unsplit segment.

    python -m benchmarks.spatial_split OUT                       # both cases, on this CUDA GPU
    python -m benchmarks.spatial_split OUT --simulate-only       # no GPU: the plans and the simulator's figures

Two cases (NOTE [ Spatial splitting ] in ``memtune.tuner._spatial``):

* ``vgg16``: the zoo's VGG-16, 224x224 images, batch 32, fp32; the segment is its first two blocks (stages 0-9,
  ``features.0`` to ``features.9``: four convolutions, their ReLUs and two max-pools).
* ``vgg16-blocks12-1024``: those two blocks alone at 1024x1024, batch 2, fp32, then a small head (global average
  pool, flatten, a 128 -> 10 linear layer); the segment is the same stages 0-9.

Each case runs five ways: ``unplanned`` (the ``nn.Sequential`` itself), ``recompute`` (stages 0-9 one recompute
segment, every other stage ``keep``) and the same segment ``split 2``, ``split 4`` and ``split 8``. A row holds the
median step ms (CUDA events around forward, loss, backward and an SGD momentum update, NOTE [ Bench step ] in
``memtune.tuner.measure.bench``, after warm-up steps) and the peak bytes (``max_memory_allocated`` over the timed steps,
reset after warm-up; ``max_memory_reserved`` beside it), with the simulator's step and peak on the profile measured
here (``--profile measured``, ``memtune.profiler.measure.profile`` on this GPU; ``modeled`` takes the roofline profile).
Then the gradients: each planned row's loss and parameter gradients against an unplanned step (cuDNN deterministic,
TF32 off), in float32 and in float64, elementwise within rtol 1e-5 / atol 1e-6 or not, with the largest relative
error beside float32's noise: two unplanned steps, and an unplanned step with autotuned convolution algorithms.
Writes ``OUT/spatial-split-<case>.json`` per case and prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtune.profiler import ModelChain, Profile
from memtune.tuner import Plan, Simulator

__all__ = ["CASES", "Case", "build_case", "case_plans", "main"]

GiB = 1 << 30
STRIPS = (2, 4, 8)
DEVICE = "cuda"


@dataclass(frozen=True)
class Case:
    """One benchmark case: a chain, its batch and image size, and the segment that is re-run (inclusive stages)."""

    name: str
    batch: int
    image: int
    segment: tuple[int, int]
    head_only: bool = False  # VGG-16's first two blocks and a small head instead of the whole network


CASES = {
    "vgg16": Case("vgg16", 32, 224, (0, 9)),
    "vgg16-blocks12-1024": Case("vgg16-blocks12-1024", 2, 1024, (0, 9), head_only=True),
}


def build_case(case: Case) -> ModelChain:
    """The case's chain (parameters initialised as the zoo does, seed 0)."""
    import torch
    from torch import nn

    from memtune.profiler import build
    from memtune.profiler.chain import Stage

    torch.manual_seed(0)
    if not case.head_only:
        return build("vgg16", {"image_size": case.image, "num_classes": 1000})
    blocks = build("vgg16", {"image_size": 32, "num_classes": 10}).stages[:10]  # the layers do not depend on H
    head = [
        Stage("head.pool", "adaptiveavgpool2d", nn.AdaptiveAvgPool2d(1)),
        Stage("head.flatten", "flatten", nn.Flatten()),
        Stage("head.fc", "linear", nn.Linear(128, 10)),
    ]
    return ModelChain(
        name=case.name,
        stages=[*blocks, *head],
        input_shape=(3, case.image, case.image),
        params={"image_size": case.image, "num_classes": 10},
    )


def case_plans(case: Case, n_stages: int) -> list[tuple[str, Plan | None]]:
    """The rows of a case: ``unplanned`` (None), the segment re-run whole, and split into each of ``STRIPS``."""
    i, j = case.segment
    actions = ["r" if i <= k <= j else "k" for k in range(n_stages)]
    whole = Plan.from_actions(actions, label="recompute")
    rows: list[tuple[str, Plan | None]] = [("unplanned", None), ("recompute", whole)]
    rows += [(f"split {s}", whole.with_(spatial_splits={f"{i}-{j}": s}, label=f"split {s}")) for s in STRIPS]
    return rows


def _simulated(profile: Profile, plans: list[tuple[str, Plan | None]]) -> dict[str, dict[str, float]]:
    sim = Simulator(profile, "sgd")
    out = {}
    for name, plan in plans:
        r = sim.run(plan if plan is not None else Plan.uniform(profile.n_stages))
        out[name] = {"predicted_step_ms": round(r.step_ms, 3), "predicted_peak_bytes": r.peak_bytes}
    return out


def _clean() -> None:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _measure(
    chain: ModelChain, plans: list[tuple[str, Plan | None]], batch: int, warmup: int, iters: int
) -> dict[str, Any]:
    """Median step ms, peak allocated and reserved bytes of every row (NOTE [ Bench step ])."""
    import torch

    from memtune.profiler.loss import step_loss
    from memtune.tuner.measure.bench import make_batch, measure_step
    from memtune.tuner.runtime import planned

    device = torch.device(DEVICE)
    seq = chain.as_sequential().to(device)
    x, y = make_batch(chain, batch, device)
    out: dict[str, dict[str, Any]] = {}
    for name, plan in plans:
        _clean()
        model = seq if plan is None else planned(chain, plan)
        opt = torch.optim.SGD(seq.parameters(), lr=1e-4, momentum=0.9)

        def step(model: Callable[[torch.Tensor], torch.Tensor] = model, opt: torch.optim.SGD = opt) -> None:
            loss = step_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        try:
            ms, peak, reserved = measure_step(step, warmup=warmup, iters=iters)
            out[name] = {"step_ms": round(ms, 3), "peak_bytes": peak, "reserved_bytes": reserved}
        except torch.OutOfMemoryError as exc:
            out[name] = {"error": f"out of memory: {str(exc).splitlines()[0]}"}
        del model, opt, step
        seq.zero_grad(set_to_none=True)
    _clean()
    return out


def _gradients(chain: ModelChain, plans: list[tuple[str, Plan | None]], batch: int) -> dict[str, Any]:
    """Each planned row's loss and gradients against an unplanned step's, cuDNN deterministic and TF32 off, in float32
    and in float64: the largest relative error (``memtune.tuner.runtime.verify.relative_error``, per parameter) and
    whether every element is within rtol 1e-5 / atol 1e-6. Beside them, the float32 noise floors: two unplanned steps,
    and an unplanned step whose convolution algorithms PyTorch autotunes (``cudnn.benchmark``), i.e. the same math
    summed in another order."""
    import torch

    from memtune.profiler.loss import step_loss
    from memtune.tuner.measure.bench import make_batch
    from memtune.tuner.runtime import planned, reference_step
    from memtune.tuner.runtime.verify import deterministic_math, relative_error

    device = torch.device(DEVICE)
    seq = chain.as_sequential().to(device)
    x, y = make_batch(chain, batch, device)

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return step_loss(out, y)

    def compare(a: Any, b: Any) -> dict[str, Any]:
        pairs = [(a.loss, b.loss), *((p, q) for p, q in zip(a.grads, b.grads, strict=True) if q is not None)]
        return {
            "loss_error": relative_error(a.loss, b.loss),
            "grad_error": max(relative_error(p, q) for p, q in pairs[1:]),
            "allclose": all(torch.allclose(p, q, rtol=1e-5, atol=1e-6) for p, q in pairs),
        }

    def rows_at(xs: torch.Tensor) -> dict[str, dict[str, Any]]:
        ref = reference_step(chain, xs, loss_fn=loss_fn)
        rows = {"unplanned again": compare(reference_step(chain, xs, loss_fn=loss_fn), ref)}
        for name, plan in plans:
            if plan is not None:
                rows[name] = compare(reference_step(chain, xs, loss_fn=loss_fn, run=planned(chain, plan)), ref)
        return rows

    with deterministic_math():
        rows = rows_at(x)
        ref = reference_step(chain, x, loss_fn=loss_fn)
    with deterministic_math():  # TF32 stays off; only the algorithms change
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
        rows["unplanned, autotuned algorithms"] = compare(reference_step(chain, x, loss_fn=loss_fn), ref)
    seq.double()
    try:
        with deterministic_math():
            rows64 = rows_at(x.double())
    finally:
        seq.float()
    for p in seq.parameters():
        p.grad = None
    _clean()
    return {"rtol": 1e-5, "atol": 1e-6, "rows": rows, "float64": rows64}


def run_case(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    """Profile, simulate, measure and check one case."""
    from memtune.profiler import modeled_profile

    chain = build_case(case)
    plans = case_plans(case, len(chain))
    t0 = time.monotonic()
    if args.simulate_only or args.profile == "modeled":
        profile = modeled_profile(chain, case.batch, "float32", args.gpu)
    else:
        from memtune.profiler.measure import profile as measure_profile

        profile = measure_profile(chain, case.batch, "float32", device="cuda")
    profile_s = time.monotonic() - t0
    result: dict[str, Any] = {
        "case": case.name,
        "batch": case.batch,
        "image": case.image,
        "dtype": "float32",
        "segment": f"{case.segment[0]}-{case.segment[1]}",
        "segment_stages": [s.name for s in chain.stages[case.segment[0] : case.segment[1] + 1]],
        "device": profile.device.model_dump(),
        "profile_source": profile.source,
        "profile_s": round(profile_s, 1),
        "plans": {name: None if p is None else p.model_dump(mode="json") for name, p in plans},
        "simulated": _simulated(profile, plans),
    }
    if not args.simulate_only:
        result["measured"] = _measure(chain, plans, case.batch, args.warmup, args.iters)
        result["gradients"] = _gradients(chain, plans, case.batch)
    return result


def _table(result: dict[str, Any]) -> str:
    lines = [f"{result['case']} (batch {result['batch']}, {result['image']}x{result['image']}, segment "
             f"{result['segment']}, {result['profile_source']} profile)",
             f"{'row':<10} {'step ms':>9} {'peak GiB':>9} {'sim ms':>9} {'sim GiB':>9}  gradients"]  # fmt: skip
    measured = result.get("measured", {})
    grads = result.get("gradients", {}).get("rows", {})
    for name, sim in result["simulated"].items():
        m = measured.get(name, {})
        g = grads.get(name)
        ms = f"{m['step_ms']:9.2f}" if "step_ms" in m else f"{'-':>9}"
        peak = f"{m['peak_bytes'] / GiB:9.3f}" if "peak_bytes" in m else f"{'-':>9}"
        check = "" if g is None else f"{'allclose' if g['allclose'] else 'NOT CLOSE'} (grad {g['grad_error']:.1e})"
        lines.append(
            f"{name:<10} {ms} {peak} {sim['predicted_step_ms']:9.2f} {sim['predicted_peak_bytes'] / GiB:9.3f}  {check}"
            + (f"  {m['error']}" if "error" in m else "")
        )
    for name in ("unplanned again", "unplanned, autotuned algorithms"):
        if name in grads:
            lines.append(f"float32 noise, {name}: gradients differ by {grads[name]['grad_error']:.1e}")
    for name, g in result.get("gradients", {}).get("float64", {}).items():
        lines.append(f"float64, {name}: {'allclose' if g['allclose'] else 'NOT CLOSE'} (grad {g['grad_error']:.1e})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="directory for the JSON results")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--profile", choices=("measured", "modeled"), default="measured", help="what the simulator prices")
    ap.add_argument("--simulate-only", action="store_true", help="no GPU: the modeled profile's simulated figures")
    ap.add_argument("--gpu", default="h100", help="the GPU a modeled profile describes")
    args = ap.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    if not args.simulate_only:
        from memtune.tuner.runtime.guard import configure_allocator

        print(f"allocator: PYTORCH_CUDA_ALLOC_CONF={configure_allocator()}")
    from benchmarks.common import environment

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    for name in names:
        result = run_case(CASES[name], args)
        result["environment"] = environment()
        result["wall_s"] = round(time.monotonic() - t0, 1)
        path = args.out / f"spatial-split-{name}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(_table(result))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

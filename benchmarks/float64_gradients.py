"""Each gradient's error against float64, for a ``benchmarks.module_peers`` row: the unplanned compiled run (the
reference), the eager step, the compiler's re-cut (the model compiled whole at ``RECUT_BUDGET``) and the row's plan at
one fraction, all in the gradient check's setting (``compiled_math``; NOTE [ Gradients against float64 ] in
``memtune.tuner.runtime.float64``). Where a judgement's ratio is huge, this says whether the run is off by rounding or
by the gradient's own size.

    python -m benchmarks.float64_gradients ROW.json OUT.json MODEL FRACTION     # on one GPU

Writes one entry per parameter to OUT.json (``name``, ``numel``, the float64 gradient's root-mean-square
``truth_rms`` and largest entry ``truth_absmax``, then each run's RMSE against it: ``ref``, ``eager``, ``recut`` and
``plan<FRACTION>``; -1 where a run left the gradient None) and prints, per run, the six gradients of largest
RMSE over the reference's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    import torch
    from torch._dynamo.utils import rmse

    from benchmarks.module_peers import RECUT_BUDGET, build, compiled_math
    from memtune.tuner import Plan
    from memtune.tuner.measure.module_peers import applicable_peers, applied
    from memtune.tuner.runtime import check_equivalence, fitting_float64_step, reference_step

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row", type=Path, help="a benchmarks.module_peers row (its plans' plan_json are read)")
    parser.add_argument("out", type=Path, help="the JSON to write")
    parser.add_argument("model", help="the row's model name, as benchmarks.module_peers builds it")
    parser.add_argument("fraction", type=float, help="the fraction of the row's plan to check beside the others")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model, inputs, loss, _, _ = build(args.model)
    row = json.loads(args.row.read_text())
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    peers = applicable_peers(model, inputs, compiler_budgets=[1.0, RECUT_BUDGET])
    whole, recut = (p for p in peers if p.family == "compiler")
    with compiled_math(), applied(model, whole) as run, applied(model, recut) as other:
        ref = reference_step(model, inputs, loss_fn=loss, run=run)
        truth, error = fitting_float64_step(model, inputs, loss_fn=loss)
        if truth is None:
            raise SystemExit(error)
        runs: dict[str, Sequence[Any]] = {
            "eager": reference_step(model, inputs, loss_fn=loss).grads,
            "recut": reference_step(model, inputs, loss_fn=loss, run=other).grads,
        }
        for e in row["plans"]:
            if e.get("fraction") == args.fraction and "plan_json" in e:
                _, pm = check_equivalence(model, Plan.model_validate(e["plan_json"]), inputs, loss_fn=loss,
                                          reference=ref, steps=1)  # fmt: skip
                runs[f"plan{e['fraction']}"] = tuple(None if p.grad is None else p.grad.clone() for p in params)
                pm.release()
    entries = []
    for i, name in enumerate(names):
        t, r = truth.grads[i], ref.grads[i]
        if t is None or r is None:
            continue
        d = {"name": name, "numel": t.numel(), "truth_rms": float(t.pow(2).mean().sqrt()),
             "truth_absmax": float(t.abs().max()), "ref": float(rmse(t, r))}  # fmt: skip
        for k, g in runs.items():
            d[k] = float(rmse(t, g[i])) if g[i] is not None else -1.0
        entries.append(d)
    args.out.write_text(json.dumps(entries))
    for k in runs:
        top = sorted(entries, key=lambda d: d[k] / d["ref"] if d["ref"] > 0 else float("inf"), reverse=True)[:6]
        print(k)
        for d in top:
            sizes = f"n={d['numel']:5d} truth_rms={d['truth_rms']:.3e} absmax={d['truth_absmax']:.3e}"
            print(f"  {d['name']:36s} {sizes} ref={d['ref']:.3e} {k}={d[k]:.3e} eager={d['eager']:.3e}")


if __name__ == "__main__":
    main()

"""What ``tune`` serves once a profile carries the compiler points of a bench run (NOTE [ Whole-model compile ]).

Reads ``memtune bench --compiler-sweep … --json-out`` files, adds their measured ``torch.compile`` points to the
shipped profile of the same model, batch, dtype and GPU, and tunes at each fraction of the unconstrained peak with
the GPU type's calibrated headroom. Prints one markdown row per model and fraction: the plan served, its step and
peak (measured points for a whole-model compile, simulated otherwise). CPU only; a few seconds per row.

    python -m benchmarks.compiler_choice benchmarks/results/h100/compiled/bench-*-whole.json --fractions 0.4,0.6,0.8
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import optuna

from memtune.profiler import CompilerPoint, find_profile
from memtune.tuner import tune
from memtune.tuner.calibration import calibration_for
from memtune.tuner.measure.compiler_points import with_compiler_points

GiB = 1 << 30


def rows(path: Path, fractions: list[float], trials: int) -> list[str]:
    """The markdown rows of one bench file."""
    d = json.loads(path.read_text())
    gpu = d["device"]["key"]
    prof = find_profile(d["model"], d["batch"], d["dtype"], gpu)
    if prof is None:
        raise SystemExit(f"{path}: no shipped profile of {d['model']} b{d['batch']} {d['dtype']} on {gpu}")
    points = [
        CompilerPoint(
            activation_budget=r["compile_budget"],
            step_ms=r["step_ms"],
            peak_bytes=r["peak_bytes"],
            reserved_bytes=r.get("reserved_bytes"),
        )
        for r in d["rows"]
        if r["kind"] == "compiler" and r.get("step_ms") and r.get("compile_budget") is not None
    ]
    prof = with_compiler_points(prof, points)
    headroom = calibration_for(gpu).headroom
    out = []
    for f in fractions:
        best = tune(
            prof, int(f * d["unconstrained_simulated_peak_bytes"]), trials=trials, seed=0, headroom=headroom
        ).best
        what = "no plan fits" if best is None else best.plan.compact()
        step = "-" if best is None else f"{best.step_ms:.1f}"
        peak = "-" if best is None else f"{best.peak_bytes / GiB:.2f}"
        source = "-" if best is None else best.source
        out.append(f"| {d['model']} b{d['batch']} {d['dtype']} | {f:.0%} | {what} | {step} | {peak} | {source} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--fractions", default="0.4,0.6,0.8")
    ap.add_argument("--trials", type=int, default=150)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("| model | budget (of the peak) | plan served | step ms | peak GiB | priced by |")
    print("|---|---|---|---|---|---|")
    for path in args.files:
        for line in rows(path, [float(f) for f in args.fractions.split(",")], args.trials):
            print(line)


if __name__ == "__main__":
    main()

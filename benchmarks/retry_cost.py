"""Allocator retries: the placement model's predictions beside committed H200 measurements, and the fit of
their cost (NOTE [ Allocator placement ] in ``memtune.tuner.placement``).

    python -m benchmarks.retry_cost benchmarks/results/bench-*.json            # table, current calibration
    python -m benchmarks.retry_cost --fit FILE...                               # least-squares ms per GiB

For every row of a ``memtune bench --json-out`` file that ran one of our plans under the cap and stored its
plan (``plan_json``), it takes the plan as PyTorch's convolutions run it under the cap (NOTE [ Framework fallback ]
in ``memtune.tuner.capped``), replays as many steps as the bench ran (warm-up + timed) through the allocator model
at the row's budget and prints the measured and predicted retries per step, the GiB the predicted retries
unmap per timed step, and the step error of the simulator alone and with the retries priced. ``--fit`` finds
the ms per GiB unmapped that best explains measured-minus-simulated step time over the rows (least squares
through the origin) — the number ``memtune/tuner/data/calibration-h200.json`` holds. Nothing is measured here.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtune.api.cli import resolve_profile
from memtune.profiler import Profile, build
from memtune.tuner import Plan, Simulator
from memtune.tuner.calibration import calibration_for
from memtune.tuner.capped import framework_fallback
from memtune.tuner.placement import predict_retries

__all__ = ["RetryRow", "fit_ms_per_gib", "read_run", "rows_of"]

GiB = 2**30


@dataclass(frozen=True)
class RetryRow:
    """One measured plan beside the placement model's prediction (ms, retries per step, GiB per step)."""

    run: str
    name: str
    measured_ms: float
    simulated_ms: float
    measured_retries: float
    predicted_retries: float
    remapped_gib: float
    out_of_memory: bool


def read_run(path: Path) -> tuple[dict[str, Any], Profile]:
    """A ``memtune bench --json-out`` file and the committed H200 profile its rows ran.

    A run whose file does not say ``profile_split_rows`` ran before profiles had batch-split rows (NOTE [ Batch
    split ]); it gets the profile without them, so its ``fastest_within`` plans resolve as they ran."""
    try:
        run = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"{path}: cannot read a bench JSON ({exc})") from exc
    if not isinstance(run, dict) or not {"model", "batch", "dtype", "rows"} <= run.keys():
        raise SystemExit(f"{path}: not a `memtune bench --json-out` file (needs model, batch, dtype and rows)")
    profile = resolve_profile(build(run["model"], {}), run["batch"], run["dtype"], "h200")
    return run, profile if run.get("profile_split_rows") else profile.without_splits()


def rows_of(path: Path, steps: int = 8, warmup: int = 2, compute_scale: float | None = None) -> list[RetryRow]:
    """The rows of one bench file that ran our plans with ``plan_json``, replayed for ``steps`` steps.

    ``compute_scale`` overrides the calibration's factor for the profile (NOTE [ Compute scale ])."""
    run, profile = read_run(path)
    sim = Simulator(profile, compute_scale=compute_scale)
    out = []
    for row in run["rows"]:
        if row["step_ms"] is None or not row.get("plan_json") or row["kind"] in ("unconstrained", "pytorch"):
            continue
        # as it runs under the cap: PyTorch's convolutions fall back where their workspace does not fit
        plan = framework_fallback(profile, Plan.model_validate(row["plan_json"]), row["budget_bytes"], sim)
        placed = predict_retries(profile, plan, row["budget_bytes"], steps=steps)
        timed = placed.remapped_bytes[warmup:] or placed.remapped_bytes
        out.append(
            RetryRow(
                run=path.stem.removeprefix("bench-"),
                name=row["name"],
                measured_ms=row["step_ms"],
                simulated_ms=sim.run(plan).step_ms,
                measured_retries=row.get("alloc_retries") or 0.0,
                predicted_retries=placed.mean_retries,
                remapped_gib=sum(timed) / max(1, len(timed)) / GiB,
                out_of_memory=placed.out_of_memory is not None,
            )
        )
    return out


def fit_ms_per_gib(rows: list[RetryRow]) -> float:
    """Least-squares ms per GiB unmapped (through the origin) over rows the model fits and says retry."""
    used = [r for r in rows if not r.out_of_memory and r.remapped_gib > 0]
    den = sum(r.remapped_gib**2 for r in used)
    if not den:
        raise SystemExit("no row with predicted retries to fit")
    return sum(r.remapped_gib * (r.measured_ms - r.simulated_ms) for r in used) / den


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--fit", action="store_true", help="print the least-squares ms per GiB unmapped")
    ap.add_argument("--ms-per-gib", type=float, help="price retries at this many ms per GiB (default: calibration)")
    args = ap.parse_args()
    rows = [r for f in args.files for r in rows_of(f)]
    if args.fit:
        cost, where = fit_ms_per_gib(rows), "fitted on these rows"
    elif args.ms_per_gib is not None:
        cost, where = args.ms_per_gib, "--ms-per-gib"
    else:
        cost, where = calibration_for("h200").remap_ms_per_gib or 0.0, "memtune/tuner/data calibration"
    print(f"ms per GiB unmapped: {cost:.2f} ({where})\n")
    print(
        "| run | configuration | measured ms | retries measured / predicted | GiB unmapped per step | "
        "sim err | sim + retries err |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        with_retries = r.simulated_ms + r.remapped_gib * cost
        print(
            f"| {r.run} | {r.name} | {r.measured_ms:.1f} | {r.measured_retries:.1f} / "
            f"{'out of memory' if r.out_of_memory else f'{r.predicted_retries:.1f}'} | {r.remapped_gib:.1f} | "
            f"{r.simulated_ms / r.measured_ms - 1:+.1%} | {with_retries / r.measured_ms - 1:+.1%} |"
        )
    print()
    for label, group in (("tuned", True), ("other", False)):
        rs = [r for r in rows if r.name.startswith("tuned") == group and not r.out_of_memory]
        if rs:
            alone = [r.simulated_ms / r.measured_ms - 1 for r in rs]
            priced = [(r.simulated_ms + r.remapped_gib * cost) / r.measured_ms - 1 for r in rs]
            print(
                f"{label} rows: {len(rs)}; within 10%: simulator {sum(abs(e) <= 0.1 for e in alone)}, "
                f"with retries {sum(abs(e) <= 0.1 for e in priced)}; error {min(alone):+.1%} … {max(alone):+.1%} "
                f"(mean |e| {sum(map(abs, alone)) / len(rs):.1%}) against {min(priced):+.1%} … {max(priced):+.1%} "
                f"(mean |e| {sum(map(abs, priced)) / len(rs):.1%})"
            )
    fits = [r for r in rows if not r.out_of_memory]
    close = sum(abs(r.measured_retries - r.predicted_retries) <= 0.5 for r in fits)
    print(f"retries per step predicted within 0.5 of the measurement: {close} of {len(fits)} rows")


if __name__ == "__main__":
    main()

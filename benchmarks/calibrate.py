"""Derive the H200 calibration of the cost model from committed ``memtune bench`` runs.

    python -m benchmarks.calibrate benchmarks/results/bench-*.json            # print
    python -m benchmarks.calibrate --write benchmarks/results/bench-*.json    # and update memtune/tuner/data

Two numbers come from measurements (``memtune.tuner.calibration``):

- per measured profile, the compute scale (NOTE [ Compute scale ]): the median over the files of that profile of
  the measured unconstrained step divided by the simulated one (the simulator run with no scale);
- the ms per GiB an allocator retry unmaps (NOTE [ Allocator placement ]): the least-squares fit of
  measured-minus-simulated step time of every plan that ran under the cap against the GiB its predicted
  retries unmap, with the simulator already scaled (``benchmarks.retry_cost``).

Nothing is measured here: it reads JSON and simulates on the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from importlib.resources import files
from pathlib import Path

from benchmarks.retry_cost import fit_ms_per_gib, read_run, rows_of
from memtune.tuner import Plan, Simulator
from memtune.tuner.calibration import profile_key

__all__ = ["compute_scales"]


def compute_scales(paths: list[Path]) -> dict[str, float]:
    """Measured / simulated (unscaled) unconstrained step per profile key, the median over ``paths``."""
    ratios: dict[str, list[float]] = {}
    for path in paths:
        run, profile = read_run(path)
        row = next((r for r in run["rows"] if r["kind"] == "unconstrained" and r["step_ms"]), None)
        if row is None or profile.source != "measured":
            continue
        simulated = Simulator(profile, compute_scale=1.0).run(Plan.uniform(profile.n_stages)).step_ms
        ratios.setdefault(profile_key(profile), []).append(row["step_ms"] / simulated)
    return {k: round(statistics.median(v), 4) for k, v in sorted(ratios.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--write", action="store_true", help="update memtune/tuner/data/calibration-h200.json")
    args = ap.parse_args()
    scales = compute_scales(args.files)
    rows = []
    for path in args.files:
        _, profile = read_run(path)
        rows += rows_of(path, compute_scale=scales.get(profile_key(profile), 1.0))
    remap = round(fit_ms_per_gib(rows), 2)
    for key, value in scales.items():
        print(f"compute scale {key}: {value}")
    print(f"ms per GiB unmapped by retries: {remap} ({len(rows)} rows)")
    if args.write:
        target = Path(str(files("memtune.tuner").joinpath("data", "calibration-h200.json")))
        data = json.loads(target.read_text())
        today = datetime.date.today().isoformat()
        names = ", ".join(sorted(p.name for p in args.files))
        data["compute_scale"] = scales
        data["compute_source"] = f"python -m benchmarks.calibrate on {today}: {names}"
        data["remap_ms_per_gib"] = remap
        data["remap_source"] = f"python -m benchmarks.calibrate on {today} (with the compute scales): {names}"
        target.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {target}")


if __name__ == "__main__":
    main()

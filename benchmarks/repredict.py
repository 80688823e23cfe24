"""Re-simulate the plans of committed ``memtune bench`` runs with the current simulator.

    python -m benchmarks.repredict benchmarks/results/bench-*.json

A bench row's prediction is the simulator's at the time of the run. When the cost model changes, the
measurements stay valid but the predictions beside them do not; this prints, for every row that ran, the
measured step and peak beside the prediction stored with the run and today's (for rows under the cap, the
simulator on the plan as PyTorch's convolutions run it under the cap, plus the calibrated price of the retries
the placement model predicts: ``memtune.tuner.capped.predict_capped``, as ``memtune bench`` prints).
A row's plan is rebuilt from ``plan_json`` when the run stored it, else (runs before that field) by running
the baseline policy again at the row's budget (policies are deterministic); tuned rows of older runs are
skipped (their knobs are not all in the file). Nothing is measured here: it reads JSON and simulates on the CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from benchmarks.retry_cost import read_run
from memtune.profiler import Profile
from memtune.tuner import Plan, run_policy, simulate
from memtune.tuner.capped import predict_capped

__all__ = ["repredict_file"]

GiB = 2**30


def _plan_of(row: dict[str, Any], profile: Profile) -> Plan | None:
    if row.get("plan_json"):
        return Plan.model_validate(row["plan_json"])
    if row["kind"] == "policy":
        return run_policy(row["name"], profile, row["budget_bytes"])
    return None


def repredict_file(path: Path) -> list[str]:
    """Markdown table rows (configuration, measured, stored and current predictions) for one bench JSON."""
    run, profile = read_run(path)
    lines = []
    for row in run["rows"]:
        if row["step_ms"] is None or row["kind"] == "pytorch":
            continue
        plan = _plan_of(row, profile)
        if plan is None:
            continue
        if row["kind"] != "unconstrained":  # under the cap: fallbacks and the retries' price, as in bench
            capped = predict_capped(profile, plan, row["budget_bytes"], steps=8)
            sim, now = capped.sim, capped.step_ms
        else:
            sim = simulate(profile, plan)
            now = sim.step_ms
        ms, peak = row["step_ms"], row["peak_bytes"]
        lines.append(
            f"| {path.stem.removeprefix('bench-')} | {row['name']} | {ms:.1f} | {row['predicted_step_ms']:.1f} "
            f"({row['predicted_step_ms'] / ms - 1:+.1%}) | {now:.1f} ({now / ms - 1:+.1%}) | "
            f"{peak / GiB:.2f} | {sim.peak_bytes / GiB:.2f} ({sim.peak_bytes / peak - 1:+.1%}) | "
            f"{row.get('alloc_retries') or 0:.1f} |"
        )
    return lines


def main() -> None:
    print(
        "| run | configuration | measured ms | predicted then (err) | predicted now (err) | measured peak GiB "
        "| predicted now GiB (err) | retries |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for arg in sys.argv[1:]:
        for line in repredict_file(Path(arg)):
            print(line)


if __name__ == "__main__":
    main()

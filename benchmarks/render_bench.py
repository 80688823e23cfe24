"""Render `memtune bench --json-out` files as the markdown tables of BENCHMARKS.md.

    python -m benchmarks.render_bench benchmarks/results/bench-*.json           # one table per file
    python -m benchmarks.render_bench --sweep benchmarks/results/h100/sweep/*.json  # one row per tuned budget

``--sweep`` lists every tuned plan of the files (the main budget's and ``--sweep``'s, at the calibrated headroom) by
its budget as a share of the simulated unconstrained peak, with the measured and predicted step and peak; a budget
where no plan fits has no row (``bench`` says so on stderr). A file with a NOTE [ Run record ] names its commit and
date in its table's heading; older files render as before.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from memtune.profiler.provenance import run_of

__all__ = ["main", "render", "render_sweep"]

GiB = float(1 << 30)


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _retries(row: dict[str, Any]) -> str:
    """Measured allocator retries per step, and the placement model's prediction where the row has one."""
    predicted = row.get("predicted_retries")
    return _f(row.get("alloc_retries"), ".1f") + ("" if predicted is None else f" / {predicted:.1f}")


def _made(data: dict[str, Any]) -> str:
    """``; commit <short>, <date>`` from the file's NOTE [ Run record ], or nothing for a file written before."""
    run = run_of(data)
    if run is None:
        return ""
    commit = (run.get("commit") or "unknown commit")[:10] + ("+" if run.get("dirty") else "")
    return f"; commit {commit}, {str(run.get('date') or '')[:10]}"


def render(path: Path) -> str:
    """One markdown table for one bench file."""
    d = json.loads(path.read_text())
    dev = d["device"]
    rows = d["rows"]
    base = next((r["step_ms"] for r in rows if r.get("kind") == "unconstrained"), rows[0]["step_ms"])
    lines = [
        f"**{d['model']} batch {d['batch']} {d['dtype']}** on {dev['name']} (driver {dev['driver']}, torch "
        f"{dev['torch_version']}, cuDNN {dev['cudnn_version']}; `{path.name}`{_made(d)})",
        "",
        "| configuration | budget GiB | step ms | × unconstrained | peak GiB | fits | sim ms | sim err | "
        "sim peak GiB | peak err | retries (measured / predicted) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = f" — {r['error'][:90]}" if r.get("error") else ""
        lines.append(
            f"| {r['name']}{err} | {_f(r['budget_bytes'] and r['budget_bytes'] / GiB, '.2f')} | "
            f"{_f(r['step_ms'], '.1f')} | {_f(r['step_ms'] and r['step_ms'] / base, '.2f')} | "
            f"{_f(r['peak_bytes'] and r['peak_bytes'] / GiB, '.2f')} | "
            f"{'-' if r['fits'] is None else ('yes' if r['fits'] else 'no')} | {_f(r['predicted_step_ms'], '.1f')} | "
            f"{_f(r['step_error'], '+.1%')} | "
            f"{_f(r['predicted_peak_bytes'] and r['predicted_peak_bytes'] / GiB, '.2f')} | "
            f"{_f(r['peak_error'], '+.1%')} | {_retries(r)} |"
        )
    return "\n".join(lines)


def render_sweep(paths: list[Path]) -> str:
    """One markdown table of the tuned plans of several bench files: budget (share of the peak and GiB), measured
    and predicted step (ms) and peak (GiB), and whether the measured peak stayed under the budget."""
    lines = [
        "| model | dtype | budget | budget GiB | step ms measured / predicted | sim err | peak GiB measured / "
        "predicted | peak err | under the budget |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        d = json.loads(path.read_text())
        peak = d["unconstrained_simulated_peak_bytes"]
        tuned = [r for r in d["rows"] if r["kind"] == "tuned" and "no algorithm choice" not in r["name"]]
        for r in sorted(tuned, key=lambda r: r["budget_bytes"]):
            under = "-" if r["peak_bytes"] is None else ("yes" if r["peak_bytes"] <= r["budget_bytes"] else "no")
            lines.append(
                f"| {d['model']} b{d['batch']} | {d['dtype']} | {r['budget_bytes'] / peak:.0%} | "
                f"{r['budget_bytes'] / GiB:.2f} | {_f(r['step_ms'], '.1f')} / {_f(r['predicted_step_ms'], '.1f')} | "
                f"{_f(r['step_error'], '+.1%')} | {_f(r['peak_bytes'] and r['peak_bytes'] / GiB, '.2f')} / "
                f"{_f(r['predicted_peak_bytes'] and r['predicted_peak_bytes'] / GiB, '.2f')} | "
                f"{_f(r['peak_error'], '+.1%')} | {under}{' — ' + r['error'][:80] if r.get('error') else ''} |"
            )
    return "\n".join(lines)


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--sweep"]:
        print(render_sweep([Path(a) for a in args[1:]]))
        return
    for name in args:
        print(render(Path(name)))
        print()


if __name__ == "__main__":
    main()

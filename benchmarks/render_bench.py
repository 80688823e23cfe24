"""Render `memtune bench --json-out` files as the markdown tables of BENCHMARKS.md.

python -m benchmarks.render_bench benchmarks/results/bench-*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "render"]

GiB = float(1 << 30)


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _retries(row: dict[str, Any]) -> str:
    """Measured allocator retries per step, and the placement model's prediction where the row has one."""
    predicted = row.get("predicted_retries")
    return _f(row.get("alloc_retries"), ".1f") + ("" if predicted is None else f" / {predicted:.1f}")


def render(path: Path) -> str:
    """One markdown table for one bench file."""
    d = json.loads(path.read_text())
    dev = d["device"]
    rows = d["rows"]
    base = rows[0]["step_ms"]
    lines = [
        f"**{d['model']} batch {d['batch']} {d['dtype']}** on {dev['name']} (driver {dev['driver']}, torch "
        f"{dev['torch_version']}, cuDNN {dev['cudnn_version']}; `{path.name}`)",
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


def main() -> None:
    for name in sys.argv[1:]:
        print(render(Path(name)))
        print()


if __name__ == "__main__":
    main()

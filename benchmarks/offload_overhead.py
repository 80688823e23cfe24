"""What offload cost beside its prediction, per plan of the peers benchmark that offloads (from committed rows, no GPU).

    python -m benchmarks.offload_overhead benchmarks/results/h200/module-peers/bert_mlm.json \
        benchmarks/results/h200/module-peers/vit_b_16.json

For each plan of a ``benchmarks.module_peers`` row that offloads a region or stage: the bytes it offloads (the
``saved_bytes`` of the stages it offloads, in the profile it was searched on, ``benchmarks.peer_rows.plan_profile``),
its predicted step, its step measured without the cap, and the difference per GiB offloaded and per stage offloaded
(with how many stages it recomputes, whose cost the difference may hold too).
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import print_row_lines
from benchmarks.peer_rows import plan_profile
from memtune.tuner import Plan

GiB = float(1 << 30)


def lines(row: dict[str, Any]) -> list[str]:
    """One line per plan of ``row`` that offloads and was measured without the cap."""
    out = []
    for e in row.get("plans", []):
        plan, uncapped = e.get("plan_json"), e.get("uncapped") or {}
        if plan is None or "offload" not in plan["actions"] or "step_ms" not in uncapped:
            continue
        stages = plan_profile(row, Plan.model_validate(plan)).stages
        moved = sum(s.saved_bytes for s, a in zip(stages, plan["actions"], strict=True) if a == "offload") / GiB
        offloaded, recomputed = plan["actions"].count("offload"), plan["actions"].count("recompute")
        predicted, measured = e["predicted"]["step_ms"], uncapped["step_ms"]
        out.append(
            f"{row['model']} at {e['fraction']:.0%}: {moved:.2f} GiB offloaded from {offloaded} of {len(stages)} "
            f"stages ({recomputed} recomputed), predicted {predicted:.1f} ms, measured {measured:.1f} ms uncapped, "
            f"{(measured - predicted) / moved:+.1f} ms per GiB, {(measured - predicted) / offloaded:+.2f} ms per stage "
            "offloaded"
        )
    return out


def main() -> None:
    print_row_lines(__doc__, lines)


if __name__ == "__main__":
    main()

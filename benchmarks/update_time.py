"""What the optimizer's update adds to a step beside the simulator's prediction, per peers-benchmark row (from committed
rows, no GPU).

    python -m benchmarks.update_time benchmarks/results/h200/module-peers/*.json

The simulator's step is the forward and the backward (``memtune.tuner.SimResult.step_ms``), while every step the
benchmark times, and every compiler point, is a training step: forward, loss, backward and the optimizer's update.
Per row: the update's share, read as the unplanned eager step measured less the simulated keep-everything step of the
profile the row was searched on (whose stages add up to its measured forward and backward, NOTE [ Time outside
stages ]), beside the parameters' bytes and the update timed by the optimizer's step hooks where the row holds it
(``benchmarks.peer_rows.row_update_ms``); then each plan measured without the cap, its prediction with the update
added (the timed one where there is one, else the share), and the difference left. A plan that compiles the model
whole, searched on a compiler point measured before points timed their update, was predicted by the point's whole
step, which holds the update already (``held_update``); a point that timed it is priced without it (NOTE [ The
optimizer's update ] in ``memtune.tuner._whole``), like every other plan.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import print_row_lines
from benchmarks.peer_rows import row_update_ms, searched_profile
from memtune.tuner import Action, Plan, Simulator

__all__ = ["held_update", "lines", "update_ms"]

GiB = float(1 << 30)


def update_ms(row: dict[str, Any]) -> float:
    """The unplanned eager step of ``row`` measured less its profile's simulated keep-everything step, ms."""
    prof = searched_profile(row)
    keep = Simulator(prof, row["optimizer"]).run(Plan.uniform(prof.n_stages, Action.KEEP)).step_ms
    return float(row["unplanned"]["step_ms"]) - keep


def held_update(row: dict[str, Any], entry: dict[str, Any]) -> bool:
    """Whether the prediction of ``entry`` (a plan of ``row``) holds the update: its plan compiles the whole model,
    priced by a compiler point that did not time its update, searched before the row measured it (plans searched
    since carry ``searched_at`` and were priced with ``benchmarks.peer_rows.point_update_ms``)."""
    budget = (entry.get("plan_json") or {}).get("whole_compile")
    if budget is None or "searched_at" in entry:
        return False
    point: dict[str, Any] = next(
        (p for p in row["peers"] if p["family"] == "compiler" and p.get("activation_budget") == budget), {}
    )
    return point.get("update_ms") is None


def lines(row: dict[str, Any]) -> list[str]:
    """The row's update share, then one line per plan measured without the cap."""
    prof = searched_profile(row)
    params = (sum(s.param_bytes for s in prof.stages) + prof.outside_param_bytes) / GiB
    estimate, timed = update_ms(row), row_update_ms(row)
    update = timed if timed is not None else estimate
    said = f", timed {timed:.1f} ms by the optimizer's step hooks" if timed is not None else ""
    head = f"{row['model']}: update {estimate:+.1f} ms a step{said}"
    out = [f"{head} ({row['optimizer']}, {params:.2f} GiB of parameters)"]
    for e in row.get("plans", []):
        measured = (e.get("uncapped") or {}).get("step_ms")
        if measured is None or "predicted" not in e:
            continue
        predicted = e["predicted"]["step_ms"]
        if held_update(row, e):  # a compiler point's whole step, update included
            out.append(f"  at {e['fraction']:.0%}: the compiler's point, measured {predicted:.1f} ms with its update, "
                       f"{measured:.1f} again uncapped: {measured / predicted - 1:+.1%}")  # fmt: skip
            continue
        out.append(
            f"  at {e['fraction']:.0%}: predicted {predicted:.1f} ms, with the update {predicted + update:.1f}, "
            f"measured {measured:.1f} uncapped: {measured / predicted - 1:+.1%} before, "
            f"{measured / (predicted + update) - 1:+.1%} with it"
        )
    return out


def main() -> None:
    print_row_lines(__doc__, lines)


if __name__ == "__main__":
    main()

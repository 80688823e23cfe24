"""The simulated peak of every uniform plan on each profile of a peers row (from committed rows, CPU, nothing measured).

    python -m benchmarks.uniform_peaks benchmarks/results/h200/module-peers/gpt2.json

For the row's searched profile (``benchmarks.module_peers.searched_profile``) and each of its region profiles: the
peak the simulator gives the plans that keep, offload or recompute every stage, under ``deferred`` and ``inline``
sync, and the least of them. The least is what memtune's plans reach by one action everywhere, not a bound on every
plan; where it stays above a budget and the search found no plan, the budget is below what offload and recompute
free (the language models' losses over their vocabularies, ``docs/results/compiler-grid.md``).
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import peer_rows
from benchmarks.module_peers import region_runs, searched_profile
from memtune.tuner import Action, Plan, Simulator

__all__ = ["uniform_peaks"]

GiB = float(1 << 30)


def uniform_peaks(row: dict[str, Any]) -> list[str]:
    """One line per profile of ``row``: each uniform plan's simulated peak, GiB, and the least."""
    profiles = [("searched profile", searched_profile(row))]
    profiles += [(r.partition.label + f" at budget {r.budget:g}" + (f" rule {r.saves}" if r.saves else ""), r.profile)
                 for r in region_runs(row.get("regions", [])) if r.profile is not None]  # fmt: skip
    out = []
    for label, prof in profiles:
        sim = Simulator(prof, row["optimizer"])
        extra: dict[str, Any] = {}
        if prof.compile_budget is not None:  # a plan of this profile's compiled regions
            extra = {"stages": tuple(s.name for s in prof.stages), "compile_budget": prof.compile_budget,
                     "compile_saves": prof.compile_saves, "eager_stages": prof.eager_stages}  # fmt: skip
        peaks = {
            f"{a.value} {sync}": sim.run(
                Plan.uniform(prof.n_stages, a).model_copy(update={"sync": sync, **extra})
            ).peak_bytes
            / GiB
            for a in (Action.KEEP, Action.OFFLOAD, Action.RECOMPUTE)
            for sync in ("deferred", "inline")
        }
        least = min(peaks, key=lambda k: peaks[k])
        shown = ", ".join(f"{k} {v:.2f}" for k, v in peaks.items())
        out.append(f"{row['model']}, {label}: least {peaks[least]:.2f} GiB ({least}); {shown}")
    return out


def main() -> None:
    for row in peer_rows(__doc__):
        print("\n".join(uniform_peaks(row)))


if __name__ == "__main__":
    main()

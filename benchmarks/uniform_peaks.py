"""The simulated peak of every uniform plan on each profile of a peers row (from committed rows, CPU, nothing measured).

    python -m benchmarks.uniform_peaks benchmarks/results/h200/module-peers/gpt2.json

For the row's searched profile (``benchmarks.peer_rows.searched_profile``) and each of its region profiles: the
peak the simulator gives the plans that keep, offload or recompute every stage, under ``deferred`` and ``inline``
sync, and the least of them. The least is what memtune's plans reach by one action everywhere, not a bound on every
plan; where it stays above a budget and the search found no plan, the budget is below what offload and recompute
free (the language models' losses over their vocabularies, ``docs/results/compiler-grid.md``).

A profile whose model's output holds storages to the end of the backward (a Hugging Face decoder's cache of keys and
values, returned while ``config.use_cache`` is on: NOTE [ Held output ] in ``memtune.tuner.simulator``) gets a second
line: the same plans on the same profile with those storages released where nothing else holds them. That line is a
prediction of the model trained with its cache off, not a measurement.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import print_row_lines
from benchmarks.peer_rows import region_runs, searched_profile
from memtune.profiler import Profile
from memtune.tuner import Action, Plan, Simulator

__all__ = ["released", "uniform_peaks"]

GiB = float(1 << 30)


def released(prof: Profile) -> tuple[Profile, int] | None:
    """``prof`` with the storages its model's output holds to the end of the backward released, and their bytes;
    None where it holds none. Held storages are those a module profile marks as saved by stage 0 although a later
    stage made them (no code before the first stage can save them): stage 0 loses them, a storage a stage still saves
    becomes that stage's to plan (as if no code outside the stages saved it), and one nobody saves or reads is
    dropped."""
    kept, freed = [], 0
    for t in prof.storages:
        if not (t.outside and 0 in t.saved_by and t.producer > 0):
            kept.append(t)
            continue
        freed += t.bytes
        saved_by = tuple(k for k in t.saved_by if k != 0)
        if saved_by or t.read_by:
            kept.append(t.model_copy(update={"saved_by": saved_by, "outside": not saved_by}))
    if not freed:
        return None
    return prof.model_copy(update={"storages": tuple(kept)}), freed


def uniform_peaks(row: dict[str, Any]) -> list[str]:
    """One line per profile of ``row`` (two where its output holds storages, ``released``): each uniform plan's
    simulated peak, GiB, and the least."""
    profiles = [("searched profile", searched_profile(row))]
    profiles += [(r.partition.label + f" at budget {r.budget:g}" + (f" rule {r.saves}" if r.saves else ""), r.profile)
                 for r in region_runs(row.get("regions", [])) if r.profile is not None]  # fmt: skip
    for label, prof in list(profiles):
        lighter = released(prof)
        if lighter is not None:
            profiles.append((f"{label}, {lighter[1] / GiB:.2f} GiB held by the output released", lighter[0]))
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
    print_row_lines(__doc__, uniform_peaks)


if __name__ == "__main__":
    main()

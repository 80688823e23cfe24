"""A profile made on a CPU for an H100 against the profile measured on the H100: do they plan alike?

    python -m benchmarks.modeled_check benchmarks/results/h100/promises [--trials 100]

For each ``modeled-MODEL.json`` in the folder (``scripts/modeled_profiles.py``, made on a CPU) beside
``MODEL.json`` (``benchmarks.promises``, whose row keeps the profile measured on the H100, its unplanned peak and
headroom), both profiles are tuned at 40 to 80% of the measured unplanned peak with that headroom and optimizer
(seed 0). Per fraction: each best plan's actions, how many stages the two plans give the same action and the same
family (kept or offloaded: the stage's tensors stay; recomputed or selective: they are made again), and the CPU-made
plan priced on the measured profile against the measured profile's own best (the step a user of the CPU profile
gets, as the H100's profile prices it). Then, per model, every stage's transients on both profiles (forward, and
backward kept, recomputed and selective, MiB): the CPU-made profile models the GPU's convolution workspaces (NOTE
[ GPU transients from the CPU's allocator ] in ``memtune.profiler.memory_meter``), and a transient below the H100's is
marked. Writes ``modeled-check.md`` in the folder and prints it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import optuna

from memtune.profiler import Profile
from memtune.tuner import Plan, simulate, tune

FRACTIONS = (0.4, 0.5, 0.6, 0.7, 0.8)
_FAMILY = {"keep": "stays", "offload": "stays", "recompute": "remade", "selective": "remade"}


def _letters(plan: Plan) -> str:
    return "".join(a.value[0] for a in plan.actions)


def compare(
    measured: Profile, modeled: Profile, budget: int, headroom: float, optimizer: str, trials: int
) -> dict[str, Any]:
    """One fraction's row (see the module docstring); ``error`` where either profile has no plan."""
    found = [
        tune(p, budget, trials=trials, seed=0, headroom=headroom, optimizer=optimizer) for p in (measured, modeled)
    ]
    missing = [name for name, r in zip(("measured", "modeled"), found, strict=True) if r.best is None]
    if missing:
        return {"error": "no plan fits the " + " or the ".join(missing) + " profile"}
    h100, cpu = found[0].best.plan, found[1].best.plan  # type: ignore[union-attr]
    same = sum(a == b for a, b in zip(h100.actions, cpu.actions, strict=True))
    family = sum(_FAMILY[a.value] == _FAMILY[b.value] for a, b in zip(h100.actions, cpu.actions, strict=True))
    priced = simulate(measured, cpu.named(measured), optimizer=optimizer)
    best = found[0].best.step_ms  # type: ignore[union-attr]
    return {
        "measured_plan": _letters(h100),
        "modeled_plan": _letters(cpu),
        "same_action": same,
        "same_family": family,
        "stages": measured.n_stages,
        "measured_best_ms": best,
        "modeled_predicted_ms": found[1].best.step_ms,  # type: ignore[union-attr]
        "modeled_plan_on_measured_ms": priced.step_ms,
        "modeled_plan_on_measured_GiB": priced.peak_bytes / 2**30,
        "fits_measured": priced.peak_bytes <= budget * (1 - headroom),
        "step_ratio": priced.step_ms / best,
    }


def rows(folder: Path, trials: int) -> list[dict[str, Any]]:
    out = []
    for path in sorted(folder.glob("modeled-*.json")):
        made = json.loads(path.read_text())
        kind = made["model"]
        row = json.loads((folder / f"{kind}.json").read_text())
        measured = Profile.model_validate(row["profile"])
        modeled = Profile.model_validate(made["profile"])
        if [s.name for s in measured.stages] != [s.name for s in modeled.stages]:
            raise SystemExit(f"{kind}: the two profiles name different stages")
        peak = row["unplanned"]["peak_bytes"]
        for f in FRACTIONS:
            r = compare(measured, modeled, int(f * peak), row["headroom"], row["optimizer"], trials)
            out.append({"model": kind, "fraction": f, "cpu_seconds": made["seconds"], **r})
    return out


def table(found: list[dict[str, Any]]) -> str:
    lines = [
        "| model | fraction | H100-measured plan | CPU-made plan | same action / family | CPU plan on the H100 "
        "profile: ms / GiB | against the H100 profile's best |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in found:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['fraction']:.0%} | {r['error']} | | | | |")
            continue
        fits = "" if r["fits_measured"] else " (over the budget)"
        lines.append(
            f"| {r['model']} | {r['fraction']:.0%} | `{r['measured_plan']}` | `{r['modeled_plan']}` | "
            f"{r['same_action']} / {r['same_family']} of {r['stages']} | {r['modeled_plan_on_measured_ms']:.1f} / "
            f"{r['modeled_plan_on_measured_GiB']:.2f}{fits} | {r['step_ratio'] - 1:+.1%} |"
        )
    return "\n".join(lines)


#: a CPU-made transient further below the H100's than this is marked
SHORT_BYTES = 2**20
#: each stage's transients, as ``StageProfile`` names them, and their column titles
_TRANSIENTS = (
    ("forward_workspace_bytes", "forward"),
    ("chained_backward_bytes", "backward"),
    ("recompute_backward_bytes", "recomputed backward"),
    ("selective_backward_bytes", "selective backward"),
)


def transients(folder: Path) -> str:
    """Per model of ``folder``, every stage's transients on the H100-measured and the CPU-made profile (MiB), each
    CPU-made one more than ``SHORT_BYTES`` below the H100's in bold, and a line counting them."""
    out = []
    for path in sorted(folder.glob("modeled-*.json")):
        kind = json.loads(path.read_text())["model"]
        made = Profile.model_validate(json.loads(path.read_text())["profile"])
        measured = Profile.model_validate(json.loads((folder / f"{kind}.json").read_text())["profile"])
        lines = [
            f"{kind}: stage transients, MiB, H100-measured / CPU-made (bold: the CPU-made one is more than "
            f"{SHORT_BYTES / 2**20:.0f} MiB below the H100's)",
            "",
            "| stage | " + " | ".join(title for _, title in _TRANSIENTS) + " |",
            "|---|" + "---|" * len(_TRANSIENTS),
        ]
        below: list[tuple[float, str]] = []
        count = 0
        for a, b in zip(measured.stages, made.stages, strict=True):
            cells = []
            for field, title in _TRANSIENTS:
                h100, cpu = getattr(a, field), getattr(b, field)
                if h100 is None or cpu is None:
                    cells.append("")
                    continue
                count += 1
                cell = f"{h100 / 2**20:.1f} / {cpu / 2**20:.1f}"
                if cpu < h100 - SHORT_BYTES:
                    below.append(((h100 - cpu) / 2**20, f"{a.name} {title}"))
                    cell = f"**{cell}**"
                cells.append(cell)
            lines.append(f"| {a.name} | " + " | ".join(cells) + " |")
        worst = max(below, default=None)
        lines += [
            "",
            f"{kind}: {count - len(below)} of {count} CPU-made transients at or above the H100's, or less than "
            f"{SHORT_BYTES / 2**20:.0f} MiB below"
            + (f"; the largest shortfall {worst[0]:.1f} MiB ({worst[1]})" if worst else ""),
        ]
        out.append("\n".join(lines))
    return "\n\n".join(out)


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--trials", type=int, default=100)
    a = parser.parse_args()
    text = (
        f"<!-- python -m benchmarks.modeled_check {a.folder} --trials {a.trials} -->\n"
        + table(rows(a.folder, a.trials))
        + "\n\n"
        + transients(a.folder)
        + "\n"
    )
    (a.folder / "modeled-check.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()

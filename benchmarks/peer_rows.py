"""Reading the grid's committed rows (``benchmarks.module_peers`` writes them): the profile each plan was searched on,
the lower bounds, the peaks predicted then and now, and the Markdown tables of a folder of rows. CPU only: nothing here
measures.

    python -m benchmarks.module_peers --table benchmarks/results/h200/module-peers
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "RECUT_BUDGET",
    "GiB",
    "cell",
    "compiled_top",
    "draws_differ",
    "fastest_peer_within",
    "lower_bounds",
    "ms_gib",
    "plan_profile",
    "point_noise",
    "point_update_ms",
    "ran",
    "region_runs",
    "repeated_points",
    "repredicted",
    "row_update_ms",
    "searched_profile",
    "side_by_side",
    "table",
]

GiB = float(1 << 30)
#: the activation budget of the compiled run that measures the compiler's own re-cut (NOTE [ Plans' gradients ] in
#: ``benchmarks.module_peers``)
RECUT_BUDGET = 0.5


def region_runs(entries: Sequence[dict[str, Any]]) -> list[Any]:
    """The ``RegionProfile`` of each region entry of a row (``_Run._regions``)."""
    from memtune.profiler import Profile
    from memtune.profiler.region_profile import RegionProfile
    from memtune.profiler.region_tree import RegionPartition

    return [
        RegionProfile(
            RegionPartition(e["depth"], tuple(e["regions"])),
            e["budget"],
            Profile.from_json(json.dumps(e["profile"])) if e["profile"] is not None else None,
            e["error"],
            e["seconds"],
            e.get("saves"),
            e.get("channels_last", False),
        )
        for e in entries
    ]


def compiled_top(row: dict[str, Any]) -> dict[str, Any] | None:
    """The row's compiler peer at activation budget 1 (the compiled unconstrained step), if it ran."""
    return next((p for p in row.get("peers", []) if p["family"] == "compiler" and p.get("activation_budget") == 1.0
                 and "step_ms" in p), None)  # fmt: skip


def searched_profile(row: dict[str, Any]) -> Any:
    """The profile the plans phase searches: the row's eager profile with the sweep's measured compiles as its compiler
    points (``memtune.tuner.measure.compiler_points.with_compiler_points``)."""
    from memtune.profiler import CompilerPoint, Profile
    from memtune.tuner.measure.compiler_points import with_compiler_points

    points = [
        CompilerPoint(activation_budget=p["activation_budget"], step_ms=p["step_ms"], peak_bytes=p["peak_bytes"],
                      reserved_bytes=p["reserved_bytes"], optimizer=row["optimizer"], update_ms=point_update_ms(row, p))
        for p in row["peers"]
        if p["family"] == "compiler" and "step_ms" in p
    ]  # fmt: skip
    return with_compiler_points(Profile.from_json(json.dumps(row["profile"])), points)


def row_update_ms(row: dict[str, Any]) -> float | None:
    """The optimizer's update measured in ``row``'s eager steps, ms: its unplanned step's, else the one measured for
    points that did not time theirs (``update_ms``); None where neither was."""
    got = (row.get("unplanned") or {}).get("update_ms")
    return got if got is not None else row.get("update_ms")


def point_update_ms(row: dict[str, Any], point: dict[str, Any]) -> float | None:
    """The update inside a compiler point of ``row``, ms: the point's own, else the row's (``row_update_ms``). The
    update is the same optimizer over the same parameters whether the model runs compiled or not, since the
    benchmark compiles the model and not the optimizer (NOTE [ The optimizer's update ] in ``memtune.tuner._whole``)."""
    own = point.get("update_ms")
    return own if own is not None else row_update_ms(row)


def plan_profile(row: dict[str, Any], plan: Any) -> Any:
    """The profile the search priced ``plan`` (a ``Plan`` served for ``row``) on: the row's region profile of the
    plan's regions, activation budget and save rule; else (a plan of the eager profile or of the whole model compiled)
    the row's searched profile (``searched_profile``)."""
    entries = row.get("regions", [])
    for e, run in zip(entries, region_runs(entries), strict=True):
        same = list(e["regions"]) == list(plan.stages or ()) and e["budget"] == plan.compile_budget
        if same and e.get("saves") == plan.compile_saves and run.profile is not None:
            return run.profile
    return searched_profile(row)


def _placement_words(row: dict[str, Any], e: dict[str, Any], prof: Any, plan: Any) -> str:
    """What the allocator model says of ``plan`` under its cap now (NOTE [ Allocator placement ]): its retries a
    step, or out of memory, and the least scale of its blocks, up to 1.10, from which it no longer places."""
    from memtune.tuner.placement import predict_retries

    def placed(scale: float) -> Any:
        return predict_retries(prof, plan, e["budget_bytes"], optimizer=row["optimizer"], block_scale=scale)

    at_cap = placed(1.0)
    if at_cap.out_of_memory is not None:
        return "out of memory"
    first = next((k / 100 for k in range(101, 111) if placed(k / 100).out_of_memory is not None), None)
    tail = f"out of memory from blocks x{first:.2f}" if first is not None else "places up to blocks x1.10"
    return f"{at_cap.steady_retries:.1f} retries; {tail}"


def repredicted(folder: Path) -> str:
    """A Markdown table of every plan measured in the rows of ``folder``: its peak measured without the cap beside
    the peak predicted when it ran and the peak the simulator predicts now for the same plan on the same profile,
    then how it ran under its cap beside what the allocator model says of it now (nothing is measured: the committed
    rows are re-simulated on the CPU)."""
    from memtune.tuner import Plan, Simulator

    lines = [
        "| model | budget | plan | measured peak GiB | predicted then GiB (error) | predicted now GiB (error) "
        "| under the cap | allocator model now |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in sorted(folder.glob("*.json")):
        row = json.loads(path.read_text())
        for e in row.get("plans", []):
            measured = (e.get("uncapped") or {}).get("peak_bytes")
            if "plan_json" not in e or measured is None:
                continue
            plan = Plan.model_validate(e["plan_json"])
            prof = plan_profile(row, plan)
            now = Simulator(prof, row["optimizer"]).run(plan).peak_bytes
            then = e["predicted"]["peak_bytes"]
            capped = e.get("capped") or {}
            ran = (
                "out of memory"
                if "OutOfMemory" in str(capped.get("error", ""))
                else f"{capped['alloc_retries_per_step']:.1f} retries"
                if capped.get("alloc_retries_per_step") is not None
                else "-"
            )
            lines.append(
                f"| {row['model']} | {e['fraction']:.0%} | `{cell(e['plan'])}` | {measured / GiB:.3f} | "
                f"{then / GiB:.3f} ({then / measured - 1:+.1%}) | {now / GiB:.3f} ({now / measured - 1:+.1%}) | "
                f"{ran} | {_placement_words(row, e, prof, plan)} |"
            )
    return "\n".join(lines) + "\n"


def lower_bounds(row: dict[str, Any]) -> dict[float, float]:
    """Per plan fraction of ``row``, the least step any plan of memtune's may take within its budget, ms
    (``memtune.tuner.compiled_bound.least_step_ms`` over the searched profile and the row's region profiles), computed
    from the committed row by the code as it stands; a fraction without one is left out."""
    from memtune.tuner.compiled_bound import least_step_ms

    if not row.get("plans") or "profile" not in row:
        return {}
    prof = searched_profile(row)
    regions = [r.profile for r in region_runs(row.get("regions", [])) if r.profile is not None]
    bounds = {e["fraction"]: least_step_ms(prof, regions, e["budget_bytes"], row["optimizer"]) for e in row["plans"]}
    return {f: b for f, b in bounds.items() if b is not None}


def ran(r: dict[str, Any] | None) -> bool:
    return r is not None and "error" not in r and r.get("step_ms") is not None


def cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def ms_gib(r: dict[str, Any]) -> str:
    return f"{r['step_ms']:.1f} / {r['peak_bytes'] / GiB:.2f}"


def fastest_peer_within(row: dict[str, Any], budget_bytes: int) -> dict[str, Any] | None:
    """The fastest of the model's peers and its unplanned eager step whose measured reserved peak is within
    ``budget_bytes`` (what a cap at that budget lets run without retries), or None where none is."""
    candidates = [p for p in row.get("peers", []) if p.get("applies") and ran(p)]
    un = row.get("unplanned")
    if un is not None and ran(un):
        candidates.append({"name": "eager, unplanned", **un})
    fits = [p for p in candidates if p.get("reserved_bytes") is not None and p["reserved_bytes"] <= budget_bytes]
    return min(fits, key=lambda p: p["step_ms"], default=None)


def _peer_rows(row: dict[str, Any]) -> list[str]:
    un = row["unplanned"]
    model = row["model"]
    lines = [
        f"| {model} | eager, unplanned | {un['step_ms']:.1f} | 1.00 | {un['peak_bytes'] / GiB:.2f} | "
        f"{un['reserved_bytes'] / GiB:.2f} | - |"
    ]
    for p in row.get("peers", []):
        if not p["applies"]:
            lines.append(f"| {model} | {p['name']} | does not apply: {cell(p['note'])} | | | | |")
        elif "error" in p:
            lines.append(f"| {model} | {p['name']} | {cell(p['error'][:160])} | | | | |")
        else:
            lines.append(
                f"| {model} | {p['name']} | {p['step_ms']:.1f} | {p['step_ms'] / un['step_ms']:.2f} | "
                f"{p['peak_bytes'] / GiB:.2f} | {p['reserved_bytes'] / GiB:.2f} | {p['first_step_s']:.0f} |"
            )
    return lines


def _plan_rows(row: dict[str, Any], ratios: list[float], verdicts: list[bool]) -> list[str]:
    lines = []
    bounds, top, noise = lower_bounds(row), compiled_top(row), point_noise(row)
    for e in row.get("plans", []):
        head = f"| {row['model']} | {e['fraction']:.0%} ({e['budget_bytes'] / GiB:.2f}) |"
        peer = fastest_peer_within(row, e["budget_bytes"])
        peer_text = f"{peer['name']}: {peer['step_ms']:.1f} / {peer['reserved_bytes'] / GiB:.2f}" if peer else "none"
        bound = bounds.get(e["fraction"])
        bound_text = f"{bound:.1f}" if bound is not None else "-"
        if "plan_json" not in e:
            lines.append(
                f"{head} {cell(e.get('error', 'no plan'))} | - | - | {peer_text} | - | - | - | {bound_text} | - |"
            )
            continue
        kind = "compiled" if e.get("compiled") else "eager"
        pr, cap = e["predicted"], e.get("capped")
        measured = ms_gib(cap) if ran(cap) else cell((cap or {}).get("error", "not measured")[:120])
        ratio, verdict = "-", "-"
        if ran(cap) and peer is not None:
            assert cap is not None
            ratios.append(cap["step_ms"] / peer["step_ms"])
            ratio = f"{ratios[-1]:.2f}"
            if noise is not None:
                verdicts.append(ratios[-1] <= 1.0 + noise)
                verdict = f"{'yes' if verdicts[-1] else 'no'} (noise {noise:.0%})"
        ms = cap["step_ms"] if ran(cap) and cap is not None else None
        vs_top = f"{ms / top['step_ms']:.2f}" if ms is not None and top is not None else "-"
        vs_bound = f"{ms / bound:.2f}" if ms is not None and bound is not None else "-"
        lines.append(
            f"{head} {kind} `{e['plan']}` | {pr['step_ms']:.1f} / {pr['peak_bytes'] / GiB:.2f} | {measured} | "
            f"{peer_text} | {ratio} | {verdict} | {vs_top} | {bound_text} | {vs_bound} |"
        )
    return lines


def repeated_points(row: dict[str, Any]) -> dict[float, list[float]]:
    """Each compiler point the row measured more than once, by activation budget: its step ms in the sweep, then
    every time it ran as a finalist (``compiled whole B``), and under the cap where it was the plan served. One
    compiled graph run again: their spread is the run-to-run noise of the compiler's steps (``point_noise``)."""
    steps: dict[float, list[float]] = {}
    for p in row.get("peers", []):
        if p.get("family") == "compiler" and ran(p):
            steps[float(p["activation_budget"])] = [float(p["step_ms"])]
    for e in row.get("plans", []):
        for f in e.get("finalists", []):
            budget = _whole_budget(f["name"])
            if budget is None or budget not in steps or not _timed(f):
                continue
            steps[budget].append(float(f["measured"]["step_ms"]))
            cap = e.get("capped")
            if f.get("served") and ran(cap) and cap is not None:
                steps[budget].append(float(cap["step_ms"]))
    return {b: v for b, v in steps.items() if len(v) > 1}


def _whole_budget(name: str) -> float | None:
    """The activation budget of a finalist named ``compiled whole B``; None for any other."""
    head, _, budget = name.rpartition(" ")
    return float(budget) if head == "compiled whole" else None


def point_noise(row: dict[str, Any]) -> float | None:
    """The row's run-to-run noise of the compiler's steps: the largest (slowest / fastest - 1) over its compiler points
    measured more than once (``repeated_points``); None where none was. The goal's "no slower than the fastest peer
    within the stated run-to-run noise" reads a plan's step over that peer's at most 1 + this."""
    spreads = [max(v) / min(v) - 1.0 for v in repeated_points(row).values()]
    return max(spreads, default=None)


def _noise_rows(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Per model, its compiler points measured more than once and their spread (``repeated_points``)."""
    lines = ["| model | compiler point | steps ms (sweep, then again) | slowest / fastest |", "|---|---|---|---|"]
    for r in rows:
        for budget, steps in sorted(repeated_points(r).items()):
            shown = ", ".join(f"{x:.1f}" for x in steps)
            lines.append(f"| {r['model']} | budget {budget:g} | {shown} | {max(steps) / min(steps):.2f} |")
    return lines


def _math_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The gradient check's table (NOTE [ Plans' gradients ]): per model its spread, then each checked plan, each
    also against float64 where the row measured it (NOTE [ Gradients against float64 ] in
    ``memtune.tuner.runtime.float64``)."""
    lines = [
        "| model | run | loss error | largest gradient error (parameter) | largest judged (parameter) "
        "| within the spread | RMSE against float64 over the compiled run's, largest (parameter) "
        "| within float64's rule |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        noise = r["spread"].get("noise")
        unjudged = f"{len(noise)} gradients carry no signal, not judged" if noise else "-"
        named = (("compiled again", "again"), ("eager", "eager"), (f"compiled at budget {RECUT_BUDGET:g}", "recut"))
        for what, e in ((what, r["spread"][k]) for what, k in named if k in r["spread"]):
            head = f"| {r['model']} | {what} | {e['loss']:.1e}"
            lines.append(f"{head} | {e['grad']:.1e} ({e['worst']}) | {unjudged} | - | {_float64_cells(e)} |")
        for e in r.get("plans", []):
            m = e.get("math")
            if m is not None:
                judged = f"{m['judged_grad']:.1e} ({m['judged_worst']})" if "judged_grad" in m else "-"
                lines.append(
                    f"| {r['model']} | plan at {e['fraction']:.0%} | {m['loss']:.1e} | {m['grad']:.1e} ({m['worst']}) "
                    f"| {judged} | {'yes' if m['within_spread'] else 'no'} | {_float64_cells(m)} |"
                )
    return lines


def draws_differ(f: dict[str, Any], check: dict[str, Any]) -> str:
    """Why a run's float64 judgement ``f`` (within its check ``check``) is not comparable under today's line
    (``COMPARABLE_LOSS_ERROR``, NOTE [ Gradients against float64 ]), judged again from the losses it stored (a row
    checked before the run's own loss entered the judgement keeps it as the check's ``loss``); empty where it is."""
    from memtune.tuner.runtime.float64 import COMPARABLE_LOSS_ERROR

    run = float(f.get("run_loss_error", check.get("loss", 0.0)))
    if f["loss_error"] > COMPARABLE_LOSS_ERROR:
        return f"the float64 loss is {f['loss_error']:.1e} off"
    if run > COMPARABLE_LOSS_ERROR:
        return f"its loss is {run:.1e} off the compiled run's"
    return ""


def _float64_cells(check: dict[str, Any]) -> str:
    """A run's judgement against float64, two cells: its largest RMSE ratio and whether it passes; ``-`` where the
    row did not measure it."""
    f = check.get("float64")
    if f is None:
        return "- | -"
    drew = draws_differ(f, check)
    if drew:
        return f"not comparable: {drew} (other random draws) | -"
    return f"{f['ratio']:.2f} ({f['worst']}) | {'yes' if f['within'] else 'no'}"


def table(folder: Path) -> str:
    """The Markdown tables of the rows in ``folder``: every peer of every model, then memtune at each budget beside
    the fastest peer within it, with their geometric mean; a note where the folder holds no measurement yet."""
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    rows = [r for r in rows if ran(r.get("unplanned"))]
    peers = [
        "| model | configuration | step ms | x eager | peak GiB allocated | peak GiB reserved | first step s |",
        "|---|---|---|---|---|---|---|",
    ]
    plans = [
        "| model | budget (GiB) | memtune's plan | predicted ms / GiB | under the cap ms / GiB "
        "| fastest peer within the budget: ms / GiB reserved | memtune / peer | no slower within the noise "
        "| memtune / compiled step | lower bound ms | memtune / bound |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios: list[float] = []
    verdicts: list[bool] = []
    for r in rows:
        peers += _peer_rows(r)
        plans += _plan_rows(r, ratios, verdicts)
    out = ["## Peers", "", *peers, "", "## memtune at fractions of the compiled peak", "", *plans, ""]
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        out.append(f"memtune / fastest peer within the budget, geometric mean over {len(ratios)} budgets: {geo:.3f}")
    if verdicts:
        out += ["", f"memtune no slower than the fastest peer within the budget, within the row's measured noise of "
                    f"the compiler's points: {sum(verdicts)} of {len(verdicts)} budgets"]  # fmt: skip
    noisy = [r for r in rows if repeated_points(r)]
    if noisy:
        out += ["", "## The compiler's points measured more than once", "", *_noise_rows(noisy)]
    near: list[float] = []
    measured = _finalist_rows([r for r in rows if any("finalists" in e for e in r.get("plans", []))], near)
    if len(measured) > 2:
        out += ["", "## Finalists measured before serving", "", *measured, ""]
    if near:
        geo = math.exp(sum(math.log(x) for x in near) / len(near))
        out.append(
            f"memtune / the fastest peer within the budget where that peer is a compiler point measured among the "
            f"finalists (side by side, one process), geometric mean over {len(near)} budgets: {geo:.3f}"
        )
    checked = [r for r in rows if "spread" in r]
    if checked:
        out += ["", "## Gradients against the unplanned compiled run", "", *_math_rows(checked), ""]
    if not rows:
        out.append(f"No measurement in {folder} yet: `python -m benchmarks.module_peers --out {folder}` on a GPU.")
    for r in rows:
        run = r.get("run") or {}
        shared = r.get("processes_on_host", 1)
        beside = f", one of {shared} models run at once on GPUs of one host" if shared > 1 else ""
        cache = ", its key/value cache off (use_cache=False)" if r.get("use_cache") is False else ""
        out.append(f"- {r['model']}: batch {r['batch']}, {r['device']}, {run.get('date', '?')}, "
                   f"commit {str(run.get('commit'))[:10]}{beside}{cache}")  # fmt: skip
    return "\n".join(out) + "\n"


def side_by_side(row: dict[str, Any], e: dict[str, Any]) -> float | None:
    """The served plan's step over the fastest peer within the budget's, both as measured among ``e``'s finalists (NOTE
    [ Measured finalists ] in ``memtune.tuner.finalists``): the same process, minutes apart, where the table's
    ``memtune / peer`` sets a plan measured in one run against a peer measured in another. None where that peer is not
    a compiler point or was no finalist, or where the served plan did not run."""
    peer = fastest_peer_within(row, e["budget_bytes"])
    if peer is None or peer.get("family") != "compiler":
        return None
    finalists = e.get("finalists", [])
    won = next((f for f in finalists if f.get("served")), None)
    name = f"compiled whole {peer['activation_budget']:g}"
    point = next((f for f in finalists if f["name"] == name), None)
    if won is None or point is None or not _timed(won) or not _timed(point):
        return None
    return float(won["measured"]["step_ms"] / point["measured"]["step_ms"])


def _timed(finalist: dict[str, Any]) -> bool:
    """Whether a finalist ran (its ``measured`` has a step; its ``error`` is None or absent)."""
    m = finalist.get("measured") or {}
    return m.get("step_ms") is not None and m.get("error") is None


def _finalist_rows(rows: Sequence[dict[str, Any]], ratios: list[float]) -> list[str]:
    """The table of the plans measured before one was served, per budget, with the side-by-side ratio."""
    lines = [
        "| model | budget | finalist | predicted ms | measured ms / GiB reserved | served |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for e in r.get("plans", []):
            for f in e.get("finalists", []):
                m = f.get("measured") or {}
                got = (f"{m['step_ms']:.1f} / {m['reserved_bytes'] / GiB:.2f}" if _timed(f)
                       else cell(str(m.get("error", "not measured"))[:120]))  # fmt: skip
                lines.append(
                    f"| {r['model']} | {e['fraction']:.0%} | {cell(f['name'])} | {f['predicted']['step_ms']:.1f} | "
                    f"{got} | {'yes' if f.get('served') else ''} |"
                )
            ratio = side_by_side(r, e)
            if ratio is not None:
                ratios.append(ratio)
    return lines

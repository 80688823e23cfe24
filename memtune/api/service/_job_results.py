"""The rows a job stores from its search, and the choice of the plans its measured validation runs.

``simulated_rows`` turns a search's result into the rows stored for the job (every baseline, the Optuna best, and in
``pareto`` mode the front), labeled ``simulated``; ``top_plans`` and ``with_no_choice`` pick from them the plans a
worker measures on the GPU (NOTE [ Measured validation ] in ``memtune.api.service.worker``). Step times are in
milliseconds, peaks in bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memtune.storage.records import Job, ResultIn

if TYPE_CHECKING:
    from memtune.tuner import Candidate, TuneResult

__all__ = ["KIND_ORDER", "no_plan_fits", "plan_text", "result_in", "simulated_rows", "top_plans", "with_no_choice"]


def no_plan_fits(job: Job) -> str:
    """The error of a job whose search found no plan within its budget (less its headroom)."""
    within = "" if job.headroom == 0 else f" less its {job.headroom * 100:g}% headroom for the allocator"
    return f"no plan fits the budget{within}; try a larger budget or a smaller batch"


def simulated_rows(job: Job, result: TuneResult) -> list[ResultIn]:
    """The search's results to store: every baseline, the Optuna best, and (pareto mode) the front."""
    rows = [result_in(c, "baseline") for c in result.policies]
    if result.best is not None:
        rows.append(result_in(result.best, "optuna", name="optuna"))
    if result.no_choice is not None:  # NOTE [ Measured selection ] in memtune.tuner.search
        rows.append(result_in(result.no_choice, "optuna"))
    if job.mode == "pareto":
        baseline_names = {c.name for c in result.policies}
        rows.extend(result_in(c, "pareto") for c in result.pareto if c.name not in baseline_names)
    return rows


KIND_ORDER = {"optuna": 0, "pareto": 1, "baseline": 2}
"""Which kind of row goes first among plans of equal simulated step time (``top_plans``)."""


def with_no_choice(chosen: list[ResultIn], rows: Sequence[ResultIn]) -> list[ResultIn]:
    """``chosen``, and the search's best plan without algorithm choice after them when it is not among them
    (NOTE [ Measured selection ] in ``memtune.tuner.search``): the GPU settles whether choosing algorithms is faster."""
    from memtune.tuner.search import NO_CHOICE

    keys = {plan_text(r) for r in chosen}
    extra = [r for r in rows if r.name == NO_CHOICE and r.feasible and plan_text(r) not in keys]
    return chosen + extra[:1] if chosen else chosen


def plan_text(r: ResultIn) -> str:
    """A plan's content as text, its label left out: two rows with equal text run the same plan."""
    return json.dumps({k: v for k, v in r.plan.items() if k != "label"}, sort_keys=True)


def top_plans(rows: Sequence[ResultIn], k: int) -> list[ResultIn]:
    """The ``k`` fastest distinct plans that fit, by simulated step ms (ties: optuna, pareto, baseline).

    Plans are distinct by content: the label (which policy or search made the plan) is not compared."""
    fitting = sorted((r for r in rows if r.feasible), key=lambda r: (r.step_ms, KIND_ORDER.get(r.kind, 3), r.name))
    seen: set[str] = set()
    out: list[ResultIn] = []
    for r in fitting:
        key = plan_text(r)
        if key in seen:
            continue
        seen.add(key)
        out.append(r)
        if len(out) == k:
            break
    return out


def result_in(c: Candidate, kind: Any, *, name: str | None = None) -> ResultIn:
    """The row stored for one searched candidate (step in ms, peak in bytes), named ``name`` or the candidate's."""
    return ResultIn(
        name=name or c.name,
        kind=kind,
        plan=c.plan.model_dump(mode="json"),
        step_ms=float(c.step_ms),
        peak_bytes=int(c.peak_bytes),
        feasible=bool(c.feasible),
        source=c.source,
        alloc_retries=c.alloc_retries,
        allocator_ms=c.allocator_ms if c.alloc_retries is not None else None,
    )

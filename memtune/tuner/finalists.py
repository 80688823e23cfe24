"""The plans measured before one is served, and the choice among them (pure Python; the measuring is
``memtune.tuner.measure.finalists``).

# NOTE [ Measured finalists ]
The simulator prices the GPU's work. A training step also waits for the host wherever the host issues work more
slowly than the GPU runs it: on an H200 a plan of MobileNetV2's two compiled regions took 23.0 ms of GPU work and
36.5 ms a step, and each offloaded layer of the Llama decoder held the host about a millisecond in its pack hooks
while the GPU had nothing queued. A compiler point is measured whole, its host time included, so between a compiler
point and a plan predicted a little faster the simulator cannot choose; measured, the plan lost (1.47–1.57× the
point on MobileNetV2, 1.06× on the Llama decoder).

So ``memtune.tune`` on a module on a CUDA device measures its finalists before it serves one:

1. The candidates are the best plan of each search (the eager profile's, whose candidates include the whole model
   compiled, and each compiled-region profile's) and every compiler point that fits (``TuneResult.compiled``),
   distinct by plan, by predicted step (ties: the smaller peak).
2. The finalists are those within ``SPREAD`` of the fastest prediction, at most ``limit``; the fastest compiler point
   that fits is always one of them (it takes the last place where it would not have one), since it is what a user
   would otherwise run.
3. Each runs as served (``memtune.planned``) under ``budget_guard`` at the whole budget (the headroom is the
   allocator's slack, as in NOTE [ Measured validation ]), a few untimed and timed training steps with the optimizer
   the search priced, in the order of its prediction.
4. The finalist with the fastest measured median step that ran is served (``served``); one that ran out of memory or
   failed keeps its error and is never served.
5. Where none ran, the fallbacks are measured in turn until one runs (``fallbacks``): the plans of every search's
   Pareto front that fit and were not measured, each predicted to peak below every finalist that ran out of memory
   under the cap, fastest prediction first, at most ``limit``. A plan predicted within its budget can run out of
   memory under the cap where the allocator's blocks do not pack as modelled (ViT-B/16 at 30% of its compiled peak on
   an H200: 1.5% more allocated than predicted, and a request of 148 MiB found no room); a plan of smaller predicted
   peak leaves the allocator more room. Where no fallback runs either, no plan is served (``Tuned.plan`` is None and
   ``tune`` warns, naming every error): a plan measured to run out of memory under its budget is never called one that
   fits.

The model is left as found (NOTE [ Profiler hygiene ]; the update runs at learning rate 0). ``Tuned.measured``
keeps every finalist for the printout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from memtune.tuner._search_results import Candidate, TuneResult
from memtune.tuner.plan import Plan

__all__ = [
    "SPREAD",
    "Finalist",
    "fallback_pool",
    "fallbacks",
    "fastest_measured",
    "finalists",
    "measured_in_turn",
    "none_ran",
    "served",
]

T = TypeVar("T")

SPREAD = 1.25
"""Finalists are predicted within this factor of the fastest prediction (NOTE [ Measured finalists ])."""


@dataclass(frozen=True)
class Finalist:
    """One plan measured before serving (NOTE [ Measured finalists ]). Times in ms, sizes in bytes.

    Attributes:
        name: the plan's name, with the search it came from (``compiled whole 0.5``, ``optuna (compiled regions)``).
        predicted_ms, predicted_peak_bytes: the search's prediction (the forward and backward, without the update).
        step_ms: the measured median training step (the update included); None where it did not run.
        reserved_bytes: the caching allocator's peak reserved bytes in the timed steps; None where it did not run.
        peak_bytes: the peak allocated bytes in the timed steps; None where it did not run or was not kept.
        served: whether this is the plan served.
        error: why it did not run (an out-of-memory under the budget's cap, a compiler error); None where it ran.
        out_of_memory: it did not run because it ran out of GPU memory (under the cap, or in its first step).
    """

    name: str
    predicted_ms: float
    predicted_peak_bytes: int
    step_ms: float | None = None
    reserved_bytes: int | None = None
    peak_bytes: int | None = None
    served: bool = False
    error: str | None = None
    out_of_memory: bool = False

    def line(self) -> str:
        """One line for a printout."""
        head = f"{self.name}: predicted {self.predicted_ms:.2f} ms at {self.predicted_peak_bytes / 2**30:.2f} GiB"
        if self.error is not None:
            return f"{head}, did not run ({self.error})"
        assert self.step_ms is not None and self.reserved_bytes is not None
        mark = "  <- served" if self.served else ""
        return f"{head}, measured {self.step_ms:.2f} ms, {self.reserved_bytes / 2**30:.2f} GiB reserved{mark}"


def _label(result: TuneResult, c: Candidate) -> str:
    """``c``'s name with where it came from: a compiler point says so itself; a region profile's best is marked."""
    if c.plan.whole_compile is not None:
        return c.name
    if c.plan.compile_budget is not None:
        how = f"save rule {c.plan.compile_saves!r}" if c.plan.compile_saves else f"budget {c.plan.compile_budget:g}"
        return f"{c.name} ({len(c.plan.actions)} compiled regions, {how})"
    return f"{c.name} (eager stages)"


def finalists(
    results: Sequence[TuneResult], limit: int = 3, spread: float = SPREAD
) -> list[tuple[str, TuneResult, Candidate]]:
    """The plans to measure among ``results`` (the eager profile's search first, then each compiled-region
    profile's), each with its label and the result it came from, fastest prediction first (NOTE [ Measured
    finalists ]); empty where no plan fits.

    Raises:
        ValueError: ``limit`` below 1 or ``spread`` below 1.
    """
    if limit < 1 or spread < 1:
        raise ValueError(f"finalists need limit >= 1 and spread >= 1, not {limit} and {spread}")
    every = [(r, c) for r in results for c in ([r.best] if r.best is not None else []) + r.compiled if c.feasible]
    every.sort(key=lambda rc: (rc[1].step_ms, rc[1].peak_bytes))  # a plan found twice keeps its faster prediction
    pool: list[tuple[str, TuneResult, Candidate]] = []
    seen: list[Plan] = []
    for r, c in every:
        if c.plan not in seen:
            seen.append(c.plan)
            pool.append((_label(r, c), r, c))
    if not pool:
        return []
    near = [t for t in pool if t[2].step_ms <= pool[0][2].step_ms * spread][:limit]
    point = next((t for t in pool if t[2].plan.whole_compile is not None), None)
    if point is not None and point not in near:
        near = [*near[: limit - 1], point]
    return near


def fallback_pool(results: Sequence[TuneResult]) -> list[tuple[str, TuneResult, Candidate]]:
    """Every plan that fits on the Pareto fronts of ``results``, labelled as ``finalists`` labels them, each plan once,
    fastest prediction first (ties: the smaller peak): what ``fallbacks`` chooses from."""
    every = [(r, c) for r in results for c in r.pareto if c.feasible]
    every.sort(key=lambda rc: (rc[1].step_ms, rc[1].peak_bytes))
    seen: list[Plan] = []
    pool: list[tuple[str, TuneResult, Candidate]] = []
    for r, c in every:
        if c.plan not in seen:
            seen.append(c.plan)
            pool.append((_label(r, c), r, c))
    return pool


def fallbacks(
    pool: Sequence[tuple[str, T, Candidate]], measured: Sequence[tuple[Candidate, Finalist]], limit: int = 3
) -> list[tuple[str, T, Candidate]]:
    """The plans of ``pool`` (``fallback_pool``'s, in its order) to measure where no finalist in ``measured`` (each
    chosen finalist's candidate with what it gave) ran (NOTE [ Measured finalists ], step 5): those not measured yet,
    each predicted to peak below every finalist that ran out of memory, at most ``limit``.

    Raises:
        ValueError: ``limit`` below 1.
    """
    if limit < 1:
        raise ValueError(f"fallbacks need limit >= 1, not {limit}")
    tried = [c.plan for c, _ in measured]
    ceiling = min((c.peak_bytes for c, f in measured if f.out_of_memory), default=None)
    fits = [t for t in pool if t[2].plan not in tried and (ceiling is None or t[2].peak_bytes < ceiling)]
    return fits[:limit]


def measured_in_turn(
    chosen: list[tuple[str, T, Candidate]],
    pool: Sequence[tuple[str, T, Candidate]],
    run: Callable[[Sequence[tuple[str, T, Candidate]], int], Sequence[Finalist]],
    limit: int = 3,
) -> list[Finalist]:
    """The finalists ``chosen`` measured by ``run(plans, total)``, then, where none ran, the ``fallbacks`` of ``pool``
    one at a time until one runs, each appended to ``chosen`` (NOTE [ Measured finalists ], steps 3 to 5); what each
    gave, in ``chosen``'s order. ``run`` gives one ``Finalist`` per plan, in order; ``total`` is how many plans are
    measured at most so far, for its progress."""
    ran = list(run(chosen, len(chosen)))
    if fastest_measured(ran) is None:
        extra = fallbacks(pool, [(c, f) for (_, _, c), f in zip(chosen, ran, strict=True)], limit)
        total = len(chosen) + len(extra)
        for plan in extra:
            chosen.append(plan)
            ran.extend(run([plan], total))
            if ran[-1].step_ms is not None:
                break
    return ran


def served(chosen: tuple[str, TuneResult, Candidate]) -> TuneResult:
    """The result to serve for the finalist ``chosen``: its search's result, with the finalist as its best."""
    _, result, c = chosen
    return result if result.best is c else dataclasses.replace(result, best=c, no_choice=None)


def fastest_measured(ran: Sequence[Finalist]) -> int | None:
    """The index of the finalist with the fastest measured step (ties: the earlier, i.e. faster predicted); None where
    none ran."""
    timed = [k for k, f in enumerate(ran) if f.step_ms is not None]
    return min(timed, key=lambda k: (ran[k].step_ms, k)) if timed else None


def none_ran(measured: Sequence[Finalist]) -> str | None:
    """The warning where finalists (and fallbacks) were measured and none ran, each one's error named, and so no plan
    is served; None otherwise."""
    if not measured or any(f.served for f in measured):
        return None
    failed = "; ".join(f"{f.name}: {f.error}" for f in measured)
    return (
        f"no plan ran under the budget ({failed}); none is served, though the simulator found plans that fit: give "
        "the budget more room (the plans that ran out of memory name the stage and the request), or tune with "
        "finalists=0 to take the simulator's fastest unmeasured"
    )

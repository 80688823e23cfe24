"""Choosing among eager plans, whole-model compiles and plans of compiled regions (NOTE [ Regions ] in
``memtune.profiler.region_tree``).

# NOTE [ Compiled-region candidates ]
``memtune.tune(model, ..., compile=...)`` with compiling on tunes, besides the eager profile (whose search also sees
the whole model compiled, NOTE [ Whole-model compile ] in ``memtune.tuner._whole``), one compiled profile per candidate
region partition (NOTE [ Candidate depths ]) and activation budget
(``memtune.profiler.region_profile.profile_regions``), each searched alone within the same budget bytes. The plan
served is the fastest feasible best of them all (``fastest``): a compiled-region plan only where it beats the eager
plans and the compiler's own points, which stay candidates. A ``RegionTrial`` records each one for the printout: its
unplanned step against the whole model compiled at the same budget (a partition that loses the compiler's fusions
across region edges shows a ratio above 1), its best plan, its compile and measuring seconds, or why it failed (the
region and the compiler's first line).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memtune.tuner.plan import Plan

if TYPE_CHECKING:
    from memtune.profiler import CompilerPoint, Profile
    from memtune.profiler.region_profile import RegionProfile
    from memtune.tuner.search import TuneResult

__all__ = ["RegionTrial", "fastest", "region_trial", "weigh_all", "weigh_regions"]


@dataclass(frozen=True)
class RegionTrial:
    """One compiled-region profile and what its search found (NOTE [ Compiled-region candidates ]). Times in ms.

    Attributes:
        label: the partition, in words (``depth 1: 8 regions (conv1, …)``).
        regions: the region names.
        budget: the activation budget its regions were compiled under.
        saves: memtune's save rule inside its regions (NOTE [ Saved tensors chosen inside a compiled region ] in
            ``memtune.profiler.saved_tags``); None: the compiler's own choice under ``budget``.
        step_ms: its unplanned step, every region kept (the simulator's, from the profile); None where it failed.
        whole_ms: the whole model compiled at the same budget, measured; None where not measured, or where the
            region profile is modeled (on the CPU for a GPU: its times are the roofline's, not comparable).
        best_ms, best_peak_bytes: its best plan within the budget; None where none fits or it failed.
        plan: that plan (for ``memtune.planned``), named with the regions; None where none fits or it failed.
        eager_regions: regions run eager (written in place at their edges).
        compile_seconds: its first step's wall seconds (compiling); seconds: its whole measurement's.
        error: why it failed, naming the region and the compiler's first line; None where it did not.
        channels_last: its regions ran their convolutions channels-last, the whole model's layout (NOTE [ Regions in
            the whole model's layout ] in ``memtune.profiler.region_layout``).
    """

    label: str
    regions: tuple[str, ...]
    budget: float
    step_ms: float | None
    whole_ms: float | None
    best_ms: float | None
    best_peak_bytes: int | None
    plan: Plan | None
    eager_regions: tuple[str, ...]
    compile_seconds: float | None
    seconds: float
    error: str | None = None
    saves: str | None = None
    channels_last: bool = False

    @property
    def policy(self) -> str:
        """What decided the saved tensors, in words: ``activation budget 0.5`` or ``save rule 'compute'``."""
        return f"save rule {self.saves!r}" if self.saves is not None else f"activation budget {self.budget:g}"

    @property
    def against_whole(self) -> float | None:
        """The unplanned step over the whole model's compiled step at the same budget (1: no fusion lost)."""
        if self.step_ms is None or not self.whole_ms:
            return None
        return self.step_ms / self.whole_ms

    def line(self) -> str:
        """One line for a printout."""
        head = f"{self.label} at {self.policy}"
        if self.error is not None:
            return f"{head}: failed ({self.error}); planned eager instead"
        ratio = self.against_whole
        versus = f" ({ratio:.2f}x the whole model compiled)" if ratio is not None else ""
        best = (
            f"best plan {self.best_ms:.2f} ms at {self.best_peak_bytes / 2**30:.2f} GiB"
            if self.best_ms is not None and self.best_peak_bytes is not None
            else "no plan fits"
        )
        layout = "; convolutions channels-last, as the model compiled whole" if self.channels_last else ""
        eager = f"{layout}; eager: {', '.join(self.eager_regions)}" if self.eager_regions else layout
        took = f"; compiled in {self.compile_seconds:.0f} s" if self.compile_seconds is not None else ""
        return f"{head}: unplanned {self.step_ms:.2f} ms{versus}, {best}{eager}{took}"


def _whole_ms(points: Sequence[CompilerPoint], budget: float) -> float | None:
    return next((p.forward_backward_ms for p in points if p.activation_budget == budget), None)


def region_trial(
    label: str,
    regions: Sequence[str],
    budget: float,
    seconds: float,
    *,
    result: TuneResult | None = None,
    points: Sequence[CompilerPoint] = (),
    error: str | None = None,
    saves: str | None = None,
    channels_last: bool = False,
) -> RegionTrial:
    """The ``RegionTrial`` of one compiled-region profile: from its search's ``result`` (None: it failed with
    ``error``), compared with the whole-model compiler ``points`` measured at the same budget; ``saves``, the save
    rule it was measured under."""
    prof: Profile | None = result.profile if result is not None else None
    best = result.best if result is not None else None
    return RegionTrial(
        label=label,
        regions=tuple(regions),
        budget=budget,
        step_ms=result.unconstrained.step_ms if result is not None else None,
        # a profile modeled for a GPU on the CPU has the roofline's times, not the points' measured ones
        whole_ms=_whole_ms(points, budget) if prof is not None and prof.source == "measured" else None,
        best_ms=best.step_ms if best is not None else None,
        best_peak_bytes=best.peak_bytes if best is not None else None,
        plan=best.plan if best is not None else None,
        eager_regions=tuple(prof.stages[k].name for k in prof.eager_stages) if prof is not None else (),
        compile_seconds=prof.compile_seconds if prof is not None else None,
        seconds=seconds,
        error=error,
        saves=saves,
        channels_last=channels_last,
    )


def fastest(results: Sequence[TuneResult]) -> TuneResult:
    """The result whose best plan steps fastest (ties: the smaller peak, then the earlier result); the first result
    where none has a plan that fits.

    Raises:
        ValueError: ``results`` is empty.
    """
    if not results:
        raise ValueError("no result to choose from")
    with_best = [r for r in results if r.best is not None]
    if not with_best:
        return results[0]
    return min(with_best, key=lambda r: (r.best.step_ms, r.best.peak_bytes))  # type: ignore[union-attr]


def weigh_regions(
    result: TuneResult, regions: Sequence[RegionProfile], search: Callable[[RegionProfile, Profile], TuneResult]
) -> tuple[TuneResult, list[RegionTrial]]:
    """The fastest of ``result`` (the eager profile's search) and ``search(run, its profile)`` of every compiled-region
    profile of ``regions`` that was measured, with each one's ``RegionTrial`` (NOTE [ Compiled-region candidates ])."""
    results, trials = weigh_all(result, regions, search)
    return fastest(results), trials


def weigh_all(
    result: TuneResult, regions: Sequence[RegionProfile], search: Callable[[RegionProfile, Profile], TuneResult]
) -> tuple[list[TuneResult], list[RegionTrial]]:
    """``result`` (the eager profile's search) and ``search(run, its profile)`` of every compiled-region profile of
    ``regions`` that was measured, in that order, with each region profile's ``RegionTrial``."""
    results, trials = [result], []
    for run in regions:
        found = search(run, run.profile) if run.profile is not None else None
        results += [found] if found is not None else []
        points = result.profile.compiler_points
        trials.append(
            region_trial(
                run.partition.label,
                run.partition.names,
                run.budget,
                run.seconds,
                result=found,
                points=points,
                error=run.error,
                saves=run.saves,
                channels_last=run.channels_last,
            )
        )
    return results, trials

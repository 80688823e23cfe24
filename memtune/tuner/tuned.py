"""What ``memtune.tune`` returns and the words its printout shares with ``memtune tune`` and ``memtune simulate``.

``Tuned`` holds the search's result (``memtune.tuner.search``), the lower bound on any plan's step at the budget
(``memtune.tuner.bound``) and, where compiled plans were candidates, the compiled-region trials and the compiled lower
bound; ``print(tuned)`` shows them all. The ``*_words`` helpers and ``device_label`` say one fact the same way
wherever it is printed. Pure Python (no torch): the pipeline that makes a ``Tuned`` is ``memtune.tuner.pipeline``
(profiles to plans) and ``memtune.tuner.measure.tune_module`` (a model measured first).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memtune.tuner._peak_check import peak_check
from memtune.tuner.budget import bytes_unit, format_bytes, search_budget

if TYPE_CHECKING:
    from memtune.profiler import Profile
    from memtune.tuner.bound import StepBound
    from memtune.tuner.compiled_bound import CompiledBound
    from memtune.tuner.finalists import Finalist
    from memtune.tuner.plan import Plan
    from memtune.tuner.region_plans import RegionTrial
    from memtune.tuner.search import Candidate, TuneResult

__all__ = [
    "CONCEPTS",
    "Tuned",
    "bound_words",
    "coarser_note",
    "compiled_bound_words",
    "compute_words",
    "device_label",
    "held_output_note",
    "retries_words",
]

#: where a printout sends a reader for its words (headroom, the lower bound, scaled stages), not into the source
CONCEPTS = "see docs/concepts.md"


def device_label(profile: Profile) -> str:
    """What a printout says the profile's times are of: ``on NVIDIA H100`` where they were measured there, ``modeled
    for h100 (roofline; compute counted on the CPU)`` for a module profile made on the CPU for an H100 (NOTE [ Modeled
    module profiles ] in ``memtune.profiler.module_roofline``), ``modeled for h100 (roofline)`` for a roofline profile
    of a chain, and ``for NVIDIA H100 (copies modeled, compute ...)`` where only the copies are the GPU's."""
    p = profile
    if p.compute_source.startswith("modeled:"):
        how = "roofline; compute counted on the CPU" if "counted on the CPU" in p.compute_source else "roofline"
        return f"modeled for {p.device.key} ({how})"
    if p.source == "modeled":
        return f"for {p.device.name} (copies modeled, compute {p.compute_source})"
    return f"on {p.device.name}"


def coarser_note(prof: Profile) -> str | None:
    """What a module profile planned whole that a user may expect split (a module whose child runs more than once,
    NOTE [ Module stages ] in ``memtune.profiler.module_stages``), and how to split it; None where nothing was."""
    coarser = prof.model_params.get("coarser")
    if not coarser:
        return None
    return (
        f"planned coarser than its blocks: {coarser}; a module whose child runs more than once (a shared layer) is "
        "planned whole, so its blocks get one action together. Name the blocks as stages to plan them apart "
        "(stages=['encoder.block.*', ...]); the shared layer then runs outside every stage"
    )


def held_output_note(prof: Profile) -> str | None:
    """What a module profile's output holds besides its tensors (a Hugging Face cache of keys and values) where it is
    1% of the unplanned step's peak or more, and how to drop it (NOTE [ Held output ] in ``memtune.tuner.simulator``);
    None where it holds less."""
    held, nbytes = prof.model_params.get("held_objects"), prof.model_params.get("held_object_bytes")
    if not held or not isinstance(nbytes, int):
        return None
    peak = prof.step_peak.allocated_bytes if prof.step_peak is not None else 0
    if nbytes < max(2**20, peak // 100):
        return None
    return (
        f"the model's output holds {format_bytes(nbytes)} that training does not read: {held}. A loop that keeps the "
        "output (out = model(**batch); out.loss.backward()) holds it until the backward ends, and plans count it. A "
        "Hugging Face model returns its key/value cache while config.use_cache is True: set model.config.use_cache = "
        "False to train (its gradient checkpointing does so itself); if your loop drops the output before the "
        "backward, profile with output_held=False"
    )


@dataclass(frozen=True)
class Tuned:
    """What ``tune`` found: the search's result and the lower bound on any plan's step at the budget.

    Attributes:
        result: the search (every baseline, the best plan, the Pareto front; ``result.profile`` is the profile):
            the eager profile's, or with compiling on the compiled-region profile's whose best plan is fastest (NOTE
            [ Compiled-region candidates ] in ``memtune.tuner.region_plans``).
        bound: no plan of offload, recompute and algorithm choice steps faster (NOTE [ Budget bound ]); None when
            the solver gave no answer.
        regions: with compiling on, every compiled-region profile measured and what its search found (or why it
            failed); empty otherwise.
        compiled_bound: with compiled plans among the candidates (compiler points, compiled-region profiles), no
            compiled plan steps faster (NOTE [ Compiled lower bound ] in ``memtune.tuner.compiled_bound``); None
            where there were none.
        searched: every search's result, the eager profile's first, then each compiled-region profile's; empty
            where only ``result`` was searched.
        measured: the finalists measured on the GPU before one was served (NOTE [ Measured finalists ] in
            ``memtune.tuner.finalists``), fastest prediction first, then any fallback measured; empty where none were
            measured. Where none of them ran, ``result`` has no best.
    """

    result: TuneResult
    bound: StepBound | None
    regions: tuple[RegionTrial, ...] = ()
    compiled_bound: CompiledBound | None = None
    searched: tuple[TuneResult, ...] = ()
    measured: tuple[Finalist, ...] = ()

    @property
    def plan(self) -> Plan | None:
        """The best plan (None when no plan fits the budget)."""
        return self.result.best.plan if self.result.best is not None else None

    @property
    def profile(self) -> Profile:
        return self.result.profile

    def table(self) -> list[dict[str, Any]]:
        """One row per baseline policy and the best plan: name, step ms, slowdown, peak bytes, feasible, source."""
        base = self.result.unconstrained.step_ms
        rows: list[Candidate] = list(self.result.policies)
        best = self.result.best
        if best is not None and not any(c.name == best.name and c.plan == best.plan for c in rows):
            rows.append(best)  # a baseline that is the best is listed once
        return [{**c.to_dict(), "slowdown": round(c.step_ms / base, 4)} for c in rows]

    def __str__(self) -> str:
        r, p = self.result, self.result.profile
        unit, size = bytes_unit(r.budget_bytes, r.unconstrained.peak_bytes, *(c.peak_bytes for c in r.policies))

        def fmt(n: float) -> str:  # one unit for the whole printout, the table's; a budget too small for it aside
            return f"{n / size:.2f} {unit}" if n >= size / 100 else format_bytes(n)

        check, coarser, held = peak_check(p), coarser_note(p), held_output_note(p)
        lines = [f"{p.model} batch {p.batch} {p.dtype} {device_label(p)} (profile {p.source}, {p.n_stages} stages)"]
        lines += [note for note in (coarser, held) if note is not None]
        lines += [f"memory check: {check}"] if check is not None else []
        lines += self._budget_lines(fmt)
        lines.append(f"{'policy':<22}{'step ms':>10}{'slowdown':>10}{'peak ' + unit:>12}  fits")
        for row in self.table():
            finite = math.isfinite(row["step_ms"])
            step = f"{row['step_ms']:>10.2f}" if finite else f"{'-':>10}"
            slowdown = f"{row['slowdown']:>9.2f}x" if finite else f"{'-':>10}"
            fits = "yes" if row["feasible"] else "no"
            lines.append(f"{row['name']:<22}{step}{slowdown}{row['peak_bytes'] / size:>12.2f}  {fits}")
        return "\n".join(
            lines + self._best_lines(fmt) + self._bound_lines(fmt) + self._region_lines() + self._measured_lines()
        )

    def _measured_lines(self) -> list[str]:
        """The finalists measured before serving, one line each (NOTE [ Measured finalists ])."""
        if not self.measured:
            return []
        head = "measured before serving (training steps under the budget's cap, the optimizer's update included):"
        return [head] + [f"  {f.line()}" for f in self.measured]

    def _region_lines(self) -> list[str]:
        """The compiled-region profiles measured, one line each (NOTE [ Compiled-region candidates ])."""
        if not self.regions:
            return []
        return [
            "compiled regions (each partition of the model into regions compiled at one activation budget or save "
            "rule, its "
            "unplanned step against the whole model compiled, and its best plan within the budget):"
        ] + [f"  {t.line()}" for t in self.regions]

    def _budget_lines(self, fmt: Callable[[float], str]) -> list[str]:
        """The budget, the share of it plans must fit and the headroom kept free; the unconstrained step."""
        r = self.result
        base = f"unconstrained step {r.unconstrained.step_ms:.2f} ms at {fmt(r.unconstrained.peak_bytes)}"
        if not r.headroom:
            return [f"budget {fmt(r.budget_bytes)}, all of it for plans (no headroom kept)", base]
        return [
            f"budget {fmt(r.budget_bytes)}; plans must fit {fmt(search_budget(r.budget_bytes, r.headroom))}, "
            f"{1 - r.headroom:.0%} of it ({r.headroom:.0%} is kept free as headroom for the caching allocator, "
            f"{CONCEPTS})",
            base,
        ]

    def _best_lines(self, fmt: Callable[[float], str]) -> list[str]:
        """The best plan stage by stage, with its allocator retries where priced; or that no plan fits."""
        r, best = self.result, self.result.best
        if best is None:
            if self.measured:  # NOTE [ Measured finalists ], step 5: plans fit in simulation, none ran under the cap
                return [f"no plan ran within {fmt(r.budget_bytes)} on this GPU (below), so none is served"]
            fit = fmt(search_budget(r.budget_bytes, r.headroom))
            return [f"no plan fits {fit}" + (", the budget less its headroom" if r.headroom else "")]
        lines = [
            f"best plan: {best.name}, {best.step_ms:.2f} ms ({best.step_ms / r.unconstrained.step_ms:.2f}x), peak "
            f"{fmt(best.peak_bytes)}"
        ]
        if best.alloc_retries:
            lines.append(f"  {retries_words(best.step_ms - best.allocator_ms, best.allocator_ms, best.alloc_retries)}")
        if best.plan.compile_budget is not None and best.plan.stages is not None:  # NOTE [ Regions ]
            eager = ", ".join(best.plan.stages[k] for k in best.plan.eager_stages)
            but = f", except {eager} (eager: written in place at its edges)" if eager else ""
            lines.append(
                f"  its stages are regions compiled by torch.compile under activation budget "
                f"{best.plan.compile_budget:g}"
                + (f", saving by memtune's rule {best.plan.compile_saves!r}" if best.plan.compile_saves else "")
                + but
            )
        names = best.plan.stages or tuple(s.name for s in r.profile.stages)
        return lines + [f"  {name or '(model)'}: {a.value}" for name, a in zip(names, best.plan.actions, strict=True)]

    def _bound_lines(self, fmt: Callable[[float], str]) -> list[str]:
        """The lower bounds on every plan's step within the budget, in words: the eager one, and the compiled one where
        compiled plans were candidates."""
        budget = fmt(self.result.budget_bytes)
        lines = [] if self.bound is None else [bound_words(self.bound, budget)]
        return lines + ([] if self.compiled_bound is None else [compiled_bound_words(self.compiled_bound, budget)])


def bound_words(bound: StepBound, budget: str) -> str:
    """The lower bound on every plan's step within ``budget`` (as printed), in the words ``print(tuned)`` and
    ``memtune tune`` both print; where no plan can fit, that, with no infinite time."""
    if not math.isfinite(bound.step_ms):
        return (
            f"no plan can run within {budget}: at some moment of the step more must stay on the GPU than that, "
            f"whatever is offloaded or recomputed (the lower bound, {CONCEPTS})"
        )
    return (
        f"no plan of offload, recompute and algorithm choice can step faster than {bound.step_ms:.2f} ms "
        f"({bound.ratio:.2f}x) within {budget} (the lower bound, {CONCEPTS})"
    )


def compiled_bound_words(bound: CompiledBound, budget: str) -> str:
    """The lower bound on every compiled plan's step within ``budget`` (as printed), in the words of ``bound_words``;
    where no compiled plan can fit, that, with no infinite time."""
    if not math.isfinite(bound.step_ms):
        return (
            f"no compiled plan can run within {budget}: offload and recompute of the compiled regions cannot free "
            f"enough at their peak (the compiled lower bound, {CONCEPTS})"
        )
    least = bound.least
    host = (
        f"; the host sets it: it issues a step of the {least.family} in {least.host_ms:.2f} ms with every region kept"
        if least.host_ms > 0 and least.host_ms >= max(least.compute_ms, least.link_ms)
        else ""
    )
    return (
        f"no compiled plan (the whole model compiled, or compiled regions with offload and recompute) can step faster "
        f"than {bound.step_ms:.2f} ms ({bound.ratio:.2f}x the compiled unconstrained step) within {budget} (the "
        f"compiled lower bound, {CONCEPTS}){host}"
    )


def compute_words(profile: Profile) -> str:
    """Where a profile's compute times come from, in words: a module profile whose stages, timed one by one, added
    up to more than the whole step says that they were scaled down to it, and by how much."""
    text, scaled, rest = profile.compute_source.partition(" (stages scaled x")
    if not scaled:
        return text
    return (
        f"{text}; every stage's times scaled by {rest.split(' ', 1)[0]}, since timed one by one the stages added up "
        f"to more than the whole step measured ({CONCEPTS})"
    )


def retries_words(simulated_ms: float, allocator_ms: float, retries: float) -> str:
    """What of a step its allocator retries cost, in the words ``print(tuned)``, ``memtune tune`` and ``memtune
    simulate`` all print."""
    return (
        f"of which {simulated_ms:.2f} ms simulated and {allocator_ms:.2f} ms for {retries:.1f} allocator retries per "
        "step predicted under the budget's cap (near its cap the caching allocator frees its cache and maps memory "
        "anew when a request finds no free block large enough)"
    )

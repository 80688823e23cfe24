"""The Python entry points the ``memtune`` face re-exports: profile any model, tune it, apply the plan.

Ten lines for a Hugging Face model built from a config::

    import memtune, torch
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=4, vocab_size=4096))   # its default config, caches on
    ids = torch.randint(0, 4096, (8, 256))
    tuned = memtune.tune(model, "60% of peak", example_inputs={"input_ids": ids, "labels": ids}, gpu="h100")
    print(tuned)                                   # the table, the best plan and the bound
    model = memtune.planned(model, tuned)          # same parameters; every step follows the plan
    model(input_ids=ids, labels=ids).loss.backward()

Here the floors decide (``memtune.profiler.module_profile``, ``memtune.tuner.search``, ``memtune.tuner.bound``,
``memtune.tuner.runtime``); this module only joins them and shows progress.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtune.profiler import Profile
from memtune.tuner import Candidate, Plan, TuneResult, format_bytes, peak_check, planning_headroom
from memtune.tuner.budget import Budget, bytes_unit, profile_budget, search_budget

if TYPE_CHECKING:
    import torch
    from torch import nn

    from memtune.profiler.region_profile import RegionProfile
    from memtune.tuner.bound import StepBound
    from memtune.tuner.compiled_bound import CompiledBound
    from memtune.tuner.region_plans import RegionTrial
    from memtune.tuner.runtime.planned import PlannedBase

__all__ = [
    "CONCEPTS",
    "DTYPES",
    "Tuned",
    "bound_words",
    "check_arguments",
    "compiled_bound_words",
    "compute_words",
    "device_label",
    "planned",
    "profile",
    "retries_words",
    "tune",
    "tune_profiles",
]


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


@contextmanager
def _bar(label: str, enabled: bool) -> Iterator[Callable[[int, int, str], None]]:
    """A rich progress bar on standard error; yields ``update(done, total, text)``."""
    if not enabled:
        yield lambda _done, _total, _text: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(f"[bold]{label}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("", total=None)
        yield lambda done, total, text: bar.update(task, completed=done, total=total, description=text)


def profile(
    model: nn.Module,
    example_inputs: Any,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    stages: list[str] | None = None,
    dtype: str = "float32",
    gpu: str | None = None,
    warmup: int = 2,
    repeats: int = 5,
    progress: bool = True,
    output_held: bool = True,
) -> Profile:
    """Measure ``model`` stage by stage on the device it is on (``memtune.profiler.module_profile.profile_module``).

    Args:
        model: any ``nn.Module`` (left as found: mode, buffers and random state restored).
        example_inputs: one batch: a tensor, a tuple of arguments, a dict of keyword arguments or ``(args, kwargs)``.
        loss_fn: ``loss_fn(output) -> scalar``; None: the output's ``loss`` where it has one, else the mean of its
            floating-point outputs.
        stages: ``fnmatch`` patterns naming the stages (``["embed", "layers.*", "head"]``); None: the repeated blocks
            and the pieces between them (NOTE [ Module stages ]).
        dtype: ``float32``, or ``bfloat16``/``float16`` under autocast.
        gpu: on the CPU the GPU type the profile describes (its copy rates; default ``h200``); on CUDA None.
        warmup: untimed rounds per stage before the timed ones.
        repeats: timed rounds per stage (their medians are kept).
        progress: a progress bar on standard error.
        output_held: whether your training loop holds the model's output until the backward ends (``out =
            model(**batch); out.loss.backward()``): the worst case and the default; False where it drops it first
            (``model(**batch).loss.backward()``). NOTE [ Held output ] in ``memtune.tuner.simulator``.

    Returns:
        The ``Profile`` (``measured`` on CUDA, ``modeled`` on the CPU). Where the simulator's unplanned peak and the
        measured one differ by more than 3%, a warning says so (NOTE [ Profile self-check ] in
        ``memtune.tuner.peak_check``).
    """
    from memtune.profiler import profile_module

    check_arguments(dtype=dtype, gpu=gpu)  # before any measuring
    with _bar("profiling", progress) as update:
        prof = profile_module(
            model,
            example_inputs,
            loss_fn=loss_fn,
            stages=stages,
            dtype=dtype,
            gpu=gpu,
            warmup=warmup,
            repeats=repeats,
            progress=lambda name, done, total: update(done, total, name),
            output_held=output_held,
        )
    check = peak_check(prof)
    if check is not None and check.reported:
        warnings.warn(f"memory check: {check}", stacklevel=2)
    coarser = _coarser_note(prof)
    if coarser is not None:
        warnings.warn(coarser, stacklevel=2)
    return prof


def _coarser_note(prof: Profile) -> str | None:
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
    """

    result: TuneResult
    bound: StepBound | None
    regions: tuple[RegionTrial, ...] = ()
    compiled_bound: CompiledBound | None = None

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

        check, coarser = peak_check(p), _coarser_note(p)
        lines = [f"{p.model} batch {p.batch} {p.dtype} {device_label(p)} (profile {p.source}, {p.n_stages} stages)"]
        lines += [coarser] if coarser is not None else []
        lines += [f"memory check: {check}"] if check is not None else []
        lines += self._budget_lines(fmt)
        lines.append(f"{'policy':<22}{'step ms':>10}{'slowdown':>10}{'peak ' + unit:>12}  fits")
        for row in self.table():
            finite = math.isfinite(row["step_ms"])
            step = f"{row['step_ms']:>10.2f}" if finite else f"{'-':>10}"
            slowdown = f"{row['slowdown']:>9.2f}x" if finite else f"{'-':>10}"
            fits = "yes" if row["feasible"] else "no"
            lines.append(f"{row['name']:<22}{step}{slowdown}{row['peak_bytes'] / size:>12.2f}  {fits}")
        return "\n".join(lines + self._best_lines(fmt) + self._bound_lines(fmt) + self._region_lines())

    def _region_lines(self) -> list[str]:
        """The compiled-region profiles measured, one line each (NOTE [ Compiled-region candidates ])."""
        if not self.regions:
            return []
        return [
            "compiled regions (each partition of the model into regions compiled at one activation budget, its "
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
                f"{best.plan.compile_budget:g}{but}"
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
    return (
        f"no compiled plan (the whole model compiled, or compiled regions with offload and recompute) can step faster "
        f"than {bound.step_ms:.2f} ms ({bound.ratio:.2f}x the compiled unconstrained step) within {budget} (the "
        f"compiled lower bound, {CONCEPTS})"
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


#: where a printout sends a reader for its words (headroom, the lower bound, scaled stages), not into the source
CONCEPTS = "see docs/concepts.md"


def retries_words(simulated_ms: float, allocator_ms: float, retries: float) -> str:
    """What of a step its allocator retries cost, in the words ``print(tuned)``, ``memtune tune`` and ``memtune
    simulate`` all print."""
    return (
        f"of which {simulated_ms:.2f} ms simulated and {allocator_ms:.2f} ms for {retries:.1f} allocator retries per "
        "step predicted under the budget's cap (near its cap the caching allocator frees its cache and maps memory "
        "anew when a request finds no free block large enough)"
    )


def _calibrate_if_new(gpu: str, progress: bool) -> None:
    """Calibrate this process's GPU when it is of type ``gpu`` and that type has no calibration."""
    from memtune.tuner.measure.first_use import ensure_calibration, present_gpu

    present = present_gpu()
    if present is not None and present.key == gpu:
        ensure_calibration(progress=lambda what: print(what, file=sys.stderr) if progress else None, isolate=False)


def tune(
    model_or_profile: nn.Module | Profile,
    budget: str | int,
    *,
    example_inputs: Any = None,
    gpu: str | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    stages: list[str] | None = None,
    dtype: str = "float32",
    trials: int = 300,
    seed: int = 0,
    optimizer: str = "sgd",
    headroom: float | None = None,
    progress: bool = True,
    calibrate: bool = True,
    output_held: bool = True,
    compile: str | bool = "auto",
) -> Tuned:
    """The fastest plan for a model (profiled first) or a profile within ``budget``, beside every baseline.

    Args:
        model_or_profile: a ``Profile``, or any ``nn.Module`` (then ``example_inputs`` is required and the model is
            profiled by ``profile`` on the device it is on).
        budget: GPU memory one step may use (NOTE [ Budget grammar ]): ``"12GiB"``, ``"800MB"``, ``"60% of peak"``
            (the model's simulated unconstrained peak), ``"60% of gpu"``, or an ``int`` of bytes.
        example_inputs: one batch, as ``profile`` takes it; required with a module.
        gpu: as ``profile``; unused with a ``Profile``, whose GPU type is its own.
        loss_fn: as ``profile``.
        stages: as ``profile``.
        dtype: as ``profile``.
        trials: Optuna trials (baselines included).
        seed: the search's seed; the same seed gives the same result.
        optimizer: ``sgd`` (momentum), ``adam`` or ``none``: optimizer state bytes.
        headroom: fraction of the budget kept free for the allocator; None: the GPU type's calibration, widened by
            the simulator's measured under-prediction of the profile's unplanned step (NOTE [ Profile self-check ]).
        output_held: as ``profile``.
        progress: progress bars on standard error.
        calibrate: when the profile was measured on this process's GPU and its type has no calibration (and no
            ``headroom`` is given), calibrate it first, in this process (NOTE [ First use of a GPU type ]).
        compile: whether compiled plans are candidates: ``True`` measures, after profiling, the model compiled whole
            at activation budgets 1, 0.5 and 0.25 (NOTE [ Compiler points of a module ]) and each candidate partition
            of it into regions compiled at those budgets (NOTE [ Regions ], NOTE [ Compiled-region candidates ]),
            tunes each, and serves the fastest plan that fits, eager, compiled whole or of compiled regions;
            ``"auto"`` does so for a module on a CUDA device, not on the CPU; ``False`` never. Where compiling fails,
            a warning says why (the region and the compiler's first line) and the other plans stand.

    Returns:
        A ``Tuned``: ``plan`` (for ``planned``), ``table()``, ``bound`` (and ``compiled_bound`` where compiled plans
        were candidates); ``print(tuned)`` shows them all.

    Raises:
        ProfilerError: as ``profile``; ``UnknownGPUError`` for a ``gpu`` memtune does not know.
        TunerError: a bad budget, optimizer, dtype, trials or headroom (refused before any profiling, the message
            naming the argument and what it takes), or ``compile`` not one of True, False or ``"auto"``.
    """
    from memtune.tuner import TunerError
    from memtune.tuner.calibration import missing_calibration

    check_arguments(budget=budget, optimizer=optimizer, dtype=dtype, gpu=gpu, trials=trials, headroom=headroom)
    if compile not in (True, False, "auto"):
        raise TunerError(f"compile must be True, False or 'auto', not {compile!r}")
    region_runs: list[RegionProfile] = []
    if isinstance(model_or_profile, Profile):
        prof = model_or_profile
    else:
        if example_inputs is None:
            raise ValueError("tune(model, ...) needs example_inputs: one batch to profile the model on")
        prof = profile(
            model_or_profile,
            example_inputs,
            loss_fn=loss_fn,
            stages=stages,
            dtype=dtype,
            gpu=gpu,
            progress=progress,
            output_held=output_held,
        )
        budget_bytes = profile_budget(budget, prof, optimizer)  # a bad budget is refused before compiling
        if _compiles(model_or_profile, compile):
            prof = _with_module_points(model_or_profile, example_inputs, prof, loss_fn, optimizer, progress)
            region_runs = _region_profiles(
                model_or_profile, example_inputs, loss_fn, stages, dtype, gpu, output_held, progress
            )
    budget_bytes = profile_budget(budget, prof, optimizer)
    if calibrate and headroom is None and prof.source == "measured":
        _calibrate_if_new(prof.device.key, progress)
    advice = missing_calibration(prof) if headroom is None else None
    if advice:
        warnings.warn(advice, stacklevel=2)
    return tune_profiles(
        prof,
        budget_bytes,
        regions=region_runs,
        trials=trials,
        seed=seed,
        optimizer=optimizer,
        headroom=headroom,
        progress=progress,
    )


def tune_profiles(
    prof: Profile,
    budget_bytes: int,
    *,
    regions: Sequence[RegionProfile] = (),
    trials: int = 300,
    seed: int = 0,
    optimizer: str = "sgd",
    headroom: float | None = None,
    progress: bool = True,
) -> Tuned:
    """The search half of ``tune``, on profiles already measured (NOTE [ Compiled-region candidates ] in
    ``memtune.tuner.region_plans``): ``prof`` (eager, with any compiler points) and each compiled-region profile of
    ``regions``, each searched within ``budget_bytes``; the fastest best plan of them all is served. A benchmark that
    measures once and tunes at several budgets calls it directly.

    Args:
        prof: the eager profile.
        budget_bytes: bytes one step may use.
        regions: compiled-region profiles (``memtune.profiler.region_profile.profile_regions``); failed ones are listed.
        trials, seed, optimizer, headroom, progress: as ``tune``.
    """
    import optuna

    from memtune.tuner import Simulator
    from memtune.tuner import tune as run_tune
    from memtune.tuner.bound import step_lower_bound
    from memtune.tuner.compiled_bound import compiled_lower_bound
    from memtune.tuner.region_plans import fastest, region_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def search(p: Profile, label: str) -> TuneResult:
        with _bar(label, progress) as update:
            return run_tune(
                p,
                budget_bytes,
                trials=trials,
                seed=seed,
                optimizer=optimizer,
                headroom=planning_headroom(p) if headroom is None else headroom,
                progress=lambda done, total, best: update(
                    done, total, f"best {best.step_ms:.2f} ms" if best is not None else "no feasible plan yet"
                ),
            )

    result = search(prof, "tuning")
    results, trials_done = [result], []
    for run in regions:  # NOTE [ Compiled-region candidates ] (memtune.tuner.region_plans)
        found = search(run.profile, f"tuning regions at {run.budget:g}") if run.profile is not None else None
        results += [found] if found is not None else []
        trials_done.append(
            region_trial(
                run.partition.label,
                run.partition.names,
                run.budget,
                run.seconds,
                result=found,
                points=prof.compiler_points,
                error=run.error,
            )
        )
    result = fastest(results)
    try:
        bound: StepBound | None = step_lower_bound(Simulator(result.profile, optimizer), budget_bytes)
    except RuntimeError:  # the solver gave no answer: the plan stands without its bound
        bound = None
    compiled = [prof] + [run.profile for run in regions if run.profile is not None]
    return Tuned(result, bound, tuple(trials_done), compiled_lower_bound(compiled, budget_bytes, optimizer))


#: the dtypes a step is profiled in: ``float32``, or ``bfloat16``/``float16`` under autocast
DTYPES = ("float32", "bfloat16", "float16")


def check_arguments(
    *,
    budget: str | int | Budget | None = None,
    optimizer: str | None = None,
    dtype: str | None = None,
    gpu: str | None = None,
    trials: int | None = None,
    headroom: float | None = None,
) -> None:
    """Refuse a bad argument before any profiling, each error naming the argument and what it accepts; ``None``
    skips a check. ``tune`` and the command line call it first, so a typo costs no minutes of measuring.

    Raises:
        BudgetError: ``budget`` is not in the grammar (NOTE [ Budget grammar ]).
        UnknownGPUError: ``gpu`` is no GPU type memtune knows (the message lists them).
        TunerError: ``optimizer``, ``dtype``, ``trials`` or ``headroom`` is not one the search takes.
    """
    from memtune.tuner import TunerError
    from memtune.tuner.simulator import OPTIMIZERS

    if budget is not None:
        Budget.parse(budget)
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise TunerError(f"optimizer {optimizer!r} is not known: use sgd (momentum), adam or none")
    if dtype is not None and dtype not in DTYPES:
        raise TunerError(f"dtype {dtype!r} is not known: use float32, bfloat16 or float16 (autocast)")
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
        raise TunerError(f"trials must be a whole number of at least 1, not {trials!r}")
    if headroom is not None and not 0.0 <= headroom < 1.0:
        raise TunerError(f"headroom {headroom!r} is not a fraction of the budget in [0, 1), e.g. 0.1")
    if gpu is not None:
        from memtune.profiler import get_gpu

        get_gpu(gpu)


#: activation budgets of the whole model compiled that ``tune(..., compile=True)`` measures
COMPILE_BUDGETS = (1.0, 0.5, 0.25)


def _compiles(model: nn.Module, compile: str | bool) -> bool:
    """Whether ``tune`` measures ``model`` compiled: asked for, or ``"auto"`` and the model is on a CUDA device."""
    if compile != "auto":
        return bool(compile)
    return any(p.device.type == "cuda" for p in model.parameters())


def _with_module_points(
    model: nn.Module,
    example_inputs: Any,
    prof: Profile,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    optimizer: str,
    progress: bool,
) -> Profile:
    """``prof`` with the compiler points of ``model`` measured here; a budget that fails to compile is left out
    with a warning that says why (NOTE [ Compiler points of a module ])."""
    from memtune.tuner.measure.compiler_points import measure_module_points, with_compiler_points

    with _bar("compiling", progress) as update:
        points, errors = measure_module_points(
            model, example_inputs, prof, COMPILE_BUDGETS, loss_fn=loss_fn, optimizer=optimizer, progress=update
        )
    for budget, error in errors.items():
        warnings.warn(
            f"compiling the whole model at activation budget {budget:g} failed ({error}); the plans stay eager there",
            stacklevel=3,
        )
    return with_compiler_points(prof, points)


def _region_profiles(
    model: nn.Module,
    example_inputs: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    stages: list[str] | None,
    dtype: str,
    gpu: str | None,
    output_held: bool,
    progress: bool,
) -> list[RegionProfile]:
    """Every candidate region partition of ``model`` profiled compiled at ``COMPILE_BUDGETS`` (NOTE [ Compiled-region
    candidates ] in ``memtune.tuner.region_plans``); one that fails is kept with its error and a warning names the
    region and the compiler's first line."""
    from memtune.profiler.region_profile import profile_regions

    with _bar("compiling regions", progress) as update:
        runs = profile_regions(
            model,
            example_inputs,
            COMPILE_BUDGETS,
            loss_fn=loss_fn,
            stages=stages,
            dtype=dtype,
            gpu=gpu,
            output_held=output_held,
            progress=update,
        )
    for run in runs:
        if run.error is not None:
            warnings.warn(
                f"compiled regions {run.partition.label} at activation budget {run.budget:g} failed ({run.error}); "
                "the other plans stand",
                stacklevel=3,
            )
    return runs


def planned(
    model: nn.Module,
    plan: Tuned | TuneResult | Candidate | Plan | str | Path,
    **kwargs: Any,
) -> PlannedBase:
    """``model`` wrapped so every training step follows ``plan`` (``memtune.tuner.runtime.planned.planned``).

    ``plan`` may be what ``tune`` returned, a ``Plan``, or a plan file (``memtune tune --plan-out``). Keyword
    arguments go to ``memtune.tuner.runtime.planned.planned`` (``pool_bytes``, ``clone_segment_inputs``).

    The planned model's ``state_dict()`` has ``model``'s own keys: a checkpoint saved from it loads into your model
    class without the plan, and your own checkpoint loads into it (``load_state_dict``).

    Args:
        model: the model the plan was tuned for; its parameters are shared, not copied.
        plan: what ``tune`` returned, its ``TuneResult`` or ``Candidate``, a ``Plan``, or a plan file.
        kwargs: for ``memtune.tuner.runtime.planned.planned``.

    Raises:
        PlanError: no plan fits (``tune`` found none), or the plan does not match the model's stages.
    """
    from memtune.tuner import PlanError
    from memtune.tuner.runtime import planned as apply_plan

    if isinstance(plan, Tuned):
        plan = plan.result
    if isinstance(plan, TuneResult):
        if plan.best is None:
            raise PlanError(f"no plan fits {format_bytes(plan.budget_bytes)}; tune with a larger budget")
        plan = plan.best
    if isinstance(plan, Candidate):
        plan = plan.plan
    return apply_plan(model, plan, **kwargs)

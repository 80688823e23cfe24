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
``memtune.tuner.runtime``); this module measures the model (its profile, and its compiled candidates where compiling
is on) and hands the profiles to ``memtune.tuner.pipeline`` (NOTE [ One pipeline ]), which searches them and bounds
the step. It lives in the measuring room because it takes a live ``nn.Module``; the pipeline and ``Tuned``
(``memtune.tuner.tuned``) need no torch.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtune.profiler import Profile
from memtune.tuner._peak_check import peak_check
from memtune.tuner.budget import format_bytes, profile_budget
from memtune.tuner.pipeline import calibration_advice, check_arguments, progress_bar, tune_profiles
from memtune.tuner.plan import Plan
from memtune.tuner.search import Candidate, TuneResult
from memtune.tuner.tuned import Tuned, coarser_note, held_output_note

if TYPE_CHECKING:
    import torch
    from torch import nn

    from memtune.profiler.region_profile import RegionProfile
    from memtune.tuner.runtime._planned import PlannedBase

__all__ = ["COMPILE_BUDGETS", "planned", "profile", "tune"]

#: activation budgets of the whole model compiled that ``tune(..., compile=True)`` measures
COMPILE_BUDGETS = (1.0, 0.5, 0.25)


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
        ``memtune.tuner._peak_check``).
    """
    from memtune.profiler import profile_module

    check_arguments(dtype=dtype, gpu=gpu)  # before any measuring
    with progress_bar("profiling", progress) as update:
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
    for note in (coarser_note(prof), held_output_note(prof)):
        if note is not None:
            warnings.warn(note, stacklevel=2)
    return prof


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
    finalists: int = 3,
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
            at activation budgets 1, 0.5 and 0.25 (NOTE [ Compiler points of a module ]) and the candidate partitions
            of it into regions (NOTE [ Candidate depths ]) compiled at those budgets and under memtune's save rules
            (NOTE [ Regions ], NOTE [ Compiled-region candidates ], NOTE [ Saved tensors chosen inside a compiled
            region ]), tunes each, and serves the fastest plan that fits, eager, compiled whole or of compiled regions;
            ``"auto"`` does so for a module on a CUDA device, not on the CPU; ``False`` never. Where compiling fails,
            a warning says why (the region and the compiler's first line) and the other plans stand.
        finalists: for a module on a CUDA device, at most this many of the fastest plans found (the fastest compiler
            point that fits always among them) are measured under the budget before one is served, and the fastest
            measured is served (NOTE [ Measured finalists ] in ``memtune.tuner.finalists``); where none runs, the
            fastest plans of smaller predicted peak are tried in turn, and where none of those runs either no plan is
            served (``Tuned.plan`` is None, with a warning naming each error). 0 serves the simulator's fastest
            unmeasured. Unused on the CPU and with a ``Profile``.

    Returns:
        A ``Tuned``: ``plan`` (for ``planned``), ``table()``, ``bound`` (and ``compiled_bound`` where compiled plans
        were candidates); ``print(tuned)`` shows them all.

    Raises:
        ProfilerError: as ``profile``; ``UnknownGPUError`` for a ``gpu`` memtune does not know.
        TunerError: a bad budget, optimizer, dtype, trials or headroom (refused before any profiling, the message
            naming the argument and what it takes), ``compile`` not one of True, False or ``"auto"``, or
            ``finalists`` negative.
    """
    from memtune.tuner import TunerError

    wanted = check_arguments(budget=budget, optimizer=optimizer, dtype=dtype, gpu=gpu, trials=trials, headroom=headroom)
    if compile not in (True, False, "auto"):
        raise TunerError(f"compile must be True, False or 'auto', not {compile!r}")
    if isinstance(finalists, bool) or not isinstance(finalists, int) or finalists < 0:
        raise TunerError(f"finalists must be a whole number of plans, 0 or more, not {finalists!r}")
    region_runs: list[RegionProfile] = []
    if isinstance(model_or_profile, Profile):
        prof = model_or_profile
        budget_bytes = profile_budget(wanted, prof, optimizer)
    else:
        if example_inputs is None:
            raise ValueError("tune(model, ...) needs example_inputs: one batch to profile the model on")
        prof = profile(model_or_profile, example_inputs, loss_fn=loss_fn, stages=stages, dtype=dtype, gpu=gpu,
                       progress=progress, output_held=output_held)  # fmt: skip
        # a bad budget is refused before compiling; the compiler's points leave the eager peak as it is
        budget_bytes = profile_budget(wanted, prof, optimizer)
        if _compiles(model_or_profile, compile):
            prof = _with_module_points(model_or_profile, example_inputs, prof, loss_fn, optimizer, progress)
            region_runs = _region_profiles(model_or_profile, example_inputs, loss_fn, stages, dtype, gpu, output_held,
                                           progress)  # fmt: skip
    if calibrate and headroom is None and prof.source == "measured":
        _calibrate_if_new(prof.device.key, progress)
    advice = calibration_advice(prof, headroom)
    if advice:
        warnings.warn(advice, stacklevel=2)
    tuned = tune_profiles(prof, budget_bytes, regions=region_runs, trials=trials, seed=seed, optimizer=optimizer,
                          headroom=headroom, progress=progress)  # fmt: skip
    if finalists and not isinstance(model_or_profile, Profile) and _on_cuda(model_or_profile):
        tuned = _measured(model_or_profile, example_inputs, tuned, loss_fn, optimizer, output_held, finalists, progress)
    return tuned


def _on_cuda(model: nn.Module) -> bool:
    return any(p.device.type == "cuda" for p in model.parameters())


def _measured(
    model: nn.Module,
    example_inputs: Any,
    tuned: Tuned,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    optimizer: str,
    output_held: bool,
    limit: int,
    progress: bool,
) -> Tuned:
    """``tuned`` with its finalists measured (NOTE [ Measured finalists ] in ``memtune.tuner.finalists``); a warning
    where none ran, no plan then served."""
    from memtune.profiler.module_profile import default_loss
    from memtune.tuner.finalists import none_ran
    from memtune.tuner.measure.finalists import measure_finalists

    with progress_bar("measuring finalists", progress) as update:
        out = measure_finalists(model, example_inputs, tuned, loss_fn or default_loss, optimizer=optimizer,
                                output_held=output_held, limit=limit, progress=update)  # fmt: skip
    note = none_ran(out.measured)
    if note is not None:
        warnings.warn(note, stacklevel=3)
    return out


def _compiles(model: nn.Module, compile: str | bool) -> bool:
    """Whether ``tune`` measures ``model`` compiled: asked for, or ``"auto"`` and the model is on a CUDA device."""
    if compile != "auto":
        return bool(compile)
    return _on_cuda(model)


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

    with progress_bar("compiling", progress) as update:
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

    with progress_bar("compiling regions", progress) as update:
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
                f"compiled regions {run.partition.label} at {run.policy} failed ({run.error}); the other plans stand",
                stacklevel=3,
            )
    from memtune.tuner.measure.host_price import host_priced

    with progress_bar("pricing the host", progress) as update:
        return host_priced(model, example_inputs, runs, loss_fn, output_held=output_held, progress=update)


def planned(
    model: nn.Module,
    plan: Tuned | TuneResult | Candidate | Plan | str | Path,
    **kwargs: Any,
) -> PlannedBase:
    """``model`` wrapped so every training step follows ``plan`` (``memtune.tuner.runtime._planned.planned``).

    ``plan`` may be what ``tune`` returned, a ``Plan``, or a plan file (``memtune tune --plan-out``). Keyword
    arguments go to ``memtune.tuner.runtime._planned.planned`` (``pool_bytes``, ``clone_segment_inputs``).

    The planned model's ``state_dict()`` has ``model``'s own keys: a checkpoint saved from it loads into your model
    class without the plan, and your own checkpoint loads into it (``load_state_dict``).

    Args:
        model: the model the plan was tuned for; its parameters are shared, not copied.
        plan: what ``tune`` returned, its ``TuneResult`` or ``Candidate``, a ``Plan``, or a plan file.
        kwargs: for ``memtune.tuner.runtime._planned.planned``.

    Raises:
        PlanError: no plan fits (``tune`` found none, or none it measured ran), or the plan does not match the model's
            stages.
    """
    from memtune.tuner import PlanError
    from memtune.tuner.runtime import planned as apply_plan

    if isinstance(plan, Tuned):
        if plan.result.best is None and plan.measured:  # NOTE [ Measured finalists ], step 5
            raise PlanError(
                f"no plan ran within {format_bytes(plan.result.budget_bytes)} on this GPU: "
                + "; ".join(f.line() for f in plan.measured)
                + ". Tune with a larger budget"
            )
        plan = plan.result
    if isinstance(plan, TuneResult):
        if plan.best is None:
            held = held_output_note(plan.profile)
            raise PlanError(
                f"no plan fits {format_bytes(plan.budget_bytes)}; tune with a larger budget"
                + (f", or shed what the output holds: {held}" if held is not None else "")
            )
        plan = plan.best
    if isinstance(plan, Candidate):
        plan = plan.plan
    return apply_plan(model, plan, **kwargs)

"""Measuring a tune's finalists on the model's CUDA device and serving the fastest that ran (NOTE [ Measured
finalists ] in ``memtune.tuner.finalists``, which chooses them)."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from memtune.profiler.module_profile import as_inputs, left_as_found
from memtune.tuner._search_results import Candidate, TuneResult
from memtune.tuner.finalists import Finalist, fallback_pool, fastest_measured, finalists, measured_in_turn, served
from memtune.tuner.measure.module_bench import measure_step
from memtune.tuner.measure.step_timing import training_step
from memtune.tuner.runtime._planned import planned
from memtune.tuner.runtime._run_errors import PlanOutOfMemoryError
from memtune.tuner.runtime.guard import budget_guard
from memtune.tuner.tuned import Tuned

__all__ = ["FINALIST_STEPS", "FINALIST_WARMUP", "measure_finalists", "run_finalist"]

FINALIST_WARMUP = 2
"""Untimed steps of each finalist under the cap, after its first step outside it (which compiles)."""
FINALIST_STEPS = 5
"""Timed steps of each finalist; their median is its step."""


def measure_finalists(
    model: nn.Module,
    example_inputs: Any,
    tuned: Tuned,
    loss_fn: Callable[[Any], torch.Tensor],
    *,
    optimizer: str,
    output_held: bool,
    limit: int = 3,
    progress: Callable[[int, int, str], None] | None = None,
) -> Tuned:
    """``tuned`` with its finalists measured and the fastest that ran served (NOTE [ Measured finalists ]).

    Args:
        model: the model ``tuned`` was searched for, on its CUDA device; left as found.
        example_inputs: the batch it was profiled on.
        tuned: what the search found (``memtune.tuner.pipeline.tune_profiles``).
        loss_fn: ``loss_fn(output) -> scalar``.
        optimizer: the optimizer the search priced (``sgd``, ``adam`` or ``none``); its update runs at learning rate 0.
        output_held: whether the loop holds the output until the backward ends, as profiled.
        limit: at most this many finalists.
        progress: ``progress(done, total, what)`` before each finalist and at the end.

    Returns:
        ``tuned`` with ``measured`` set (the finalists, then any fallback measured) and ``result`` the served plan's
        search, that plan its best, or ``tuned.result`` with no best where none ran; ``tuned`` itself where no plan
        fits.
    """
    searched = tuned.searched or (tuned.result,)
    chosen = finalists(searched, limit)
    if not chosen:
        return tuned
    device = next(p.device for p in model.parameters())
    budget = tuned.result.budget_bytes
    dtype = tuned.result.profile.dtype

    done: list[Finalist] = []

    def run(plans: Sequence[tuple[str, TuneResult, Candidate]], total: int) -> list[Finalist]:
        for name, _, candidate in plans:
            if progress is not None:
                progress(len(done), total, name)
            done.append(run_finalist(model, example_inputs, name, candidate, budget, loss_fn, optimizer=optimizer,
                                     output_held=output_held, dtype=dtype))  # fmt: skip
        return done[-len(plans) :]

    with left_as_found(model, device):  # NOTE [ Measured finalists ], step 5: fallbacks in turn until one runs
        ran = measured_in_turn(chosen, fallback_pool(searched), run, limit)
    if progress is not None:
        progress(len(chosen), len(chosen), "done")
    won = fastest_measured(ran)
    if won is None:  # measured to run out of memory or to fail: no plan is served; tune warns (none_ran)
        return dataclasses.replace(tuned, result=dataclasses.replace(tuned.result, best=None, no_choice=None),
                                   measured=tuple(ran))  # fmt: skip
    ran[won] = dataclasses.replace(ran[won], served=True)
    return dataclasses.replace(tuned, result=served(chosen[won]), measured=tuple(ran))


def run_finalist(
    model: nn.Module,
    example_inputs: Any,
    name: str,
    candidate: Candidate,
    budget: int,
    loss_fn: Callable[[Any], torch.Tensor],
    *,
    optimizer: str,
    output_held: bool,
    dtype: str,
) -> Finalist:
    """One finalist named ``name`` run as served within ``budget`` bytes: one step outside the cap (a compiled plan
    compiles there, NOTE [ Regions compile at their first call ] in ``memtune.tuner.runtime._planned_module``), then
    ``measure_step`` under ``budget_guard``; an error (an out-of-memory under the cap, a compiler's) is the
    finalist's. The model's gradients are dropped after; the caller restores the rest (``left_as_found``)."""
    head = Finalist(name, candidate.step_ms, candidate.peak_bytes)
    pm = None
    try:
        pm = planned(model, candidate.plan)
        _first_step(model, pm, example_inputs, loss_fn, output_held, dtype)
        with budget_guard(budget, pm):
            got = measure_step(model, pm, example_inputs, loss_fn, warmup=FINALIST_WARMUP, steps=FINALIST_STEPS,
                               output_held=output_held, optimizer=optimizer, dtype=dtype)  # fmt: skip
        return dataclasses.replace(head, step_ms=got["step_ms"], reserved_bytes=got["reserved_bytes"],
                                   peak_bytes=got["peak_bytes"])  # fmt: skip
    except Exception as exc:  # an out-of-memory under the cap, a compiler's error: the finalist's result
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        short = isinstance(exc, (torch.OutOfMemoryError, PlanOutOfMemoryError))
        return dataclasses.replace(head, error=f"{type(exc).__name__}: {text}", out_of_memory=short)
    finally:
        for p in model.parameters():
            p.grad = None
        if pm is not None:
            pm.release()  # its stage modules' own forward back (NOTE [ Stage modules are wrapped once ])
        del pm
        gc.collect()
        torch.cuda.empty_cache()


def _first_step(
    model: nn.Module, run: nn.Module, example_inputs: Any, loss_fn: Callable[[Any], torch.Tensor], output_held: bool,
    dtype: str,
) -> None:  # fmt: skip
    """One training step of ``run`` without an update, outside any cap."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    cast = None if dtype == "float32" else getattr(torch, dtype)
    training_step(run, as_inputs(example_inputs), loss_fn, opt, output_held=output_held, autocast=cast)()
    torch.cuda.synchronize()

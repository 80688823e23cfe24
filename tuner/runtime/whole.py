"""Measure the whole model compiled at several activation budgets: the compiler points of a profile (NOTE
[ Whole-model compile ] in ``tuner.whole``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from profiler import CompilerPoint, ModelChain, Profile
from tuner.runtime.bench import BenchRow, bench_plans

__all__ = ["compiler_points", "measure_compiler_points", "with_compiler_points"]


def compiler_points(rows: Sequence[BenchRow]) -> tuple[CompilerPoint, ...]:
    """The compiler points of the ``torch.compile`` peer rows of ``rows`` that ran (rows with an error are left
    out), in the order of ``rows``."""
    return tuple(
        CompilerPoint(
            activation_budget=r.compile_budget,
            step_ms=r.step_ms,
            peak_bytes=r.peak_bytes,
            reserved_bytes=r.reserved_bytes,
        )
        for r in rows
        if r.kind == "compiler" and r.compile_budget is not None and r.step_ms and r.peak_bytes and not r.error
    )


def with_compiler_points(profile: Profile, points: Sequence[CompilerPoint]) -> Profile:
    """``profile`` with ``points`` added; a point at a budget already measured replaces the old one. Sorted by
    budget."""
    by_budget = {p.activation_budget: p for p in (*profile.compiler_points, *points)}
    return profile.model_copy(update={"compiler_points": tuple(by_budget[b] for b in sorted(by_budget))})


def measure_compiler_points(
    chain_factory: Callable[[], ModelChain],
    profile: Profile,
    budgets: Sequence[float],
    *,
    warmup: int = 2,
    iters: int = 5,
    progress: Callable[[str], None] | None = None,
    on_row: Callable[[BenchRow], None] | None = None,
) -> tuple[tuple[CompilerPoint, ...], list[BenchRow]]:
    """Compile the whole model at each activation budget and measure a training step of the profile's batch, each
    in a fresh process (NOTE [ Bench isolation ]; the warm-up steps compile). CUDA only.

    Args:
        chain_factory: a picklable callable that builds the model (``functools.partial(zoo.build, name, params)``).
        profile: the model's profile (batch and dtype come from it).
        budgets: activation budgets, each 0 to 1.
        warmup, iters: warm-up (compiling) and timed steps per budget.
        progress: called with each row's name as it starts; on_row: with each row as it is measured.

    Returns:
        The points that ran, and every row (a row that failed keeps its error).

    Raises:
        ValueError: a budget outside 0..1.
        RuntimeError: no CUDA device.
    """
    bad = [b for b in budgets if not 0.0 <= b <= 1.0]
    if bad:
        raise ValueError(f"activation budgets are shares from 0 to 1, not {bad}")
    if not torch.cuda.is_available():
        raise RuntimeError("compiler points are measured on a CUDA GPU, and none is visible")
    rows = bench_plans(
        None,
        profile,
        profile.batch,
        profile.dtype,
        torch.cuda.get_device_properties(0).total_memory,  # uncapped: the compiler's own peak is the point
        [],
        pytorch_builtins=False,
        warmup=warmup,
        iters=iters,
        progress=progress,
        on_row=on_row,
        chain_factory=chain_factory,
        unconstrained=False,
        compiler_budgets=budgets,
    )
    return compiler_points(rows), rows

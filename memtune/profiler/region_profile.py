"""Profiles of a model's candidate region partitions, each compiled at several activation budgets (NOTE [ Regions ] in
``memtune.profiler.region_tree``, NOTE [ Profiles of compiled regions ] in ``memtune.profiler.module_profile``).

``profile_regions`` measures one ``profile_module(..., stages=partition.names, compile_budget=b)`` per partition and
budget, in this process, one after the other; a partition whose compile or measurement fails is kept with its error
(the region that failed and the first line of the compiler's message), so the caller plans the others and eager.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memtune.profiler.module_profile import as_inputs, profile_module
from memtune.profiler.profile import Profile
from memtune.profiler.region_tree import RegionPartition, first_line, region_partitions

__all__ = ["RegionProfile", "profile_regions"]


@dataclass(frozen=True)
class RegionProfile:
    """One partition measured compiled at one activation budget.

    Attributes:
        partition: the regions.
        budget: the activation budget they were compiled under.
        profile: the compiled profile (None where it failed).
        error: why it failed, in one line (None where it did not).
        seconds: wall seconds its measurement took, compiling included.
    """

    partition: RegionPartition
    budget: float
    profile: Profile | None
    error: str | None
    seconds: float


def profile_regions(
    model: nn.Module,
    example_inputs: Any,
    budgets: Sequence[float],
    *,
    partitions: Sequence[RegionPartition] | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    stages: list[str] | None = None,
    dtype: str = "float32",
    gpu: str | None = None,
    warmup: int = 2,
    repeats: int = 5,
    output_held: bool = True,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[RegionProfile]:
    """Measure every candidate partition of ``model`` compiled at every budget of ``budgets``.

    Args:
        model: the model, on its device; left as found after each profile.
        example_inputs: one batch, as ``profile_module`` takes it.
        budgets: activation budgets, each 0 to 1.
        partitions: the partitions to measure; None: ``region_partitions`` of the model (its default stages, or
            ``stages``, as the finest).
        loss_fn, stages, dtype, gpu, warmup, repeats, output_held: as ``profile_module``.
        progress: called with (profiles done, profiles, text) before each and at the end.

    Returns:
        One ``RegionProfile`` per partition and budget, partitions coarsest first, budgets in the order given.

    Raises:
        ValueError: a budget outside 0..1.
        ProfilerError: as ``region_partitions`` (the model's stages cannot be found).
    """
    bad = [b for b in budgets if not 0.0 <= b <= 1.0]
    if bad:
        raise ValueError(f"activation budgets are shares from 0 to 1, not {bad}")
    parts = list(partitions) if partitions is not None else region_partitions(model, as_inputs(example_inputs), stages)
    todo = [(p, b) for p in parts for b in budgets]
    out: list[RegionProfile] = []
    for k, (part, budget) in enumerate(todo):
        if progress is not None:
            progress(k, len(todo), f"{part.label} at activation budget {budget:g}")
        began = time.perf_counter()
        prof: Profile | None = None
        error: str | None = None
        try:
            prof = profile_module(
                model,
                example_inputs,
                loss_fn=loss_fn,
                stages=list(part.names),
                dtype=dtype,
                gpu=gpu,
                warmup=warmup,
                repeats=repeats,
                output_held=output_held,
                compile_budget=budget,
            )
        except Exception as exc:  # the compiler's errors have no common type; the other candidates still stand
            error = first_line(exc)
        out.append(RegionProfile(part, budget, prof, error, time.perf_counter() - began))
    if progress is not None:
        progress(len(todo), len(todo), "done")
    return out

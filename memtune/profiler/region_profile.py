"""Profiles of a model's candidate region partitions, each compiled at several activation budgets (NOTE [ Regions ] in
``memtune.profiler.region_tree``, NOTE [ Profiles of compiled regions ] in ``memtune.profiler.module_profile``).

``profile_regions`` measures one ``profile_module(..., stages=partition.names, compile_budget=b)`` per partition and
budget, and one ``profile_module(..., compile_budget=1, compile_saves=rule)`` per partition and save rule (NOTE [ Saved
tensors chosen inside a compiled region ] in ``memtune.profiler.saved_tags``), in this process, one after the other; a
partition whose compile or measurement fails is kept with its error (the region that failed and the first line of the
compiler's message), so the caller plans the others and eager.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from memtune.profiler import saved_tags
from memtune.profiler._profile import Profile, SaveRule
from memtune.profiler.module_profile import as_inputs, profile_module
from memtune.profiler.region_layout import regions_channels_last
from memtune.profiler.region_tree import RegionPartition, candidate_partitions, first_line, region_partitions

__all__ = ["RegionProfile", "profile_regions"]


@dataclass(frozen=True)
class RegionProfile:
    """One partition measured compiled at one activation budget.

    Attributes:
        partition: the regions.
        budget: the activation budget they were compiled under.
        saves: memtune's save rule inside the regions; None: the compiler's own choice under ``budget``.
        profile: the compiled profile (None where it failed).
        error: why it failed, in one line (None where it did not).
        seconds: wall seconds its measurement took, compiling included.
        channels_last: its regions ran their convolutions channels-last, the layout the compiler gives the whole
            model (NOTE [ Regions in the whole model's layout ] in ``memtune.profiler.region_layout``).
    """

    partition: RegionPartition
    budget: float
    profile: Profile | None
    error: str | None
    seconds: float
    saves: SaveRule | None = None
    channels_last: bool = False

    @property
    def policy(self) -> str:
        """What decided the saved tensors, in words: ``activation budget 0.5`` or ``save rule 'compute'``."""
        return f"save rule {self.saves!r}" if self.saves is not None else f"activation budget {self.budget:g}"


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
    rules: Sequence[SaveRule] | None = None,
) -> list[RegionProfile]:
    """Measure candidate partitions of ``model`` compiled at every budget of ``budgets`` (by default two, NOTE
    [ Candidate depths ]).

    Args:
        model: the model, on its device; left as found after each profile.
        example_inputs: one batch, as ``profile_module`` takes it.
        budgets: activation budgets, each 0 to 1.
        partitions: the partitions to measure; None: the ``candidate_partitions`` of the model's ``region_partitions``
            (its default stages, or ``stages``, as the finest; NOTE [ Candidate depths ]).
        loss_fn, stages, dtype, gpu, warmup, repeats, output_held: as ``profile_module``.
        progress: called with (profiles done, profiles, text) before each and at the end.
        rules: memtune's save rules, each measured at activation budget 1 after the budgets; None: every one of
            ``SAVE_RULES``; empty: the compiler's choice only.

    Returns:
        One ``RegionProfile`` per partition and budget, then per partition and rule: partitions coarsest first,
        budgets and rules in the order given.

    Raises:
        ValueError: a budget outside 0..1, or a rule that is not one of ``SAVE_RULES``.
        ProfilerError: as ``region_partitions`` (the model's stages cannot be found).
    """
    bad = [b for b in budgets if not 0.0 <= b <= 1.0]
    if bad:
        raise ValueError(f"activation budgets are shares from 0 to 1, not {bad}")
    chosen: Sequence[str] = saved_tags.SAVE_RULES if rules is None else tuple(rules)
    unknown = [r for r in chosen if r not in saved_tags.SAVE_RULES]
    if unknown:
        raise ValueError(f"save rules {unknown} are not among {list(saved_tags.SAVE_RULES)}")
    parts = (
        list(partitions)
        if partitions is not None
        else candidate_partitions(region_partitions(model, as_inputs(example_inputs), stages))
    )
    policies: list[tuple[float, SaveRule | None]] = [(b, None) for b in budgets]
    policies += [(1.0, cast(SaveRule, r)) for r in chosen]
    todo = [(p, b, r) for p in parts for b, r in policies]
    out: list[RegionProfile] = []
    for k, (part, budget, rule) in enumerate(todo):
        if progress is not None:
            policy = f"save rule {rule!r}" if rule is not None else f"activation budget {budget:g}"
            progress(k, len(todo), f"{part.label} at {policy}")
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
                compile_saves=rule,
            )
        except Exception as exc:  # the compiler's errors have no common type; the other candidates still stand
            error = first_line(exc)
        # as CompiledRegions decided while it measured them; a failed profile ran in none
        layout = prof is not None and regions_channels_last(model.get_submodule(n) for n in part.names)
        out.append(RegionProfile(part, budget, prof, error, time.perf_counter() - began, rule, layout))
    if progress is not None:
        progress(len(todo), len(todo), "done")
    return out

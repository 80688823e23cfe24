"""The search's part of spatial splitting (NOTE [ Spatial splitting ] in ``memtune.tuner._spatial``): which recompute
segments a plan may split, and the strip counts a descent tries for them.

# NOTE [ Searching splits ]
A split changes only a recompute segment's working memory and time, but it can make a recompute segment worth
taking where it would not be unsplit (a VGG block re-run whole needs as much memory as keeping it), so the local
descent (NOTE [ Local descent ] in ``memtune.tuner.search``) prices every move with its splits: a trial draws ``strips``
from ``STRIP_CHOICES`` with the search's seeded generator, and every recompute segment of every move whose stages
can all be split runs in that many strips (``with_strips``; at most the segment's output rows). As a sampler
parameter instead, ``strips`` cost multivariate TPE 1.2 s of CPU in a 150-trial search of a modeled VGG-16 that
took 12 s. After the descent, ``split_descent`` tries the neighbouring choices (half and twice the strips, or 2 for
an unsplit segment) on each such segment of the plan it ended at, one segment at a time, keeping a count where the
simulation scores better (a feasible plan first, then a faster one): at most two simulations per segment per trial.
For a profile that records no ``StageProfile.rows`` none of this runs. A move of the actions that changes a
segment drops that segment's key (``valid_splits``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from memtune.profiler import Profile
from memtune.tuner._spatial import SEARCH_STRIPS, parse_segment_key, segment_key
from memtune.tuner.plan import Action, Plan, segments
from memtune.tuner.simulator import SimResult, Simulator

__all__ = ["STRIP_CHOICES", "split_descent", "splittable", "splittable_segments", "valid_splits", "with_strips"]

#: a trial's ``strips`` (NOTE [ Searching splits ]); 1: unsplit
STRIP_CHOICES = (1, *SEARCH_STRIPS)


def splittable(profile: Profile) -> bool:
    """Whether any recompute segment of ``profile`` could be split: a chain whose profile records row maps."""
    return not profile.modules and profile.compile_budget is None and any(s.rows for s in profile.stages)


def splittable_segments(profile: Profile, actions: Sequence[Action]) -> list[tuple[int, int]]:
    """The recompute segments of ``actions`` whose every stage records a ``RowMap`` with at least two output rows
    at the segment's end."""
    stages = profile.stages
    out = []
    for i, j in segments(actions):
        last = stages[j].rows
        if last is not None and last.out_rows >= 2 and all(stages[k].rows is not None for k in range(i, j)):
            out.append((i, j))
    return out


def valid_splits(splits: Mapping[str, int], actions: Sequence[Action]) -> dict[str, int]:
    """``splits`` less the keys that are not recompute segments of ``actions``."""
    if not splits:
        return {}
    segs = set(segments(actions))
    return {k: v for k, v in splits.items() if parse_segment_key(k) in segs}


def with_strips(profile: Profile, plan: Plan, actions: Sequence[Action], strips: int) -> Plan:
    """``plan`` with every splittable recompute segment of ``actions`` in ``strips`` strips (at most its rows); its
    own ``spatial_splits`` are replaced; ``plan`` itself for ``strips`` 1 (NOTE [ Searching splits ])."""
    if strips <= 1:
        return plan
    splits = {}
    for i, j in splittable_segments(profile, actions):
        rows = profile.stages[j].rows
        assert rows is not None
        splits[segment_key(i, j)] = min(strips, rows.out_rows)
    return plan.model_copy(update={"spatial_splits": splits})


def split_descent(
    profile: Profile, sim: Simulator, plan: Plan, result: SimResult, score: Callable[[SimResult], Any]
) -> tuple[Plan, SimResult]:
    """``plan`` with the strip counts (NOTE [ Searching splits ]) that improve ``score`` of its simulation, and that
    simulation; ``plan`` and ``result`` as given when none does."""
    best, best_r, best_s = plan, result, score(result)
    for i, j in splittable_segments(profile, plan.actions):
        rows = profile.stages[j].rows
        assert rows is not None
        key = segment_key(i, j)
        at = STRIP_CHOICES.index(best.spatial_splits[key]) if best.spatial_splits.get(key) in STRIP_CHOICES else 0
        for strips in STRIP_CHOICES[max(0, at - 1) : at + 2]:  # its neighbours among the choices
            if strips > rows.out_rows or strips == best.spatial_splits.get(key, 1):
                continue
            splits = {k: v for k, v in best.spatial_splits.items() if k != key}
            if strips > 1:
                splits[key] = strips
            cand = best.model_copy(update={"spatial_splits": splits})
            r = sim.run_actions(cand.actions, cand)
            s = score(r)
            if s < best_s:
                best, best_r, best_s = cand, r, s
    return best, best_r

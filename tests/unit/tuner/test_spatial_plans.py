"""Spatial splitting's decision side (NOTE [ Spatial splitting ] in ``memtune.tuner._spatial``): halo arithmetic, the
plan's
``spatial_splits`` field, ``Plan.check``, the simulator's price and the search's strip counts. Torch-free."""

from __future__ import annotations

import pytest
from profiles import MiB, conv_profile

from memtune.profiler import Profile, RowMap
from memtune.profiler._spatial_rows import compose_rows
from memtune.tuner._spatial import parse_segment_key, strip_bounds, strip_cost, strip_windows
from memtune.tuner._spatial_search import split_descent, splittable_segments, valid_splits
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Action, Plan
from memtune.tuner.search import tune
from memtune.tuner.simulator import Simulator

CONV3 = RowMap(kernel=3, stride=1, padding=1, in_rows=32, out_rows=32)
POINT = RowMap(kernel=1, stride=1, padding=0, in_rows=32, out_rows=32)
POOL2 = RowMap(kernel=2, stride=2, padding=0, in_rows=32, out_rows=16)


def rows_profile() -> Profile:
    """The hand-made conv chain (``tests.unit.tuner.profiles``) with row maps on its first block: conv1 - relu1 -
    conv2 - relu2 - pool, 32 rows in, 16 out; the fully connected stages have none."""
    prof = conv_profile()
    maps = [CONV3, POINT, CONV3, POINT, POOL2]
    stages = tuple(
        st.model_copy(update={"rows": maps[k] if k < len(maps) else None}) for k, st in enumerate(prof.stages)
    )
    return prof.model_copy(update={"stages": stages})


# ---- halo arithmetic -------------------------------------------------------------------------------


def test_window_adds_padding_only_at_true_borders() -> None:
    assert CONV3.window(0, 8) == (0, 9, 1, 0)  # top strip: one row of padding above, one halo row below
    assert CONV3.window(8, 16) == (7, 17, 0, 0)  # interior: a halo row on each side, no padding
    assert CONV3.window(24, 32) == (23, 32, 0, 1)  # bottom strip: padding below
    assert POOL2.window(3, 7) == (6, 14, 0, 0)  # stride 2, kernel = stride: no halo
    dilated = RowMap(kernel=5, stride=1, padding=2, in_rows=9, out_rows=9)  # 3x3, dilation 2, padding 2
    assert dilated.window(0, 9) == (0, 9, 2, 2)
    strided = RowMap(kernel=3, stride=2, padding=1, in_rows=9, out_rows=5)  # odd height: last window pads below
    assert strided.window(4, 5) == (7, 9, 0, 1)


def test_strips_cover_the_output_once_and_read_overlapping_halos() -> None:
    assert strip_bounds(7, 3) == [(0, 2), (2, 4), (4, 7)]
    with pytest.raises(ValueError, match="cannot cut 3 rows into 4 strips"):
        strip_bounds(3, 4)
    wins = strip_windows([CONV3, POINT, CONV3, POINT, POOL2], 2)
    # the pool's halves (rows 0-7, 8-15) read conv rows 0-15 and 16-31; each conv reads one more row on each side
    assert [w[4] for w in wins] == [(0, 16, 0, 0), (16, 32, 0, 0)]
    assert [w[2] for w in wins] == [(0, 17, 1, 0), (15, 32, 0, 1)]
    assert [w[0] for w in wins] == [(0, 18, 1, 0), (14, 32, 0, 1)]


def test_strip_cost_counts_the_halo() -> None:
    # two strips of the pool's 16 rows: 16 rows of conv2/relu2 each, 17 of conv1/relu1 (conv2's halo), 18 inputs
    cost = strip_cost((CONV3, POINT, CONV3, POINT, POOL2), 2)
    assert cost.fraction == (17 / 32, 17 / 32, 16 / 32, 16 / 32, 8 / 16)
    assert cost.work == (34 / 32, 34 / 32, 1.0, 1.0, 1.0)
    assert cost.input_fraction == 18 / 32
    # eight strips of 2 pool rows: 4 rows of conv2 each, 6 rows of conv1 inside and 5 at the two borders
    eight = strip_cost((CONV3, POINT, CONV3, POINT, POOL2), 8)
    assert eight.fraction[:3] == (6 / 32, 6 / 32, 4 / 32)
    assert eight.work[:3] == ((6 * 6 + 5 * 2) / 32, (6 * 6 + 5 * 2) / 32, 1.0)


def test_compose_rows() -> None:
    both = compose_rows([CONV3, POOL2.model_copy(update={"in_rows": 32})])
    assert (both.kernel, both.stride, both.padding, both.in_rows, both.out_rows) == (4, 2, 1, 32, 16)
    assert both.window(0, 16) == (0, 32, 1, 1)


# ---- the plan field ------------------------------------------------------------------------------


def test_plan_validates_split_keys() -> None:
    plan = Plan.from_actions("rrrrrkkk", spatial_splits={"0-4": 4})
    assert Plan.model_validate_json(plan.model_dump_json()) == plan
    assert Plan.model_validate({"actions": ["keep"]}).spatial_splits == {}  # JSON without the field loads
    with pytest.raises(ValueError, match=r"key '1-4' is not a recompute segment of the plan \(its segments: 0-4\)"):
        Plan.from_actions("rrrrrkkk", spatial_splits={"1-4": 4})
    with pytest.raises(ValueError, match=r"'0-4': 65 strips is outside 2\.\.64"):
        Plan.from_actions("rrrrrkkk", spatial_splits={"0-4": 65})
    with pytest.raises(ValueError, match="key 'a-b' is not a segment"):
        Plan.from_actions("rrrrrkkk", spatial_splits={"a-b": 2})
    with pytest.raises(ValueError, match="eager chain plans only"):
        Plan.from_actions("rk", stages=("a", "b"), spatial_splits={"0-0": 2})
    assert parse_segment_key("3-17") == (3, 17)


def test_check_refuses_stages_without_rows() -> None:
    prof = rows_profile()
    Plan.from_actions("rrrrrkkk", spatial_splits={"0-4": 16}).check(prof)
    with pytest.raises(PlanError, match=r"stage 5 \(fc1, linear\) cannot run on strips of rows"):
        Plan.from_actions("kkkrrrkk", spatial_splits={"3-5": 2}).check(prof)
    with pytest.raises(PlanError, match="17 strips, but stage 4's output has 16 rows"):
        Plan.from_actions("rrrrrkkk", spatial_splits={"0-4": 17}).check(prof)
    with pytest.raises(PlanError, match=r"stage 0 \(conv1.0, conv2d\)"):
        Plan.from_actions("rrrrrkkk", spatial_splits={"0-4": 2}).check(conv_profile())


# ---- the simulator -------------------------------------------------------------------------------


def test_peak_falls_with_strips_and_time_grows_with_the_halo() -> None:
    prof = rows_profile()
    sim = Simulator(prof, merge=False)
    base = Plan.from_actions("rrrrrkkk")
    whole = sim.run(base)
    results = [sim.run(base.with_(spatial_splits={"0-4": s})) for s in (2, 4, 8, 16)]
    peaks = [whole.peak_bytes, *(r.peak_bytes for r in results)]
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[1] < peaks[0]
    steps = [whole.step_ms, *(r.step_ms for r in results)]
    assert steps == sorted(steps) and steps[-1] > steps[0]
    # the re-run's transient is one strip's: max(out[0..4]) = 64 MiB whole, 64 MiB * 17/32 in two strips
    tl = {label: live for _, live, label in sim.run(base.with_(spatial_splits={"0-4": 2}), timeline=True).timeline}
    tl_whole = {label: live for _, live, label in sim.run(base, timeline=True).timeline}
    assert tl["recompute 0..4"] < tl_whole["recompute 0..4"]


def test_merged_and_unmerged_tables_price_splits_alike() -> None:
    prof = rows_profile()
    plan = Plan.from_actions("krrrrkkk", spatial_splits={"1-4": 4})
    a, b = Simulator(prof).run(plan), Simulator(prof, merge=False).run(plan)
    assert (a.peak_bytes, a.step_ms) == (b.peak_bytes, pytest.approx(b.step_ms))


def test_timeline_blocks_pair_up_with_splits() -> None:
    """Every block a split segment allocates is freed again (NOTE [ Allocator placement ] replays them)."""
    prof = rows_profile()
    r = Simulator(prof).run(Plan.from_actions("krrrrkkk", spatial_splits={"1-4": 3}), timeline=True)
    live: dict[object, int] = {}
    for kind, key, size in r.blocks:
        if kind == "alloc":
            live[key] = live.get(key, 0) + size
        else:
            live[key] = live.get(key, 0) - size
    assert not {k: v for k, v in live.items() if v and isinstance(k, tuple) and k[0] in ("gstrip", "c", "r")}


# ---- the search ----------------------------------------------------------------------------------


def test_split_descent_and_valid_splits() -> None:
    prof = rows_profile()
    sim = Simulator(prof)
    actions = Plan.from_actions("rrrrrkkk").actions
    assert splittable_segments(prof, actions) == [(0, 4)]
    assert splittable_segments(prof, Plan.from_actions("kkkrrrkk").actions) == []
    plan = Plan.from_actions("rrrrrkkk")
    r = sim.run(plan)
    tight = r.peak_bytes - 1  # only a split fits
    split, rs = split_descent(prof, sim, plan, r, lambda res: (res.peak_bytes > tight, res.step_ms))
    assert split.spatial_splits and rs.peak_bytes <= tight
    Plan.model_validate(split.model_dump()).check(prof)
    moved = list(actions)
    moved[4] = Action.KEEP
    assert valid_splits({"0-4": 2}, moved) == {}
    assert valid_splits({"0-4": 2}, actions) == {"0-4": 2}


def test_tune_finds_split_plans_below_every_unsplit_peak() -> None:
    """Unsplit, the hand-made chain peaks at 239 MiB at least (its exact front); its first block re-run in two
    strips peaks at 191 MiB, in eight at 99 MiB."""
    prof = rows_profile()
    sim = Simulator(prof)
    assert tune(conv_profile(), 200 * MiB, trials=30, placement=False).best is None
    result = tune(prof, 200 * MiB, trials=30, placement=False)
    assert result.best is not None
    best = Plan.model_validate(result.best.plan.model_dump())
    best.check(prof)
    assert best.spatial_splits, best
    assert sim.run(best).peak_bytes == result.best.peak_bytes

"""``memtune.tuner.compiled_bound`` (NOTE [ Compiled lower bound ]): no compiled plan that fits a budget, the whole
model compiled at a measured point or a plan over compiled regions, is faster than the bound; the bound falls as the
budget grows; there is none without compiled candidates; ``print(tuned)`` shows it beside the eager bound.

Compiler points are written by hand, as in ``tests/unit/runtime/test_whole_compile.py``; a compiled-region profile is a
hand-made chain marked compiled (its stages the regions), as ``profile_module(..., compile_budget=b)`` makes on a GPU.
"""

from __future__ import annotations

import itertools
import math
import random

import optuna
import pytest
from chains import MiB, linear_chain
from profiles import conv_profile

from memtune.profiler._profile import CompilerPoint, HostPrices, Profile
from memtune.profiler.region_profile import RegionProfile
from memtune.profiler.region_tree import RegionPartition
from memtune.tuner._search_results import compiler_candidates
from memtune.tuner.compiled_bound import compiled_lower_bound, region_floor, whole_floor
from memtune.tuner.measure.compiler_points import with_compiler_points
from memtune.tuner.pipeline import tune_profiles
from memtune.tuner.plan import Plan
from memtune.tuner.search import tune
from memtune.tuner.simulator import Simulator, simulate
from memtune.tuner.stage_choices import stage_actions
from memtune.tuner.tuned import compiled_bound_words


def _points(prof: Profile, *shares: tuple[float, float, float]) -> Profile:
    """``prof`` with compiler points (budget, step as a share of the unplanned step, peak as a share of its peak)."""
    base = simulate(prof, Plan.uniform(prof.n_stages))
    pts = [CompilerPoint(activation_budget=b, step_ms=base.step_ms * t, peak_bytes=int(base.peak_bytes * m))
           for b, t, m in shares]  # fmt: skip
    return with_compiler_points(prof, pts)


def _compiled(prof: Profile, budget: float) -> Profile:
    """``prof`` as a profile of compiled regions, each stage a region compiled under ``budget``; a little faster than
    eager, as a compiled region is."""
    stages = tuple(s.model_copy(update={"forward_ms": 0.9 * s.forward_ms}) for s in prof.stages)
    return prof.model_copy(update={"compile_budget": budget, "stages": stages, "model": f"{prof.model} compiled"})


def _hosted(prof: Profile, keep_share: float) -> Profile:
    """``prof`` with host prices: a kept step issued in ``keep_share`` of its simulated GPU step, each offloaded or
    recomputed stage adding 5% of it."""
    gpu = simulate(prof, Plan.uniform(prof.n_stages)).step_ms
    extra = (0.05 * gpu,) * prof.n_stages
    host = HostPrices(keep_ms=keep_share * gpu, recompute_ms=extra, offload_ms=extra, steps=5)
    return prof.model_copy(update={"host": host})


def _plans(prof: Profile, rng: random.Random, count: int) -> list[Plan]:
    """Every action per stage where that is few, else ``count`` random ones, under each sync mode."""
    acts = stage_actions(prof)
    if math.prod(len(a) for a in acts) <= 300:
        actions = [list(a) for a in itertools.product(*acts)]
    else:
        actions = [[a[0] if rng.random() < 0.4 else rng.choice(a) for a in acts] for _ in range(count)]
    return [Plan(actions=a, sync=s, prefetch_lookahead=rng.randint(1, 3)) for a in actions for s in ("layer", "inline")]


def test_the_whole_model_floor_is_below_every_measured_point_that_fits() -> None:
    # (peak bytes, step ms): 100 -> 10, 60 -> 11, 40 -> 14 (slopes 1/40 then 3/20 ms per byte), 90 -> 12 above them
    pts = [(100.0, 10.0), (60.0, 11.0), (40.0, 14.0), (90.0, 12.0)]
    assert whole_floor(pts, 200).step_ms == 10.0  # everything fits: the fastest step
    assert whole_floor(pts, 60).step_ms == pytest.approx(11.0)
    assert whole_floor(pts, 80).step_ms == pytest.approx(10.5)
    assert whole_floor(pts, 30).step_ms == pytest.approx(15.5)  # below the lowest point: the last slope goes on
    rng = random.Random(3)
    for _ in range(200):  # any points, convex or not: every one that fits is at least the floor
        pts = [(rng.uniform(10, 100), rng.uniform(5, 20)) for _ in range(rng.randint(1, 5))]
        last = math.inf
        for budget in range(5, 110, 5):
            floor = whole_floor(pts, budget).step_ms
            assert all(t >= floor - 1e-9 for m, t in pts if m <= budget), (pts, budget)
            assert floor <= last + 1e-9  # falls as the budget grows
            last = floor


@pytest.mark.parametrize(
    "prof",
    [
        _compiled(linear_chain(5, saved_mib=64), 1.0),
        _compiled(conv_profile(2).without_conv_algos(), 0.5),
        _hosted(_compiled(linear_chain(5, saved_mib=64), 1.0), 1.2),
    ],
    ids=["chain", "convs", "host-bound chain"],
)
def test_no_plan_of_compiled_regions_that_fits_is_faster_than_its_floor(prof: Profile) -> None:
    sim = Simulator(prof)
    peak = sim.run(Plan.uniform(prof.n_stages)).peak_bytes
    runs = [sim.run(p) for p in _plans(prof, random.Random(5), 400)]
    fits, last = 0, math.inf
    for share in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2):
        budget = int(share * peak)
        floor = region_floor(sim, budget)
        assert floor.step_ms <= last + 1e-9
        last = floor.step_ms
        for r in runs:
            if r.peak_bytes <= budget:
                assert r.step_ms >= floor.step_ms - 1e-6, (share, r.step_ms, floor)
                fits += 1
        assert floor.step_ms >= max(floor.compute_ms, floor.link_ms, floor.host_ms)
    assert fits > 100  # plans that fit were checked at several budgets
    assert region_floor(sim, 2 * peak).step_ms == pytest.approx(sim.run(Plan.uniform(prof.n_stages)).step_ms)
    assert math.isinf(region_floor(sim, sim.run(Plan.uniform(prof.n_stages)).base_bytes // 4).step_ms)


def test_the_search_on_compiled_regions_finds_nothing_faster_than_the_bound() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    eager = _points(linear_chain(6, saved_mib=64), (1.0, 0.8, 0.9), (0.5, 0.85, 0.7), (0.0, 0.95, 0.6))
    regions = _compiled(linear_chain(6, saved_mib=64), 1.0)
    peak = simulate(regions, Plan.uniform(regions.n_stages)).peak_bytes
    for share in (0.5, 0.7, 0.9):
        budget = int(share * peak)
        bound = compiled_lower_bound([eager, regions], budget)
        assert bound is not None and len(bound.floors) == 2
        found = tune(regions, budget, trials=30, seed=0, headroom=0.0)
        if found.best is not None:
            assert found.best.step_ms >= bound.step_ms - 1e-6
        for c in compiler_candidates(eager, budget, budget):
            if c.feasible:
                assert c.step_ms >= bound.step_ms - 1e-9


def test_the_bound_falls_as_the_budget_grows_and_is_absent_without_compiled_candidates() -> None:
    eager = _points(linear_chain(6, saved_mib=64), (1.0, 0.8, 0.9), (0.25, 0.9, 0.6))
    regions = [_compiled(linear_chain(6, saved_mib=64), b) for b in (1.0, 0.5)]
    peak = simulate(eager, Plan.uniform(eager.n_stages)).peak_bytes
    steps = [compiled_lower_bound([eager, *regions], int(s * peak)) for s in (0.1, 0.3, 0.5, 0.7, 0.9, 1.1)]
    ms = [b.step_ms for b in steps if b is not None]
    assert len(ms) == 6 and ms == sorted(ms, reverse=True)
    roomy = steps[-1]
    assert roomy is not None and roomy.step_ms == roomy.unconstrained_ms and roomy.ratio == 1.0
    assert compiled_lower_bound([linear_chain(6)], peak) is None  # eager, no compiler points
    assert compiled_lower_bound([regions[0]], peak) is not None  # a compiled-region profile alone
    only_regions = compiled_lower_bound([regions[0]], 1 * MiB)
    assert only_regions is not None and math.isinf(only_regions.step_ms)  # nothing fits 1 MiB
    with pytest.raises(ValueError, match="budget must be positive"):
        compiled_lower_bound([eager], 0)


def test_print_tuned_shows_the_compiled_bound_beside_the_eager_one() -> None:
    eager = _points(linear_chain(6, saved_mib=64), (1.0, 0.8, 0.9), (0.5, 0.85, 0.7))
    regions = _compiled(linear_chain(6, saved_mib=64), 1.0)
    budget = int(0.6 * simulate(eager, Plan.uniform(eager.n_stages)).peak_bytes)
    run = RegionProfile(RegionPartition(1, tuple(s.name for s in regions.stages)), 1.0, regions, None, 0.1)
    tuned = tune_profiles(eager, budget, regions=[run], trials=20, progress=False)
    bound = tuned.compiled_bound
    assert bound is not None and tuned.bound is not None
    text = str(tuned)
    assert "no plan of offload, recompute and algorithm choice can step faster than" in text
    line = next(x for x in text.splitlines() if x.startswith("no compiled plan"))
    assert f"can step faster than {bound.step_ms:.2f} ms ({bound.ratio:.2f}x the compiled unconstrained step)" in line
    for t in tuned.regions:
        assert t.best_ms is None or t.best_ms >= bound.step_ms - 1e-6
    bare = tune_profiles(linear_chain(6, saved_mib=64), budget, trials=10, progress=False)
    assert bare.compiled_bound is None and "no compiled plan" not in str(bare)


def test_every_served_plan_of_the_committed_region_benchmark_is_predicted_above_its_lower_bound() -> None:
    """The benchmark's table puts each served plan beside the least step any plan may take at its budget
    (``benchmarks.compiled_regions.lower_bounds``, from the committed H100 profiles): every predicted step is at least
    that bound, as NOTE [ Compiled lower bound ] and NOTE [ Budget bound ] promise, and a plan that fits has one."""
    import json
    from pathlib import Path

    from benchmarks.compiled_regions import lower_bounds

    folder = Path(__file__).parents[3] / "benchmarks/results/h100/compiled-regions"
    seen = 0
    for name in ("resnet50", "efficientnet_b0"):
        row = json.loads((folder / f"{name}.json").read_text())
        bounds = lower_bounds(folder, row)
        for p in row["plans"]:
            if "predicted_step_ms" in p:
                assert bounds[p["fraction"]] <= p["predicted_step_ms"] * (1 + 1e-9), (name, p["fraction"], bounds)
                seen += 1
    assert seen >= 4


def test_a_host_that_issues_a_kept_step_slower_than_the_gpu_runs_it_sets_the_floor() -> None:
    gpu_bound = _compiled(linear_chain(5, saved_mib=64), 1.0)
    hosted = _hosted(gpu_bound, 1.5)
    kept = simulate(gpu_bound, Plan.uniform(gpu_bound.n_stages))
    assert hosted.host is not None
    for share in (0.6, 0.9, 1.2):
        budget = int(share * kept.peak_bytes)
        alone, floor = region_floor(Simulator(gpu_bound), budget), region_floor(Simulator(hosted), budget)
        assert (alone.host_ms, floor.host_ms) == (0.0, pytest.approx(hosted.host.keep_ms))
        assert floor.step_ms == pytest.approx(max(alone.step_ms, hosted.host.keep_ms))
        assert floor.unconstrained_ms == pytest.approx(hosted.host.keep_ms)  # the kept step, as simulated
    roomy = compiled_lower_bound([hosted], 2 * kept.peak_bytes)
    assert roomy is not None and roomy.step_ms == pytest.approx(1.5 * kept.step_ms)
    words = compiled_bound_words(roomy, "2 GiB")
    assert (
        "the host sets it: it issues a step of the 5 regions compiled at activation budget 1 in "
        f"{1.5 * kept.step_ms:.2f} ms" in words
    )
    assert "the host sets it" not in compiled_bound_words(
        compiled_lower_bound([gpu_bound], 2 * kept.peak_bytes) or roomy, "2 GiB"
    )

"""Plans that compile the whole model (NOTE [ Whole-model compile ] in ``memtune.tuner._whole``): priced by the
profile's measured compiler points, chosen by ``tune`` where one fits and beats the searched plans, and run by
``planned`` as ``torch.compile`` of the whole model, bitwise the compiler's own run at that budget.

The compiler points here are written by hand (on a GPU ``memtune.tuner.measure.compiler_points.measure_compiler_points``
measures them; ``tests/gpu/test_compiled_gpu.py`` does); what is tested is how they are priced and chosen."""

from __future__ import annotations

import pytest
import torch

from memtune.profiler import zoo
from memtune.profiler._profile import CompilerPoint, Profile
from memtune.profiler.measure import model_input
from memtune.profiler.modeled import modeled_profile
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.measure._peers import compiled_model
from memtune.tuner.measure.bench import BenchRow
from memtune.tuner.measure.compiler_points import compiler_points, with_compiler_points
from memtune.tuner.plan import Plan
from memtune.tuner.runtime import check_equivalence, planned, reference_step
from memtune.tuner.runtime._planned import CompiledWhole
from memtune.tuner.search import tune
from memtune.tuner.simulator import simulate

torch.set_num_threads(1)

GPT = {"layers": 2, "width": 32, "heads": 4, "seq_len": 8, "vocab": 64}


@pytest.fixture(scope="module")
def resnet() -> Profile:
    return modeled_profile(zoo.build("resnet50"), 64, "float32", "h100")


def _points(prof: Profile, *shares: tuple[float, float, float]) -> Profile:
    """``prof`` with compiler points (budget, step as a share of the unplanned step, peak as a share of its peak)."""
    base = simulate(prof, Plan.uniform(prof.n_stages))
    pts = [CompilerPoint(activation_budget=b, step_ms=base.step_ms * t, peak_bytes=int(base.peak_bytes * m))
           for b, t, m in shares]  # fmt: skip
    return with_compiler_points(prof, pts)


def test_whole_compile_plan_rules(resnet: Profile) -> None:
    with pytest.raises(ValueError, match=r"stage 1 is 'offload': a plan that compiles the whole model keeps"):
        Plan.from_actions("kok", whole_compile=0.5)
    with pytest.raises(ValueError, match="whole_compile excludes compile_budget"):
        Plan.from_actions("kk", whole_compile=0.5, compile_budget=0.5)
    with pytest.raises(ValueError, match="less than or equal to 1"):
        Plan.from_actions("kk", whole_compile=2.0)
    plan = Plan.uniform(resnet.n_stages, whole_compile=0.5)
    assert plan.compact() == "compiled whole, budget 0.5"
    with pytest.raises(PlanError, match=r"budget 0.5, which the profile has not measured \(its compiler points: none"):
        simulate(resnet, plan)
    with pytest.raises(PlanError, match=r"its compiler points: 0, 1\)"):
        simulate(_points(resnet, (0.0, 0.9, 1.0), (1.0, 0.6, 1.0)), plan)


def test_whole_compile_plans_are_priced_by_their_measured_point(resnet: Profile) -> None:
    prof = _points(resnet, (1.0, 0.6, 1.0), (0.5, 0.7, 0.55))
    r = simulate(prof, Plan.uniform(prof.n_stages, whole_compile=0.5))
    point = next(p for p in prof.compiler_points if p.activation_budget == 0.5)
    assert (r.step_ms, r.peak_bytes, r.d2h_bytes, r.stall_ms) == (point.step_ms, point.peak_bytes, 0, 0.0)
    again = Profile.from_json(prof.to_json())  # kept in the profile's JSON, sorted by budget
    assert [p.activation_budget for p in again.compiler_points] == [0.5, 1.0]
    assert again.compiler_points == prof.compiler_points


def test_a_point_is_priced_without_its_update_as_the_simulator_prices_the_others(resnet: Profile) -> None:
    """NOTE [ The optimizer's update ]: the simulator's step is the forward and the backward, a compiler point a whole
    training step; a plan that compiles the whole model is priced at the point's step less its timed update, in the
    simulator, among the search's candidates and in the region partitions' ratio to the whole model compiled."""
    from memtune.tuner.region_plans import _whole_ms
    from memtune.tuner.search import compiler_candidates

    point = CompilerPoint(activation_budget=0.5, step_ms=10.0, peak_bytes=4 << 30, update_ms=2.5)
    prof = with_compiler_points(resnet, [point])
    assert point.forward_backward_ms == 7.5
    assert simulate(prof, Plan.uniform(prof.n_stages, whole_compile=0.5)).step_ms == 7.5
    (candidate,) = compiler_candidates(prof, 1 << 40, 1 << 40, "sgd")
    assert candidate.step_ms == 7.5
    assert _whole_ms(prof.compiler_points, 0.5) == 7.5
    assert Profile.from_json(prof.to_json()).compiler_points[0].update_ms == 2.5  # kept in the profile's JSON
    assert point.model_copy(update={"update_ms": None}).forward_backward_ms == 10.0  # not timed: the whole step


def test_the_update_timer_times_an_optimizers_step_by_its_hooks() -> None:
    from memtune.tuner.measure.step_timing import update_timer

    layer = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.0)
    with update_timer(opt, cuda=False) as timer:
        for _ in range(3):
            layer(torch.randn(8, 64)).sum().backward()
            opt.step()
    assert len(timer.spans) == 3 and (timer.median_ms(2) or 0) > 0
    opt.step()  # the hooks are gone after the block
    assert len(timer.spans) == 3
    with update_timer(None, cuda=False) as nothing:
        pass
    assert nothing.median_ms(5) is None


@pytest.mark.slow
def test_tune_serves_the_compiler_where_it_fits_and_is_faster(resnet: Profile) -> None:
    base = simulate(resnet, Plan.uniform(resnet.n_stages))
    prof = _points(resnet, (1.0, 0.6, 1.0), (0.5, 0.7, 0.55), (0.0, 0.65, 1.0))
    # at 60% of the peak only budget 0.5 fits (0.55 of the peak), and it is faster than any eager plan
    at60 = tune(prof, int(0.6 * base.peak_bytes), trials=30, seed=0)
    assert at60.best is not None and at60.best.plan.whole_compile == 0.5
    assert at60.best.source == "measured" and at60.best.step_ms == pytest.approx(0.7 * base.step_ms)
    assert any(c.plan.whole_compile == 0.5 for c in at60.pareto)  # the measured points join the Pareto line
    # unconstrained, budget 1 is the fastest point
    top = tune(prof, 2 * base.peak_bytes, trials=10, seed=0)
    assert top.best is not None and top.best.plan.whole_compile == 1.0
    # below the compiler's lowest peak the searched plans train
    low = tune(prof, int(0.45 * base.peak_bytes), trials=30, seed=0)
    assert low.best is not None and low.best.plan.whole_compile is None
    assert low.best.peak_bytes <= int(0.45 * base.peak_bytes)
    # a compiler point slower than the best searched plan is not served
    slow = _points(resnet, (0.5, 5.0, 0.55))
    at60_slow = tune(slow, int(0.6 * base.peak_bytes), trials=30, seed=0)
    assert at60_slow.best is not None and at60_slow.best.plan.whole_compile is None


def test_a_point_fits_by_what_the_cap_sees() -> None:
    """Measured reserved bytes decide under the cap; without them the allocated peak must leave the headroom."""
    point = CompilerPoint(activation_budget=0.5, step_ms=1.0, peak_bytes=90, reserved_bytes=99)
    assert point.fits(cap_bytes=100, search_budget_bytes=90) and not point.fits(98, 90)
    bare = CompilerPoint(activation_budget=0.5, step_ms=1.0, peak_bytes=95)
    assert not bare.fits(100, 90) and bare.fits(100, 95)


def test_compiler_points_from_bench_rows(resnet: Profile) -> None:
    rows = [
        BenchRow("unconstrained", "unconstrained", 10.0, 100, 1.0, True),
        BenchRow("torch.compile budget 0.5", "compiler", 8.0, 60, 1.0, True, compile_budget=0.5, update_ms=1.5),
        BenchRow("torch.compile budget 0", "compiler", None, None, None, False, compile_budget=0.0, error="oom"),
    ]
    assert compiler_points(rows) == (CompilerPoint(activation_budget=0.5, step_ms=8.0, peak_bytes=60, update_ms=1.5),)
    prof = with_compiler_points(resnet, compiler_points(rows))
    newer = with_compiler_points(prof, [CompilerPoint(activation_budget=0.5, step_ms=7.0, peak_bytes=61)])
    assert [(p.activation_budget, p.step_ms) for p in newer.compiler_points] == [(0.5, 7.0)]


def test_a_whole_compile_plan_runs_the_compiler_bitwise() -> None:
    """``planned`` with a whole-compile plan is ``torch.compile`` of the model at that budget: loss, gradients and
    buffers bitwise those of the compiler's own run (the peer), and eager's within tolerance."""
    torch.manual_seed(0)
    chain = zoo.build("gpt", GPT)
    x = model_input(chain, 2)
    plan = Plan.uniform(len(chain), whole_compile=0.0)
    ref = reference_step(chain, x, run=compiled_model(chain.as_sequential(), 0.0))
    eq, pm = check_equivalence(chain, plan, x, steps=2, reference=ref)
    assert isinstance(pm, CompiledWhole)
    assert (eq.loss, eq.grad, eq.buffer) == (0.0, 0.0, 0.0), eq
    eager, _ = check_equivalence(chain, plan, x, steps=1, reference=reference_step(chain, x))
    assert eager.ok(1e-4), eager
    with pytest.raises(PlanError, match="has 3 actions but the model has"):
        planned(chain, Plan.uniform(3, whole_compile=0.0))


def test_a_point_measured_with_sgd_serves_an_adam_plan_one_parameter_copy_higher(resnet: Profile) -> None:
    """NOTE [ Whole-model compile ]: a compiler point keeps the optimizer of its measured steps; priced for another
    optimizer its peaks move by the change in optimizer state, as the simulator counts it (AdamW holds two copies of
    the parameters, SGD with momentum one), so a point that fits under SGD may not fit an Adam job."""
    from memtune.tuner.search import compiler_candidates

    point = CompilerPoint(activation_budget=0.5, step_ms=10.0, peak_bytes=4 << 30, reserved_bytes=5 << 30)
    prof = with_compiler_points(resnet, [point])
    cap = (5 << 30) + resnet.param_bytes // 2
    (sgd,) = compiler_candidates(prof, cap, cap, "sgd")
    (adam,) = compiler_candidates(prof, cap, cap, "adam")
    (none,) = compiler_candidates(prof, cap, cap, "none")
    assert sgd.peak_bytes == 4 << 30 and sgd.feasible
    assert adam.peak_bytes == (4 << 30) + resnet.param_bytes and not adam.feasible
    assert none.peak_bytes == (4 << 30) - resnet.param_bytes and none.feasible
    adam_point = point.model_copy(update={"optimizer": "adam"})
    (same,) = compiler_candidates(with_compiler_points(resnet, [adam_point]), cap, cap, "adam")
    assert same.peak_bytes == 4 << 30

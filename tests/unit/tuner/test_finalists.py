"""The finalists a tune measures before it serves a plan, and the choice among them (NOTE [ Measured finalists ] in
``memtune.tuner.finalists``). Measuring them needs CUDA (``tests/gpu/test_regions_gpu.py``); here the searches are
of a modeled ResNet-50 with compiler points written by hand, and the measured steps are given."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from memtune.profiler import zoo
from memtune.profiler._profile import CompilerPoint, Profile
from memtune.profiler.modeled import modeled_profile
from memtune.tuner.finalists import SPREAD, Finalist, fallback_pool, fallbacks, fastest_measured, finalists, served
from memtune.tuner.measure.compiler_points import with_compiler_points
from memtune.tuner.plan import Plan
from memtune.tuner.search import Candidate, TuneResult, tune
from memtune.tuner.simulator import simulate
from memtune.tuner.tuned import Tuned


@pytest.fixture(scope="module")
def resnet() -> Profile:
    return modeled_profile(zoo.build("resnet50"), 64, "float32", "h100")


def _searched(prof: Profile, *points: tuple[float, float, float], share: float = 0.7) -> TuneResult:
    """The search of ``prof`` at ``share`` of its unplanned peak, with compiler points (budget, step as a share of the
    unplanned step, peak as a share of the unplanned peak)."""
    base = simulate(prof, Plan.uniform(prof.n_stages))
    pts = [CompilerPoint(activation_budget=b, step_ms=base.step_ms * t, peak_bytes=int(base.peak_bytes * m))
           for b, t, m in points]  # fmt: skip
    return tune(with_compiler_points(prof, pts), int(base.peak_bytes * share), trials=20, seed=0)


def test_a_search_keeps_its_compiler_points_as_candidates_and_the_fitting_ones_are_finalists(resnet: Profile) -> None:
    # the point at 0.5 fits and is the fastest plan; the point at 1 does not fit 70% of the peak
    result = _searched(resnet, (1.0, 0.5, 1.0), (0.5, 0.6, 0.5))
    assert [c.name for c in result.compiled] == ["compiled whole 0.5", "compiled whole 1"]
    assert [c.feasible for c in result.compiled] == [True, False]
    chosen = finalists([result])
    assert result.best is not None and result.best.plan.whole_compile == 0.5
    assert [name for name, _, _ in chosen] == ["compiled whole 0.5"]  # the best is that point: one plan, not two
    assert chosen[0][1] is result


def test_finalists_are_within_the_spread_of_the_fastest_prediction_and_at_most_the_limit(resnet: Profile) -> None:
    eager = _searched(resnet)  # no compiler point: the searched plan alone
    assert eager.best is not None
    fast = dataclasses.replace(eager, best=dataclasses.replace(eager.best, step_ms=eager.best.step_ms / SPREAD * 0.99))
    # another search whose best is the same plan predicted faster: one finalist, the faster prediction
    assert [c.step_ms for _, _, c in finalists([eager, fast])] == [fast.best.step_ms]  # type: ignore[union-attr]
    other = _searched(resnet, share=0.5)  # 9% slower than the search at 70% of the peak: within the spread
    assert other.best is not None and other.best.plan != eager.best.plan
    assert eager.best.step_ms < other.best.step_ms <= eager.best.step_ms * SPREAD
    assert [r for _, r, _ in finalists([other, eager])] == [eager, other]  # fastest prediction first
    assert [r for _, r, _ in finalists([eager, other], limit=1)] == [eager]
    assert [r for _, r, _ in finalists([eager, other], spread=1.05)] == [eager]
    with pytest.raises(ValueError, match="limit >= 1 and spread >= 1"):
        finalists([eager], limit=0)


def test_the_fastest_fitting_compiler_point_is_always_a_finalist(resnet: Profile) -> None:
    # the point is predicted far slower than the searched plan (beyond the spread), yet measured it may win
    result = _searched(resnet, (0.5, 3.0, 0.5))
    assert result.best is not None and result.best.plan.whole_compile is None
    (point,) = result.compiled
    assert point.feasible and point.step_ms > result.best.step_ms * SPREAD
    chosen = finalists([result], limit=1)
    assert [c.plan.whole_compile for _, _, c in chosen] == [0.5]  # it takes the last place
    chosen = finalists([result], limit=2)
    assert [c.plan.whole_compile for _, _, c in chosen] == [None, 0.5]
    assert chosen[0][0] == f"{result.best.name} (eager stages)"


def test_the_served_finalist_becomes_the_best_of_its_search(resnet: Profile) -> None:
    result = _searched(resnet, (0.5, 3.0, 0.5))
    chosen = finalists([result], limit=2)
    assert served(chosen[0]) is result  # the search's own best: served as it is
    point = served(chosen[1])
    assert point.best is chosen[1][2] and point.best.plan.whole_compile == 0.5 and point.no_choice is None
    assert Tuned(point, None).plan == chosen[1][2].plan


def test_the_fastest_measured_finalist_that_ran_is_served() -> None:
    ran = [
        Finalist("a", 10.0, 1 << 30, step_ms=14.0, reserved_bytes=1 << 30),
        Finalist("b", 11.0, 1 << 30, error="PlanOutOfMemoryError: ..."),
        Finalist("c", 12.0, 1 << 29, step_ms=12.5, reserved_bytes=1 << 29),
    ]
    assert fastest_measured(ran) == 2
    assert fastest_measured(ran[:2]) == 0
    assert fastest_measured(ran[1:2]) is None
    tie = [dataclasses.replace(ran[0], step_ms=12.5), ran[2]]
    assert fastest_measured(tie) == 0  # a tie goes to the faster prediction
    assert "did not run (PlanOutOfMemoryError" in ran[1].line()
    won = dataclasses.replace(ran[2], served=True).line()
    assert won.endswith("measured 12.50 ms, 0.50 GiB reserved  <- served")


def test_the_printout_lists_the_finalists_measured(resnet: Profile) -> None:
    result = _searched(resnet, (0.5, 3.0, 0.5))
    ran = (Finalist("compiled whole 0.5", 30.0, 1 << 30, step_ms=29.0, reserved_bytes=1 << 30, served=True),)
    text = str(Tuned(result, None, measured=ran))
    assert "measured before serving (training steps under the budget's cap" in text
    assert "compiled whole 0.5: predicted 30.00 ms at 1.00 GiB, measured 29.00 ms" in text
    assert "measured before serving" not in str(Tuned(result, None))


def test_a_warning_names_every_plan_that_did_not_run_when_none_did() -> None:
    from memtune.tuner.finalists import none_ran

    failed = (Finalist("a", 10.0, 1, error="PlanOutOfMemoryError: stage 3"), Finalist("b", 11.0, 1, error="X: y"))
    note = none_ran(failed)
    assert note is not None
    assert note.startswith("no plan ran under the budget (a: PlanOutOfMemoryError: stage 3; b: X: y); none is served")
    assert "finalists=0" in note
    assert none_ran(()) is None
    assert none_ran((dataclasses.replace(failed[0], error=None, step_ms=1.0, reserved_bytes=1, served=True),)) is None


def _measured(chosen: list[tuple[str, TuneResult, Candidate]], *, short: bool) -> list[tuple[Candidate, Finalist]]:
    """Each of ``chosen`` with a finalist that did not run: out of memory where ``short``, else another error."""
    return [(c, Finalist(name, c.step_ms, c.peak_bytes, error="E: e", out_of_memory=short)) for name, _, c in chosen]


def test_fallbacks_are_pareto_plans_below_every_finalist_that_ran_out_of_memory(resnet: Profile) -> None:
    result = _searched(resnet, share=0.5)
    chosen = finalists([result])
    assert [c for _, _, c in chosen] == [result.best] and result.best is not None
    fitting = [c for c in result.pareto if c.feasible and c.plan != result.best.plan]
    assert len(fitting) >= 2, "the modeled search should leave more than one fitting plan on its front"
    # out of memory: only plans predicted to peak below the finalist's peak, fastest prediction first
    extra = fallbacks(fallback_pool([result]), _measured(chosen, short=True), limit=10)
    below = sorted((c for c in fitting if c.peak_bytes < result.best.peak_bytes), key=lambda c: c.step_ms)
    assert [c.plan for _, _, c in extra] == [c.plan for c in below]
    assert all(r is result for _, r, _ in extra)
    assert [c.step_ms for _, _, c in extra] == sorted(c.step_ms for _, _, c in extra)
    assert fallbacks(fallback_pool([result]), _measured(chosen, short=True), limit=1) == extra[:1]
    # another failure (a compiler error): every fitting plan of the front not measured
    other = fallbacks(fallback_pool([result]), _measured(chosen, short=False), limit=10)
    assert sorted(c.plan.model_dump_json() for _, _, c in other) == sorted(c.plan.model_dump_json() for c in fitting)
    with pytest.raises(ValueError, match="limit >= 1"):
        fallbacks(fallback_pool([result]), [], limit=0)


def _stand_in(outcomes: dict[str, float | None]):  # type: ignore[no-untyped-def]
    """A ``run_finalist`` that gives each plan, by its predicted step rounded to a ms, the step in ``outcomes`` (None:
    out of memory under the cap); the plans run, in order, are appended to its ``ran``."""

    def run(model, inputs, name, candidate, budget, loss_fn, **_):  # type: ignore[no-untyped-def]
        run.ran.append(candidate.plan)  # type: ignore[attr-defined]
        step = outcomes.get(name)
        head = Finalist(name, candidate.step_ms, candidate.peak_bytes)
        if step is None:
            return dataclasses.replace(head, error="PlanOutOfMemoryError: stage 6", out_of_memory=True)
        return dataclasses.replace(head, step_ms=step, reserved_bytes=candidate.peak_bytes, peak_bytes=1)

    run.ran = []  # type: ignore[attr-defined]
    return run


def test_where_no_finalist_runs_fallbacks_run_in_turn_and_else_no_plan_is_served(
    resnet: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memtune
    from memtune.tuner import PlanError
    from memtune.tuner.measure import finalists as measuring
    from memtune.tuner.measure.tune_module import _measured as measured_in_tune

    result = _searched(resnet, share=0.5)
    tuned = Tuned(result, None, searched=(result,))
    extra = fallbacks(fallback_pool([result]), _measured(finalists([result]), short=True), limit=3)
    assert len(extra) >= 2
    model = torch.nn.Linear(2, 2)
    names = [name for name, _, _ in (*finalists([result]), *extra)]
    # the finalist runs out of memory, the first fallback too, the second runs: it is served and the third not tried
    run = _stand_in({names[2]: 50.0})
    monkeypatch.setattr(measuring, "run_finalist", run)
    out = measuring.measure_finalists(model, None, tuned, lambda y: y, optimizer="sgd", output_held=True)
    assert [f.name for f in out.measured] == names[:3]
    assert [f.served for f in out.measured] == [False, False, True]
    assert out.result.best is extra[1][2] and out.plan == extra[1][2].plan
    # nothing runs: every fallback tried, none served, and planning it is refused naming each
    run = _stand_in({})
    monkeypatch.setattr(measuring, "run_finalist", run)
    with pytest.warns(UserWarning, match="no plan ran under the budget"):
        none = measured_in_tune(model, None, tuned, None, "sgd", True, 3, False)
    assert len(none.measured) == 1 + len(extra) and none.plan is None and none.result.best is None
    with pytest.raises(PlanError, match=r"no plan ran within .* on this GPU: .*did not run \(PlanOutOfMemoryError"):
        memtune.planned(model, none)
    text = str(none)
    assert "no plan ran within" in text and "so none is served" in text and "no plan fits" not in text
    assert text.count("did not run (PlanOutOfMemoryError: stage 6)") == len(none.measured)

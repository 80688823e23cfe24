"""Profiles of compiled regions (NOTE [ Profiles of compiled regions ] in ``memtune.profiler.module_profile``) and
``memtune.tune(..., compile=True)`` choosing among eager, whole-compiled and compiled-region plans (NOTE [ Compiled-
region candidates ] in ``memtune.tuner.region_plans``), on the CPU with CPU inductor.

The CPU profile is modeled for a GPU (its times are the roofline's of the eager operations), so these tests check what
a compiled-region profile and plan mean, and their memory, not which plan is faster on a GPU.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from memtune.profiler._profile import Profile
from memtune.profiler.module_profile import profile_module
from memtune.profiler.region_profile import profile_regions
from memtune.profiler.region_tree import CompiledRegions, RegionPartition
from memtune.tuner.plan import Action, Plan
from memtune.tuner.region_plans import fastest
from memtune.tuner.runtime import planned
from memtune.tuner.search import tune
from memtune.tuner.simulator import simulate
from tests.unit.modules.region_models import TinyResNet, square, taken_grads

torch.set_num_threads(1)

LAYERS = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "avgpool", "fc")


def _batch() -> torch.Tensor:
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))


def _below_peak(prof: Profile, peak_bytes: int, fraction: float) -> int:
    """``fraction`` of the activations' share of an unconstrained peak, plus the bytes a GPU step holds throughout
    (a profile made for a GPU models cuBLAS's 65 MiB, NOTE [ Memory held before the step ], which on this tiny model
    are most of its peak and no plan can free)."""
    return prof.resident_bytes + int(fraction * (peak_bytes - prof.resident_bytes))


@pytest.mark.slow  # CPU inductor: six graphs per budget
def test_a_profile_of_compiled_regions_prices_plans_that_train_with_the_compiled_math() -> None:
    torch.manual_seed(0)
    model, x = TinyResNet(), _batch()
    low = profile_module(model, x, loss_fn=square, stages=list(LAYERS), warmup=0, repeats=1, compile_budget=0.0)
    high = profile_module(model, x, loss_fn=square, stages=list(LAYERS), warmup=0, repeats=1, compile_budget=1.0)
    assert all("forward" not in m.__dict__ for m in model.modules())  # left as found
    for p, budget in ((low, 0.0), (high, 1.0)):
        assert (p.compile_budget, p.eager_stages) == (budget, (1, 2))  # the BN the in-place ReLU writes, the ReLU
        assert "bn1: its output is written in place after it returned, by stage 'relu'" in str(
            p.model_params["eager_regions"]
        )
        assert p.compile_seconds is not None and p.compile_seconds > 0
        assert not any(s.selective_measured for s in p.stages)
    layer1 = LAYERS.index("layer1")
    assert low.stages[layer1].saved_bytes < high.stages[layer1].saved_bytes  # the partitioner at budget 0 re-makes
    keep = simulate(low, Plan.uniform(low.n_stages).named(low))
    result = tune(low, _below_peak(low, keep.peak_bytes, 0.97), trials=30, seed=0, headroom=0.0)
    assert result.best is not None
    plan = result.best.plan.named(low)
    assert (plan.compile_budget, plan.eager_stages, plan.stages) == (0.0, (1, 2), LAYERS)
    assert Action.SELECTIVE not in plan.actions
    state = copy.deepcopy(model.state_dict())
    with CompiledRegions([model.get_submodule(n) for n in LAYERS], 0.0, plan.eager_stages):
        square(model(x)).backward()
    reference = taken_grads(model)
    model.load_state_dict(state)
    run = planned(model, plan)
    square(run(x)).backward()
    for name, grad in taken_grads(model).items():
        torch.testing.assert_close(grad, reference[name], rtol=1e-5, atol=1e-6, msg=name)
    run.release()


def _failing_backend(budget: float, saves: str | None = None, channels_last: bool = False) -> Callable[..., Any]:
    def backend(_gm: torch.fx.GraphModule, _inputs: list[torch.Tensor]) -> Any:
        raise RuntimeError(f"no kernel for this graph at budget {budget:g}\nsecond line")

    return backend


def test_a_region_that_fails_to_compile_is_named_and_the_eager_plans_stand(monkeypatch: pytest.MonkeyPatch) -> None:
    import memtune.profiler.compiled
    import memtune.profiler.region_tree
    import memtune.tuner.measure.tune_module

    monkeypatch.setattr(memtune.profiler.region_tree, "budget_backend", _failing_backend)
    monkeypatch.setattr(memtune.profiler.compiled, "budget_backend", _failing_backend)  # the whole model fails too
    monkeypatch.setattr(memtune.tuner.measure.tune_module, "COMPILE_BUDGETS", (1.0,))
    model, x = TinyResNet(), _batch()
    parts = [RegionPartition(1, LAYERS)]
    (run,) = profile_regions(model, x, (1.0,), partitions=parts, loss_fn=square, warmup=0, repeats=1, rules=())
    assert run.profile is None and run.error is not None
    assert "region 'conv1' failed under torch.compile at activation budget 1" in run.error
    assert "no kernel for this graph at budget 1" in run.error and "second line" not in run.error
    assert all("forward" not in m.__dict__ for m in model.modules())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuned = memtune.tune(model, "100% of peak", example_inputs=x, loss_fn=square, compile=True, trials=10,
                             headroom=0.0, progress=False)  # fmt: skip
    said = [str(w.message) for w in caught if "failed" in str(w.message)]
    assert any("at activation budget 1 failed" in s and "region 'conv1'" in s for s in said), said
    assert any("compiling the whole model at activation budget 1 failed" in s for s in said), said
    assert tuned.plan is not None and tuned.plan.compile_budget is None and tuned.plan.whole_compile is None
    assert tuned.regions and all(t.error is not None for t in tuned.regions)
    assert "planned eager instead" in str(tuned)


@pytest.mark.slow
def test_tune_with_compile_measures_every_partition_and_serves_the_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    import memtune.profiler.saved_tags
    import memtune.tuner.measure.tune_module

    monkeypatch.setattr(memtune.tuner.measure.tune_module, "COMPILE_BUDGETS", (1.0,))
    monkeypatch.setattr(memtune.profiler.saved_tags, "SAVE_RULES", ())  # the compiler's choice only: test_saved_tags
    torch.manual_seed(0)
    model, x = TinyResNet(), _batch()
    prof = memtune.profile(model, x, loss_fn=square, progress=False)
    budget = _below_peak(prof, simulate(prof, Plan.uniform(prof.n_stages).named(prof)).peak_bytes, 0.9)
    tuned = memtune.tune(model, budget, example_inputs=x, loss_fn=square, compile=True, trials=30, headroom=0.0,
                         progress=False)  # fmt: skip
    assert [t.regions for t in tuned.regions] == [
        LAYERS,
        ("conv1", "bn1", "relu", "maxpool", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "avgpool", "fc"),
    ]
    assert all(t.error is None and t.budget == 1.0 and t.eager_regions == ("bn1", "relu") for t in tuned.regions)
    bests = [t.best_ms for t in tuned.regions if t.best_ms is not None]
    assert tuned.result.best is not None and all(tuned.result.best.step_ms <= b for b in bests)
    region = next(t for t in tuned.regions if t.plan is not None)
    assert region.plan is not None and region.plan.compile_budget == 1.0 and region.plan.stages == region.regions
    run = memtune.planned(model, region.plan)  # a compiled-region plan the user picks from the printout
    square(run(x)).backward()
    assert "compiled regions (each partition" in str(tuned)
    run.release()


def test_fastest_takes_the_quickest_best_and_the_first_where_none_fits() -> None:
    from types import SimpleNamespace

    def result(ms: float | None) -> Any:
        best = None if ms is None else SimpleNamespace(step_ms=ms, peak_bytes=1)
        return SimpleNamespace(best=best)

    a, b, c = result(None), result(5.0), result(3.0)
    assert fastest([a, b, c]) is c
    assert fastest([a, result(None)]) is a
    with pytest.raises(ValueError, match="no result"):
        fastest([])


def test_finding_and_profiling_regions_leaves_the_models_buffers_as_found() -> None:
    """The forwards that find a model's region partitions run in train mode without grad; batch-norm statistics they
    moved once stayed moved after ``memtune.tune(..., compile=True)`` (NOTE [ Profiler hygiene ])."""
    torch.manual_seed(0)
    model, x = TinyResNet(), _batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    (run,) = profile_regions(model, x, (1.0,), partitions=None, loss_fn=square, warmup=0, repeats=1, rules=())[:1]
    assert run.error is None, run.error
    after = model.state_dict()
    assert [k for k in before if not torch.equal(before[k], after[k])] == []

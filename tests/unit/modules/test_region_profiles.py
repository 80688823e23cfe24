"""Profiles of compiled regions (NOTE [ Profiles of compiled regions ] in ``profiler.module_profile``), on the CPU with
CPU inductor.

The CPU profile is modeled for a GPU (its times are the roofline's of the eager operations), so these tests check what
a compiled-region profile and plan mean, and their memory, not which plan is faster on a GPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from profiler.module_profile import profile_module
from profiler.regions import CompiledRegions
from tests.unit.modules.region_models import TinyResNet
from tuner.plan import Action, Plan
from tuner.runtime import planned
from tuner.search import tune
from tuner.simulator import simulate

torch.set_num_threads(1)

LAYERS = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "avgpool", "fc")


def _square(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


def _batch() -> torch.Tensor:
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    got = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return got


@pytest.mark.slow  # CPU inductor: six graphs per budget
def test_a_profile_of_compiled_regions_prices_plans_that_train_with_the_compiled_math() -> None:
    torch.manual_seed(0)
    model, x = TinyResNet(), _batch()
    low = profile_module(model, x, loss_fn=_square, stages=list(LAYERS), warmup=0, repeats=1, compile_budget=0.0)
    high = profile_module(model, x, loss_fn=_square, stages=list(LAYERS), warmup=0, repeats=1, compile_budget=1.0)
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
    result = tune(low, int(keep.peak_bytes * 0.97), trials=30, seed=0)
    assert result.best is not None
    plan = result.best.plan.named(low)
    assert (plan.compile_budget, plan.eager_stages, plan.stages) == (0.0, (1, 2), LAYERS)
    assert Action.SELECTIVE not in plan.actions
    state = copy.deepcopy(model.state_dict())
    with CompiledRegions([model.get_submodule(n) for n in LAYERS], 0.0, plan.eager_stages):
        _square(model(x)).backward()
    reference = _grads(model)
    model.load_state_dict(state)
    run = planned(model, plan)
    _square(run(x)).backward()
    for name, grad in _grads(model).items():
        torch.testing.assert_close(grad, reference[name], rtol=1e-5, atol=1e-6, msg=name)
    run.release()  # type: ignore[attr-defined]

"""Planned peaks of the region tests' ResNet against the CPU allocator's own events.

The served plan of ``TinyResNet`` (NOTE [ Regions ] in ``memtune.profiler.region_tree``) offloads ``bn1``, whose output
the in-place ``relu`` writes and saves, and recomputes ``maxpool`` and ``layer1.0``: an offload next to an in-place op
and a run of recompute stages (NOTE [ Plan semantics ] in ``memtune.tuner.plan``). The oracle is the method of
``tests/unit/modules/test_peak_oracle.py``: one planned forward and backward under ``torch.profiler``'s memory events
(``memtune.profiler.memory_meter.metered``, NOTE [ Allocator meters ]), after one step that grows the offload runtime's
host pool (on the CPU its chunks are CPU allocations, resident from then on, as pinned memory is off the GPU). The
prediction is ``simulate(profile, plan, optimizer="none")`` less its base (the parameters and the batch, resident before
the step). Every plan here agrees within 0.4% on the CPU (contiguous tensors; a few KiB of the stages' small
transients), the served plan to 4 bytes.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memtune.profiler.memory_meter import metered
from memtune.profiler.module_profile import profile_module
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import simulate
from tests.unit.modules.region_models import TinyResNet, square

pytestmark = pytest.mark.slow

TOLERANCE = 0.01  # relative, predicted against measured
#: stages: conv1 bn1 relu maxpool layer1.0 layer1.1 layer2.0 layer2.1 avgpool fc
PLANS = {
    "served": "kokrrkkkkk",  # tune's plan on the H100: bn1 offloaded, maxpool and layer1.0 recomputed
    "offload-beside-inplace": "kokkkkkkkk",
    "offload-inplace-pair": "kookkkkkkk",  # bn1 and the in-place relu that writes its output: one storage
    "recompute-run": "kkkrrkkkkk",
    "recompute-after-offload": "kkorrkkkkk",  # the recomputed maxpool's input held only by an offloaded relu
    "offload-all-stem": "oooorkkkkk",
}


def _step_peak(model: nn.Module, x: torch.Tensor) -> int:
    """The second of two steps, bytes above what was live before it (the first grows the host pool)."""
    peak = 0
    for _ in range(2):
        with metered(torch.device("cpu")) as reading:
            out = model(x)
            loss = square(out)
            loss.backward()
            del loss
            out = None
        peak = reading.peak_bytes
        model.zero_grad(set_to_none=True)
    return peak


@pytest.fixture(scope="module")
def resnet() -> tuple[nn.Module, torch.Tensor, object]:
    torch.manual_seed(0)
    model = TinyResNet(width=16, classes=10).train()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    profile = profile_module(model, x, loss_fn=square, warmup=0, repeats=1, output_held=True, transients="cpu")
    return model, x, profile


@pytest.mark.parametrize("name", list(PLANS))
def test_a_planned_peak_matches_the_allocator(name: str, resnet: tuple[nn.Module, torch.Tensor, object]) -> None:
    from memtune.tuner.runtime import planned

    model, x, profile = resnet
    plan = Plan.from_actions(PLANS[name]).named(profile)  # type: ignore[arg-type]
    sim = simulate(profile, plan, optimizer="none")  # type: ignore[arg-type]
    predicted = sim.peak_bytes - sim.base_bytes
    run = planned(model, plan)
    measured = _step_peak(run, x)
    run.release()
    assert abs(predicted / measured - 1) <= TOLERANCE, (name, predicted, measured)


def test_the_plans_differ_from_the_unplanned_step(resnet: tuple[nn.Module, torch.Tensor, object]) -> None:
    """The plans lower the step's peak, so the oracle above compares plans, not the unplanned step again."""
    model, x, _ = resnet
    from memtune.tuner.runtime import planned

    unplanned = _step_peak(model, x)
    run = planned(model, Plan.from_actions(PLANS["served"]).named(resnet[2]))  # type: ignore[arg-type]
    assert _step_peak(run, x) < unplanned
    run.release()

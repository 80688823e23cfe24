"""A planned step frees its activations when autograd does: no reference cycle holds a tensor past the step.

A tensor caught in a cycle lives until the garbage collector runs, so a training loop's memory grows past the plan's
peak in between; on the GPU a recomputed stage's inputs, held by a recursive closure of ``copy_structure``, kept
1.05 GiB of ResNet-50's activations alive past the end of its step. The check: one planned step with the collector
off, then a collection that saves what it finds; none of it may be a tensor.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

from memtune.profiler.module_profile import as_inputs, profile_module
from memtune.tuner.plan import Action, Plan
from memtune.tuner.runtime import planned
from tests.unit.modules.models import build_case


@pytest.fixture
def collector_saving_garbage() -> Iterator[list[object]]:
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()


@pytest.mark.parametrize("action", [Action.RECOMPUTE, Action.SELECTIVE, Action.OFFLOAD])
@pytest.mark.parametrize("name", ["unet", pytest.param("llama", marks=pytest.mark.slow)])  # Llama: state threaded
def test_a_planned_step_leaves_no_tensor_in_a_cycle(
    name: str, action: Action, collector_saving_garbage: list[object]
) -> None:
    case = build_case(name)
    profile = profile_module(case.model, case.inputs, loss_fn=case.loss_fn, warmup=0, repeats=1)
    gc.collect()
    collector_saving_garbage.clear()
    model = planned(case.model, Plan.uniform(profile.n_stages, action).named(profile))
    args, kwargs = as_inputs(case.inputs)
    out = model(*args, **kwargs)
    case.loss_fn(out).backward()
    del out
    gc.collect()
    tensors = [o for o in collector_saving_garbage if isinstance(o, torch.Tensor)]
    assert not tensors, [tuple(t.shape) for t in tensors]

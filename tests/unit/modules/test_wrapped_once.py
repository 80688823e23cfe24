"""A planned model wraps each stage module once (NOTE [ Stage modules are wrapped once ] in
``memtune.tuner.runtime._planned_module``): the wrapper is one stable ``forward`` across steps, hooks and wrappers a
user adds after planning still run with unplanned gradients, two planned models of one model each run their own plan,
and ``release`` gives the modules their own ``forward`` back.

Runs on CPU in fp32 with the U-Net of ``models`` (in-place ReLUs, BatchNorm buffers, skip connections held across
stages) and the two-input model (keyword arguments); its dropout-free math is bitwise equal in practice.
"""

from __future__ import annotations

import copy
import itertools
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import memtune
from memtune.profiler.module_profile import as_inputs
from memtune.profiler.module_stages import find_stages
from memtune.profiler.region_tree import RegionForward
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Plan
from memtune.tuner.runtime._planned_module import PlannedModule
from tests.unit.modules.models import Case, build_case

#: every action in turn over the stages: keep, offload, recompute, selective
MIXED = "kors"


def _plan(case: Case, letters: str = MIXED) -> tuple[Plan, list[nn.Module]]:
    """A plan over ``case``'s default stages, ``letters`` in turn, and the stage modules."""
    names, _ = find_stages(case.model, as_inputs(case.inputs), None)
    actions = "".join(itertools.islice(itertools.cycle(letters), len(names)))
    return Plan.from_actions(actions, stages=tuple(names)), [case.model.get_submodule(n) for n in names]


def _grads(run: Callable[..., Any], case: Case) -> list[torch.Tensor]:
    """One step of ``run`` on ``case`` from seed 0, gradients reset first: every parameter's gradient."""
    params = list(case.model.parameters())
    for p in params:
        p.grad = None
    torch.manual_seed(0)
    args, kwargs = as_inputs(case.inputs)
    case.loss_fn(run(*args, **kwargs)).backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]


def _close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["unet", "two_inputs"])
def test_each_stage_module_is_wrapped_once(name: str) -> None:
    case = build_case(name)
    reference = _grads(case.model, case)
    plan, stages = _plan(case)
    run = memtune.planned(case.model, plan)
    assert isinstance(run, PlannedModule)
    wrappers = [m.__dict__["forward"] for m in stages]
    assert all(isinstance(w, RegionForward) and w.module is m for w, m in zip(wrappers, stages, strict=True))
    seen: list[object] = []
    handles = [m.register_forward_pre_hook(lambda m, _a: seen.append(m.forward)) for m in stages]
    for _ in range(2):
        seen.clear()
        _close(_grads(run, case), reference)
        assert [m.forward for m in stages] == wrappers  # the same objects after each step: never re-patched
        assert len(seen) == len(stages) and all(any(f is w for w in wrappers) for f in seen)  # during it too
    for h in handles:
        h.remove()
    names = [n for n, _ in case.model.named_modules()]
    keys = list(case.model.state_dict())
    assert list(run.state_dict()) == keys  # the model's own keys, no module inserted
    clone = copy.deepcopy(case.model)  # a copy runs eagerly, on wrappers of its own
    pickled = pickle.loads(pickle.dumps(case.model))
    for other in (clone, pickled):
        assert [n for n, _ in other.named_modules()] == names and list(other.state_dict()) == keys
        assert all(other.get_submodule(n).forward.module is other.get_submodule(n) for n in plan.stages or ())
        _close(_grads(other, Case(other, case.inputs, case.loss_fn)), reference)
    run.release()


def test_hooks_and_wrappers_added_after_planning_still_run_with_unplanned_gradients() -> None:
    case = build_case("unet")
    plan, stages = _plan(case, "ro")
    run = memtune.planned(case.model, plan)
    calls = {"hook": 0, "wrapper": 0}

    def doubled(_m: nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
        calls["hook"] += 1
        return out * 2

    hooked, wrapped = stages[0], stages[1]  # a recompute stage and an offload stage
    handle = hooked.register_forward_hook(doubled)
    planned_forward = wrapped.forward

    def halved(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls["wrapper"] += 1
        return planned_forward(*args, **kwargs) * 0.5  # type: ignore[no-any-return]

    wrapped.forward = halved  # type: ignore[method-assign]
    reference = _grads(case.model, case)  # called directly: the model's own math, hook and wrapper included
    assert calls == {"hook": 1, "wrapper": 1}
    for step in range(2, 4):
        _close(_grads(run, case), reference)
        assert calls == {"hook": step, "wrapper": step}  # once per forward: the re-run in backward runs neither
    assert run.stats.d2h_copies > 0  # the wrapped stage still offloads under the user's wrapper
    run.release()
    assert wrapped.forward is halved and "forward" not in hooked.__dict__  # the user's wrapper is left in place
    _close(_grads(case.model, case), reference)  # and runs the module's own forward now
    handle.remove()


def test_release_gives_back_the_original_forwards() -> None:
    case = build_case("unet")
    plan, stages = _plan(case)
    own = stages[2].forward  # a wrapper set before planning is the stage's own forward: kept and given back
    stages[2].forward = own  # type: ignore[method-assign]
    reference = _grads(case.model, case)
    run = memtune.planned(case.model, plan)
    again = memtune.planned(case.model, Plan.from_actions("r" * len(stages), stages=plan.stages))
    assert all(a is b for a, b in zip(run._forwards, again._forwards, strict=True))  # one wrapper per module
    _close(_grads(run, case), reference)
    _close(_grads(again, case), reference)
    assert run.stats.d2h_copies > 0 and again.stats.d2h_copies == 0  # each steps with its own plan
    run.release()
    assert all(isinstance(m.__dict__["forward"], RegionForward) for m in stages)  # ``again`` still runs them
    _close(_grads(again, case), reference)
    with pytest.raises(PlanError, match="released"):
        run(*as_inputs(case.inputs)[0])
    again.release()
    assert stages[2].forward is own
    assert all("forward" not in m.__dict__ for i, m in enumerate(stages) if i != 2)
    assert all("forward" not in m.__dict__ for m in case.model.modules() if m is not stages[2])
    _close(_grads(case.model, case), reference)

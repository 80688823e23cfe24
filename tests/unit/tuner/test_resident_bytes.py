"""Memory held before the step (NOTE [ Memory held before the step ] in ``memtune.profiler._module_step``): a profile's
``resident_bytes`` (cuBLAS's workspaces on CUDA) is in every plan's simulated peak, in the fast path's, in the lower
bound's and in the allocator model's replay; on the CPU nothing is measured."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from memtune.profiler import Profile
from memtune.profiler._module_step import _resident_bytes
from memtune.tuner import simulate
from memtune.tuner.bound import step_lower_bound
from memtune.tuner.placement import predict_retries
from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import Simulator

PROFILE = Path(__file__).resolve().parents[3] / "memtune" / "profiler" / "data" / "resnet18-b256-float32-h200.json"
HELD = 64 << 20  # two 32 MiB workspaces, as on the H100


def _profiles() -> tuple[Profile, Profile]:
    profile = Profile.model_validate_json(PROFILE.read_text())
    return profile, profile.model_copy(update={"resident_bytes": HELD})


def _plans(profile: Profile, count: int) -> list[Plan]:
    rng = random.Random(7)
    actions = (Action.KEEP, Action.OFFLOAD, Action.RECOMPUTE)
    return [Plan(actions=tuple(rng.choice(actions) for _ in profile.stages)) for _ in range(count)]


def test_held_bytes_raise_every_plans_peak_by_themselves_and_nothing_else() -> None:
    plain, held = _profiles()
    assert plain.resident_bytes == 0  # committed profiles made before the field: nothing held
    for plan in _plans(plain, 40):
        a, b = simulate(plain, plan), simulate(held, plan)
        assert b.peak_bytes == a.peak_bytes + HELD
        assert b.step_ms == a.step_ms
        assert b.peak_bytes - b.base_bytes == a.peak_bytes - a.base_bytes  # the self-check's growth is unchanged
        bounded = Simulator(held, "sgd")  # a search's bounded simulations (the fast path) count them as well
        assert bounded.run_bounded(plan.actions, plan, peak_limit=b.peak_bytes) is not None
        assert bounded.run_bounded(plan.actions, plan, peak_limit=b.peak_bytes - 1) is None


def test_the_allocator_model_and_the_bound_hold_them_too() -> None:
    plain, held = _profiles()
    plan = Plan(actions=(Action.KEEP,) * plain.n_stages)
    peak = simulate(plain, plan).peak_bytes
    assert not predict_retries(plain, plan, peak + (HELD // 2), steps=2).out_of_memory
    assert predict_retries(held, plan, peak + (HELD // 2), steps=2).out_of_memory
    budget = int(0.7 * peak)
    a, b = step_lower_bound(Simulator(plain), budget), step_lower_bound(Simulator(held), budget + HELD)
    assert b.step_ms == a.step_ms  # the held bytes take their share of the budget, and only that


def test_nothing_is_held_on_the_cpu() -> None:
    torch.ones(4, 4) @ torch.ones(4, 4)
    assert _resident_bytes(torch.device("cpu"), lambda: None) == 0

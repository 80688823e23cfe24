"""NOTE [ Fast path ] (``memtune.tuner._fast_path``): a plan priced without its timeline gets exactly the numbers of the
reference ``Simulator._run`` (taken with a timeline here, which only the reference makes), to the last bit, on random
plans of zoo chains (in-place stages at segment boundaries, selective stages, convolution rules) and of committed module
profiles (stages that keep every input, storages saved outside every stage, a loss of the user's own, a held output,
gradients that are slices of larger storages); and NOTE [ Bounded simulations ] answers None exactly where a full
simulation breaks its limits."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
from profiles import conv_profile

from benchmarks.common import zoo_profile
from memtune.profiler import Profile
from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import SimResult, Simulator
from memtune.tuner.stage_choices import stage_actions

PROMISES = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "h100" / "promises"


def _module_profile(name: str) -> Profile:
    return Profile.model_validate(json.loads((PROMISES / f"{name}.json").read_text())["profile"])


def _sliced_gradients(profile: Profile) -> Profile:
    """``profile`` with every gradient a view of a storage twice its size (NOTE [ Gradient storages ])."""
    storages = tuple(
        s.model_copy(update={"grad_storage_bytes": 2 * s.grad_bytes}) if s.grad_bytes else s for s in profile.storages
    )
    return profile.model_copy(update={"storages": storages})


def _random_plans(profile: Profile, count: int, seed: int) -> list[Plan]:
    """Plans of every action a stage may take (selective where measured), each sync the fast path takes, global or
    per-stage lookaheads, and on a profile with algorithm tables every convolution rule."""
    rng = random.Random(seed)
    n = profile.n_stages
    choices = stage_actions(profile)
    # runs of recompute next to keep and offload make segments with every kind of input and in-place boundary
    skewed = [(Action.RECOMPUTE, Action.RECOMPUTE, *acts) for acts in choices]
    rules = ["default", "fastest", "memory_optimal", "fastest_within"] if profile.has_conv_algos else ["default"]
    plans = []
    for i in range(count):
        pool = skewed if i % 3 == 0 else choices
        rule = rng.choice(rules)
        plans.append(
            Plan(
                actions=tuple(rng.choice(acts) for acts in pool),
                prefetch_lookahead=rng.randint(0, 8),
                prefetch_lookaheads=tuple(rng.randint(0, 4) for _ in range(n)) if i % 5 == 0 else None,
                sync=rng.choice(["deferred", "layer"]),
                sync_delay=rng.randint(0, 6),
                conv_rule=rule,  # type: ignore[arg-type]
                conv_workspace_limit_bytes=rng.choice([0, 64 << 20, 1 << 30]) if rule == "fastest_within" else None,
            )
        )
    return plans


def _reference(sim: Simulator, plan: Plan) -> SimResult:
    """The reference's numbers for ``plan``: ``_run`` with its timeline, the timeline left out."""
    r = sim.run(plan, timeline=True, check=False)
    return dataclasses.replace(r, timeline=(), blocks=(), spans=())


def _assert_same(profile: Profile, plans: list[Plan]) -> None:
    sim = Simulator(profile)
    for plan in plans:
        assert sim._fast_applies(plan.actions, plan)
        fast = sim.run(plan, check=False)
        assert fast == _reference(sim, plan), f"{profile.model}: {plan.compact()} {plan.sync} {plan.sync_delay}"


def test_the_fast_path_is_the_reference_on_a_conv_chain() -> None:
    """The hand-made chain: in-place ReLUs at segment boundaries, a pool's indices, algorithm tables."""
    profile = conv_profile()
    _assert_same(profile, _random_plans(profile, 300, seed=1))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["vgg16", "resnet50"])
def test_the_fast_path_is_the_reference_on_zoo_chains(model: str) -> None:
    profile = zoo_profile(model, 256)
    _assert_same(profile, _random_plans(profile, 400, seed=2))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["densenet121", "unet", "gpt2", "t5_small", "mobilenet_v2"])
def test_the_fast_path_is_the_reference_on_module_profiles(name: str) -> None:
    profile = _module_profile(name)
    _assert_same(profile, _random_plans(profile, 300, seed=3))
    _assert_same(_sliced_gradients(profile), _random_plans(profile, 100, seed=4))


def test_inline_points_and_timelines_take_the_reference() -> None:
    sim = Simulator(zoo_profile("resnet50", 256))
    n = sim.n
    for plan in (Plan.uniform(n, Action.OFFLOAD, sync="inline"), Plan.uniform(n, sync="points", sync_points=(3,))):
        assert not sim._fast_applies(plan.actions, plan)
    plan = Plan.uniform(n, Action.OFFLOAD)
    assert sim.run(plan, timeline=True).timeline  # the reference made it
    assert sim.run(plan).timeline == ()


def test_a_bounded_simulation_is_none_exactly_where_a_full_one_breaks_its_limits() -> None:
    """NOTE [ Bounded simulations ]: with the limits a descent sets over a fitting incumbent (peak and step) and over
    one that does not fit (no higher peak, and no slower step at the same peak); and step limits at and just below
    the plan's compute, and at its forward plus the rest's compute, where NOTE [ Compute bound ] answers early."""
    profile = conv_profile()
    sim = Simulator(profile)
    plans = _random_plans(profile, 80, seed=5)
    full = [sim.run_actions(p.actions, p) for p in plans]
    peaks = sorted(r.peak_bytes for r in full)
    steps = sorted(r.step_ms for r in full)
    for plan, r in zip(plans, full, strict=True):
        for peak_limit, step_limit, at_peak in (
            (peaks[40], steps[40], 0),
            (peaks[20], steps[60], 0),
            (r.peak_bytes, r.step_ms, r.peak_bytes),
            (r.peak_bytes, r.step_ms - 1e-9, r.peak_bytes),
            (r.peak_bytes, r.step_ms - 1e-9, r.peak_bytes + 1),
            (r.peak_bytes - 1, None, 0),
            (peaks[-1], r.step_ms - r.stall_ms, 0),
            (peaks[-1], (r.step_ms - r.stall_ms) * (1 - 1e-7), 0),
            (peaks[-1], (r.step_ms - r.stall_ms) * (1 - 1e-7), r.peak_bytes),
            (peaks[-1], r.step_ms - sum(r.backward_stalls_ms), r.peak_bytes),
            (peaks[-1], (r.step_ms - sum(r.backward_stalls_ms)) * (1 - 1e-7), 0),
        ):
            bounded = sim.run_bounded(
                plan.actions, plan, peak_limit=peak_limit, step_limit=step_limit, step_limit_peak=at_peak
            )
            breaks = r.peak_bytes > peak_limit or (
                step_limit is not None and r.peak_bytes >= at_peak and r.step_ms > step_limit
            )
            assert bounded == (None if breaks else r)

"""``memtune.tuner.bound`` (NOTE [ Budget bound ]): its envelopes, and that it is a lower bound: no plan the
policies, the search or chance make, that fits the budget, is simulated faster than it."""

from __future__ import annotations

import math
import random

import optuna
import pytest

from memtune.api.cli import resolve_profile
from memtune.profiler._profile import Profile
from memtune.profiler.zoo import build
from memtune.tuner.bound import lower_envelope, step_lower_bound
from memtune.tuner.plan import Plan
from memtune.tuner.policies import POLICIES, run_policy
from memtune.tuner.search import tune
from memtune.tuner.simulator import Simulator
from memtune.tuner.stage_choices import stage_actions


def test_the_envelope_starts_at_the_fastest_point_and_saves_at_rising_cost() -> None:
    # (workspace GiB, ms): the fastest uses 6; (3, 12) lies above the chord from (4, 10) to (0, 20)
    anchor, ms, pieces = lower_envelope([(6, 10.0), (6, 11.0), (4, 10.0), (3, 16.0), (0, 20.0), (5, 30.0)])
    assert (anchor, ms) == (4, 10.0)  # among the fastest, the least workspace
    assert pieces == [(4, 2.5)]  # straight to (0, 20): (3, 16) lies above that chord (12.5 ms at 3)
    _, _, pieces = lower_envelope([(8, 1.0), (4, 2.0), (0, 10.0)])
    assert pieces == [(4, 0.25), (4, 2.0)]
    slopes = [s for _, s in pieces]
    assert slopes == sorted(slopes)
    assert lower_envelope([(2, 5.0)]) == (2, 5.0, [])


def _random_plans(profile: Profile, rng: random.Random, count: int) -> list[Plan]:
    """Random plans over the search's space: per stage actions, sync modes and algorithm rules."""
    acts = stage_actions(profile)
    caps = sorted({a.workspace_bytes for st in profile.stages for c in st.convs for a in c.algos}) or [0]
    plans = []
    for _ in range(count):
        keep_share = rng.random()
        actions = [a[0] if rng.random() < keep_share else rng.choice(a) for a in acts]
        rule = rng.choice(["default", "fastest", "memory_optimal", "fastest_within"])
        plans.append(
            Plan(
                actions=actions,
                sync=rng.choice(["layer", "deferred", "inline"]),
                prefetch_lookahead=rng.randint(1, 4),
                conv_rule=rule,
                conv_workspace_limit_bytes=rng.choice(caps) if rule == "fastest_within" else None,
            )
        )
    return plans


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "batch", "dtype"),
    [("resnet50", 256, "float32"), ("vgg16", 256, "bfloat16"), ("gpt", 16, "bfloat16"), ("gpt", 16, "float32")],
)
def test_no_plan_that_fits_is_faster_than_the_bound(model: str, batch: int, dtype: str) -> None:
    """Every baseline policy, the search's best and 400 random plans, at 40%, 60% and 80% of the committed H200
    profile's unconstrained peak: each plan whose simulated peak fits is no faster than the bound, and the bound
    is no more than 3% below the unconstrained step (the compute of one step at the fastest algorithms)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    profile = resolve_profile(build(model, {}), batch, dtype, "h200")
    sim = Simulator(profile)
    peak = sim.run(Plan.uniform(profile.n_stages)).peak_bytes
    plans = [run_policy(name, profile, int(0.6 * peak)) for name in POLICIES]
    plans += _random_plans(profile, random.Random(7), 400)
    checked = 0
    for frac in (0.4, 0.6, 0.8):
        budget = int(frac * peak)
        bound = step_lower_bound(sim, budget)
        assert bound.step_ms >= 0.97 * bound.unconstrained_ms
        best = tune(profile, budget, trials=40, seed=0, placement=False).best
        for plan in plans + ([best.plan] if best is not None else []):
            r = sim.run(plan)
            if r.peak_bytes <= budget:
                assert r.step_ms >= bound.step_ms - 1e-6, (frac, plan.label, r.step_ms, bound)
                checked += 1
        if best is not None:
            assert bound.step_ms <= best.step_ms
    assert checked >= 3  # the check saw plans that fit


@pytest.mark.slow
def test_the_bound_is_the_fastest_compute_when_everything_fits_and_infinite_when_nothing_can() -> None:
    profile = resolve_profile(build("resnet50", {}), 256, "float32", "h200")
    sim = Simulator(profile)
    peak = sim.run(Plan.uniform(profile.n_stages)).peak_bytes
    roomy = step_lower_bound(sim, 2 * peak)
    assert roomy.step_ms <= roomy.unconstrained_ms and roomy.recompute_ms == roomy.stall_ms == 0.0
    assert roomy.step_ms >= 0.97 * roomy.unconstrained_ms  # the fastest algorithms gain a little at most
    assert math.isinf(step_lower_bound(sim, sim.run(Plan.uniform(profile.n_stages)).base_bytes // 2).step_ms)
    with pytest.raises(ValueError, match="budget must be positive"):
        step_lower_bound(sim, 0)


def test_a_table_config_that_is_not_model_batch_dtype_is_refused_by_name() -> None:
    from benchmarks.common import config_profile

    for bad in ("vgg16:256", "vgg16:big:float32", "vgg16:256:float32:0.6"):
        with pytest.raises(ValueError, match=r"model:batch:dtype, e\.g\. resnet50:256:float32, not"):
            config_profile(bad)
    assert config_profile("resnet50:256:float32").source == "measured"

"""NOTE [ Host issue time ] (``memtune.tuner._host_time``) and NOTE [ Host prices ]
(``memtune.tuner.measure.host_price``): a profile with host prices prices a step at least at the host's time under
the plan's actions, on the fast path and the reference alike, and bounded simulations answer by the floored step; the
prices are shared among the stages as measured, and none are measured off CUDA."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch
from profiles import conv_profile
from torch import nn

from memtune.profiler import HostPrices, Profile, profile_module
from memtune.tuner.measure.host_price import measure_host_prices, shares
from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import Simulator

PROMISES = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "h100" / "promises"


def _priced(profile: Profile, keep: float, rec: float, off: float) -> Profile:
    n = profile.n_stages
    host = HostPrices(keep_ms=keep, recompute_ms=(rec,) * n, offload_ms=(off,) * n, steps=5)
    return profile.model_copy(update={"host": host})


def _plans(n: int, count: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    acts = (Action.KEEP, Action.OFFLOAD, Action.RECOMPUTE)
    return [Plan(actions=tuple(rng.choice(acts) for _ in range(n))) for _ in range(count)]


def test_a_step_takes_at_least_the_hosts_time_under_its_actions() -> None:
    profile = Profile.model_validate(json.loads((PROMISES / "mobilenet_v2.json").read_text())["profile"])
    gpu = Simulator(profile)
    n = profile.n_stages
    plan = Plan(actions=(Action.RECOMPUTE, Action.OFFLOAD, Action.OFFLOAD) + (Action.KEEP,) * (n - 3))
    alone = gpu.run(plan)
    assert alone.host_ms == 0.0 and gpu.host_ms(plan.actions) == 0.0  # no prices: the GPU alone, as before
    # a host far slower than the GPU: the step is the host's, kept step plus one recompute and two offloads
    slow = Simulator(_priced(profile, keep=10 * alone.step_ms, rec=3.0, off=2.0)).run(plan)
    assert slow.host_ms == pytest.approx(10 * alone.step_ms + 3.0 + 2 * 2.0)
    assert slow.step_ms == slow.host_ms
    assert (slow.peak_bytes, slow.forward_ms, slow.stall_ms) == (alone.peak_bytes, alone.forward_ms, alone.stall_ms)
    # a host faster than the GPU changes nothing but the host's field
    fast = Simulator(_priced(profile, keep=0.1, rec=0.01, off=0.01)).run(plan)
    assert fast.step_ms == alone.step_ms and fast.host_ms == pytest.approx(0.13)


def test_the_fast_path_and_the_reference_floor_alike() -> None:
    profile = _priced(conv_profile(), keep=0.0, rec=0.0, off=0.0)
    base = Simulator(conv_profile())
    # a kept step near the GPU's, so that some plans are the host's and some the GPU's
    keep = base.run(Plan.uniform(profile.n_stages)).step_ms
    sim = Simulator(_priced(conv_profile(), keep=keep, rec=0.4 * keep / profile.n_stages, off=0.3))
    bound = 0
    for plan in _plans(profile.n_stages, 120, seed=7):
        fast = sim.run(plan, check=False)
        ref = dataclasses.replace(sim.run(plan, timeline=True, check=False), timeline=(), blocks=(), spans=())
        assert fast == ref
        bound += fast.step_ms == fast.host_ms
    assert 0 < bound < 120


def test_a_bounded_simulation_answers_by_the_floored_step() -> None:
    profile = conv_profile()
    gpu_keep = Simulator(profile).run(Plan.uniform(profile.n_stages)).step_ms
    sim = Simulator(_priced(profile, keep=2 * gpu_keep, rec=1.0, off=0.5))
    for plan in _plans(profile.n_stages, 40, seed=8):
        r = sim.run_actions(plan.actions, plan)
        assert r.step_ms >= r.host_ms > 0
        assert sim.run_bounded(plan.actions, plan, step_limit=r.step_ms) == r
        assert sim.run_bounded(plan.actions, plan, step_limit=r.step_ms - 1e-6) is None


def test_host_prices_name_one_entry_per_stage() -> None:
    profile = conv_profile()
    with pytest.raises(ValueError, match=r"host\.offload_ms has 2 entries"):
        Profile.model_validate({**profile.model_dump(), "host": {"keep_ms": 1.0, "offload_ms": [0.1, 0.2], "steps": 3}})


def test_shares_follow_the_weights_and_never_go_negative() -> None:
    assert shares(6.0, [1, 2, 3]) == pytest.approx((1.0, 2.0, 3.0))
    assert shares(6.0, [0, 0, 0]) == pytest.approx((2.0, 2.0, 2.0))
    assert shares(-4.0, [1, 1]) == (0.0, 0.0)  # a plan measured faster than the kept one adds nothing


def test_no_host_prices_off_cuda() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    profile = profile_module(model, x, loss_fn=lambda out: out.sum(), warmup=0, repeats=1)
    assert measure_host_prices(model, x, profile, lambda out: out.sum()) is None


def test_a_plan_that_fails_leaves_its_action_unpriced_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from memtune.tuner.measure import host_price

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    profile = profile_module(model, x, loss_fn=lambda out: out.sum(), warmup=0, repeats=1)
    monkeypatch.setattr(host_price, "_host_bound", lambda device: True)  # priced as if on CUDA, timed by the fake
    issued = iter([10.0, 13.0])  # kept, offloaded; then the recomputed plan fails

    def fake_issue(*args: object) -> float:
        try:
            return next(issued)
        except StopIteration:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore") from None

    monkeypatch.setattr(host_price, "issue_ms", fake_issue)
    with pytest.warns(UserWarning, match=r"every stage recomputed failed \(RuntimeError: CUDA out of memory\. Tried "
                                         r"to allocate 2\.00 GiB\); recomputing adds nothing"):  # fmt: skip
        host = measure_host_prices(model, x, profile, lambda out: out.sum())
    assert host is not None and host.keep_ms == 10.0 and host.recompute_ms is None
    assert host.offload_ms is not None and sum(host.offload_ms) == pytest.approx(3.0)

    monkeypatch.setattr(host_price, "issue_ms", lambda *a: (_ for _ in ()).throw(ValueError("refused")))
    with pytest.warns(UserWarning, match=r"every stage kept failed \(ValueError: refused\); the profile gets no host"):
        assert measure_host_prices(model, x, profile, lambda out: out.sum()) is None

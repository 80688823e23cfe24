"""The calibration is an input of the simulator and of the search (NOTE [ Calibration is an input ] in
``memtune.tuner.calibration``): two calibrations price one profile side by side in one process without the registry
(``install_calibration``) being touched, a given calibration is never looked up again below it, and the default is
``calibration_for``'s, as before."""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import pytest

import memtune.tuner.calibration as calibration_module
from memtune.profiler import Profile
from memtune.tuner._peak_check import planning_headroom
from memtune.tuner._ranks import simulate_ranks
from memtune.tuner.calibration import Calibration, calibration_for, installed_calibrations, profile_key
from memtune.tuner.placement import AllocatorPricer, allocator_cost
from memtune.tuner.plan import Action, Plan
from memtune.tuner.search import tune
from memtune.tuner.simulator import Simulator, simulate

DATA = Path(__file__).resolve().parents[3] / "memtune" / "profiler" / "data"


def _profile(name: str = "alexnet-b256-float32-h100") -> Profile:
    return Profile.model_validate_json((DATA / f"{name}.json").read_text())


def _calibration(profile: Profile, scale: float, remap: float | None = 2.0, headroom: float = 0.05) -> Calibration:
    """A calibration of the profile's GPU type whose compute scale for it is ``scale``."""
    data = {
        "gpu": profile.device.key,
        "headroom": headroom,
        "remap_ms_per_gib": remap,
        "compute_scale": {profile_key(profile): scale},
        "source": f"test, scale {scale}",
    }
    return Calibration.from_data(data)


def _no_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every ``calibration_for`` of the tuner refuse: a calibration given must be the only one read."""

    def refuse(gpu: str) -> Calibration:
        raise AssertionError(f"calibration_for({gpu!r}) called below a given calibration")

    for module in ("simulator", "search", "_peak_check", "_ranks"):
        monkeypatch.setattr(importlib.import_module(f"memtune.tuner.{module}"), "calibration_for", refuse)
    monkeypatch.setattr(calibration_module, "calibration_for", refuse)  # placement imports it where it runs


def test_two_calibrations_give_two_prices_of_one_profile_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = _profile()
    assert profile.source == "measured" and not profile.modules
    before = installed_calibrations()
    slow, fast = _calibration(profile, 1.0), _calibration(profile, 0.5)
    _no_lookup(monkeypatch)
    plan = Plan.uniform(profile.n_stages)
    a, b = Simulator(profile, calibration=slow), Simulator(profile, calibration=fast)
    assert (a.calibration, b.calibration) == (slow, fast)
    assert (a.compute_scale, b.compute_scale) == (1.0, 0.5)
    ra, rb = a.run(plan), b.run(plan)
    assert rb.step_ms == pytest.approx(0.5 * ra.step_ms)  # the unplanned step is all compute
    assert rb.peak_bytes == ra.peak_bytes  # memory is not scaled
    assert simulate(profile, plan, calibration=fast).step_ms == rb.step_ms
    # the ranks read the shared link, the all-reduce rate and the compute scale from the calibration given
    assert simulate_ranks(profile, plan, 1, calibration=fast).step_ms == pytest.approx(rb.step_ms)
    # the allocator price is the calibration's too
    offload = Plan.uniform(profile.n_stages, Action.OFFLOAD)
    cap = int(a.run(offload).peak_bytes * 1.02)
    placed, cost = allocator_cost(profile, offload, cap, calibration=_calibration(profile, 1.0, remap=None))
    assert cost is None
    pricer = AllocatorPricer(profile, cap, calibration=slow)
    assert pricer.calibration is slow and pricer.cost(offload)[0] == placed
    assert installed_calibrations() == before  # nothing was installed


def test_tune_prices_with_the_calibration_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = _profile()
    slow, fast = _calibration(profile, 1.0), _calibration(profile, 0.5)
    budget = int(Simulator(profile, calibration=slow).run(Plan.uniform(profile.n_stages)).peak_bytes * 0.9)
    _no_lookup(monkeypatch)
    by_slow = tune(profile, budget, trials=12, seed=0, calibration=slow)
    by_fast = tune(profile, budget, trials=12, seed=0, calibration=fast)
    assert by_slow.unconstrained.step_ms == pytest.approx(2 * by_fast.unconstrained.step_ms)
    assert by_slow.best is not None and by_fast.best is not None
    assert by_fast.best.step_ms < by_slow.best.step_ms
    assert planning_headroom(profile, calibration=fast) == fast.headroom  # no measured step: the calibration's


def test_the_default_is_the_lookup_of_today() -> None:
    profile = _profile("resnet50-b256-float32-h200")
    looked_up = calibration_for(profile.device.key)
    sim = Simulator(profile)
    assert sim.calibration is looked_up
    assert sim.compute_scale == looked_up.compute_scale_for(profile)
    plan = Plan.uniform(profile.n_stages, Action.OFFLOAD)
    assert sim.run(plan) == Simulator(profile, calibration=looked_up).run(plan)
    budget = int(sim.run(Plan.uniform(profile.n_stages)).peak_bytes * 0.6)
    by_default = tune(profile, budget, trials=8, seed=0)
    given = tune(profile, budget, trials=8, seed=0, calibration=looked_up)
    assert by_default.best == given.best and by_default.unconstrained == given.unconstrained


def test_a_calibration_pickles_whole() -> None:
    """A search in another process gets the calibration itself (or its data)."""
    cal = _calibration(_profile(), 0.7)
    back = pickle.loads(pickle.dumps(cal))
    assert back == cal and back.data == cal.data and back.origin == cal.origin
    assert Calibration.from_data(cal.to_data()) == cal

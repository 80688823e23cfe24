"""The profile's self-check (NOTE [ Profile self-check ]): reported above 3%, widening the default headroom where the
simulator under-predicts, shown by ``memtune.tune``'s printout and warned about by ``memtune.profile``."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import memtune
from memtune.profiler import Profile, StepPeak
from memtune.tuner import peak_check, planning_headroom
from memtune.tuner.calibration import calibration_for


def small() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)), nn.Linear(64, 8))
    return model, torch.randn(32, 64)


@pytest.fixture(scope="module")
def profile() -> Profile:
    model, x = small()
    return memtune.profile(model, x, progress=False, warmup=0, repeats=1)


def with_measured(profile: Profile, factor: float) -> Profile:
    """``profile`` as if its unplanned step had measured ``factor`` x the simulator's prediction."""
    check = peak_check(profile)
    assert check is not None
    peak = int(check.predicted_bytes * factor)
    return profile.model_copy(
        update={"step_peak": StepPeak(allocated_bytes=peak, reserved_bytes=peak, output_held=True)}
    )


def test_a_cpu_profile_checks_itself_and_agrees(profile: Profile) -> None:
    check = peak_check(profile)
    assert check is not None and not check.reported, check
    assert check.device == "the CPU"  # a CPU profile for a GPU says where it was measured
    assert planning_headroom(profile) == pytest.approx(calibration_for(profile.device.key).headroom, abs=2e-3)


def test_an_under_prediction_is_reported_and_widens_the_headroom(profile: Profile) -> None:
    off = with_measured(profile, 1.25)
    check = peak_check(off)
    assert check is not None and check.reported and check.gap == pytest.approx(0.25, abs=1e-3)
    assert "under-predicts" in str(check)
    base = calibration_for(profile.device.key).headroom
    # the search budget budget x (1 - h) / (1 + gap)
    assert 1 - planning_headroom(off) == pytest.approx((1 - base) / 1.25, rel=1e-3)
    tuned = memtune.tune(off, "80% of peak", trials=5, progress=False)
    assert "memory check:" in str(tuned) and "under-predicts" in str(tuned)


def test_an_over_prediction_is_reported_but_keeps_the_headroom(profile: Profile) -> None:
    off = with_measured(profile, 0.8)
    check = peak_check(off)
    assert check is not None and check.reported and "over-predicts" in str(check)
    assert planning_headroom(off) == calibration_for(profile.device.key).headroom


def test_profile_warns_when_the_check_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """``memtune.profile`` warns (never silent) where its own check is above the tolerance."""
    import memtune.tuner.measure.tune_module as face

    model, x = small()
    monkeypatch.setattr(face, "peak_check", lambda p: peak_check(with_measured(p, 1.5)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        memtune.profile(model, x, progress=False, warmup=0, repeats=1)
    assert any("memory check" in str(w.message) and "under-predicts" in str(w.message) for w in caught)


def test_the_job_pages_profile_carries_the_check(profile: Profile) -> None:
    """``GET /v1/profiles/{id}`` (what the job page draws) carries the check, marked where it is off; a profile that
    measured no step carries none."""
    from datetime import UTC, datetime

    from memtune.api.service._views import profile_public
    from memtune.storage.records import ProfileRecord

    def public(p: Profile) -> Any:
        record = ProfileRecord(1, "m", p.device.key, p.batch, p.dtype, p.source, p.to_json(), datetime.now(UTC))
        return profile_public(record).memory_check

    ok, off = public(profile), public(with_measured(profile, 1.25))
    assert ok is not None and not ok.reported and ok.measured_bytes == profile.step_peak.allocated_bytes  # type: ignore[union-attr]
    assert (
        off is not None and off.reported and off.gap == pytest.approx(0.25, abs=1e-3) and "under-predicts" in off.text
    )
    assert public(profile.model_copy(update={"step_peak": None})) is None

"""The bound's unanswered linear program is its own error, ``BoundError`` (NOTE [ Budget bound ]):
``step_lower_bound`` raises it, and the pipeline catches it alone (the plan stands without its bound) while any other
failure of the bound shows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import scipy.optimize
from profiles import conv_profile

from memtune.profiler import Profile
from memtune.tuner import BoundError, Simulator, TunerError
from memtune.tuner.bound import step_lower_bound
from memtune.tuner.pipeline import tune_profiles
from memtune.tuner.plan import Plan


def _case() -> tuple[Profile, int]:
    profile = conv_profile(blocks=2)
    peak = Simulator(profile).run(Plan.uniform(profile.n_stages)).peak_bytes
    return profile, int(peak * 0.7)


def _unsolved(*args: object, **kwargs: object) -> SimpleNamespace:
    """What SciPy's ``linprog`` returns when it stops without an answer (status 4: numerical difficulties)."""
    return SimpleNamespace(status=4, message="numerical difficulties (test)", x=None)


def test_a_solver_without_an_answer_raises_bound_error(monkeypatch: pytest.MonkeyPatch) -> None:
    profile, budget = _case()
    monkeypatch.setattr(scipy.optimize, "linprog", _unsolved)
    with pytest.raises(BoundError, match="not solved: numerical difficulties"):
        step_lower_bound(Simulator(profile), budget)
    assert issubclass(BoundError, TunerError) and not issubclass(BoundError, RuntimeError)


def test_tune_profiles_serves_the_plan_without_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    profile, budget = _case()
    monkeypatch.setattr(scipy.optimize, "linprog", _unsolved)
    tuned = tune_profiles(profile, budget, trials=10, headroom=0.0, progress=False)
    assert tuned.bound is None and tuned.plan is not None
    assert "the lower bound" not in str(tuned)


def test_another_failure_of_the_bound_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    profile, budget = _case()

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("broken solver (test)")

    monkeypatch.setattr(scipy.optimize, "linprog", broken)
    with pytest.raises(RuntimeError, match="broken solver"):
        tune_profiles(profile, budget, trials=10, headroom=0.0, progress=False)

"""NOTE [ Bound beside the search ]: ``memtune tune``'s lower bound from a forked child, or computed in the process."""

from __future__ import annotations

import sys
import time

import pytest
from profiles import conv_profile

import memtune.tuner.bound
from memtune.api.cli._bound_beside import BoundBeside
from memtune.profiler import Profile
from memtune.tuner import BoundError, Simulator
from memtune.tuner.plan import Plan

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no fork start method")


def _case() -> tuple[Profile, int]:
    profile = conv_profile(blocks=2)
    peak = Simulator(profile).run(Plan.uniform(profile.n_stages)).peak_bytes
    return profile, int(peak * 0.7)


def test_the_child_gives_the_bound_the_process_computes(monkeypatch: pytest.MonkeyPatch) -> None:
    profile, budget = _case()
    expected = memtune.tuner.bound.step_lower_bound(Simulator(profile, "sgd"), budget)
    beside = BoundBeside(profile, "sgd", budget)  # forked here, with the real bound
    # from now on the process itself could not compute it: the answer must be the child's
    monkeypatch.setattr(memtune.tuner.bound, "step_lower_bound", lambda *a: pytest.fail("computed in the process"))
    assert beside.result() == expected


def test_a_child_that_fails_leaves_the_bound_to_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    profile, budget = _case()
    real = memtune.tuner.bound.step_lower_bound
    monkeypatch.setattr(memtune.tuner.bound, "step_lower_bound", lambda *a: (_ for _ in ()).throw(ValueError("broken")))
    beside = BoundBeside(profile, "sgd", budget)  # the child inherits the broken bound
    monkeypatch.setattr(memtune.tuner.bound, "step_lower_bound", real)
    assert beside.result() == real(Simulator(profile, "sgd"), budget)


def test_any_other_runtime_error_in_the_child_leaves_the_bound_to_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only ``BoundError`` is the solver's giving no answer; another ``RuntimeError`` is a failure of the child."""
    profile, budget = _case()
    real = memtune.tuner.bound.step_lower_bound
    monkeypatch.setattr(memtune.tuner.bound, "step_lower_bound", lambda *a: (_ for _ in ()).throw(RuntimeError("x")))
    beside = BoundBeside(profile, "sgd", budget)
    monkeypatch.setattr(memtune.tuner.bound, "step_lower_bound", real)
    assert beside.result() == real(Simulator(profile, "sgd"), budget)


def test_the_solvers_failure_in_the_child_is_the_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    profile, budget = _case()

    def no_answer(*args: object) -> None:
        raise BoundError("the budget bound's linear program was not solved: test")

    monkeypatch.setattr(memtune.tuner.bound, "step_lower_bound", no_answer)
    beside = BoundBeside(profile, "sgd", budget)
    with pytest.raises(BoundError, match="not solved: test"):
        beside.result()


def test_closing_stops_a_child_still_at_work(monkeypatch: pytest.MonkeyPatch) -> None:
    profile, budget = _case()
    monkeypatch.setattr(memtune.tuner.bound, "step_lower_bound", lambda *a: time.sleep(60))
    beside = BoundBeside(profile, "sgd", budget)
    proc = beside._proc
    assert proc is not None and proc.is_alive()
    t0 = time.monotonic()
    beside.close()
    assert not proc.is_alive() and time.monotonic() - t0 < 10
    beside.close()  # twice is fine

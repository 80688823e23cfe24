"""A recomputed stage priced as measured (NOTE [ Recompute priced as measured ] in ``memtune.tuner.simulator``): a
module
profile times each stage's backward under recompute, and the simulator charges that re-run and its transient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memtune.profiler._profile import Profile
from memtune.profiler.module_profile import _recompute_step_ms, as_inputs, profile_module
from memtune.tuner.bound import step_lower_bound
from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import Simulator
from memtune.tuner.stage_choices import selective_pays


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


@pytest.fixture(scope="module")
def profile() -> Profile:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.1), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8)
    )
    return profile_module(model, torch.randn(512, 64), loss_fn=_loss, stages=["0", "1", "3", "4", "5"], repeats=3)


def test_every_stage_with_a_backward_is_measured_under_recompute(profile: Profile) -> None:
    for s in profile.stages:
        assert s.recompute_backward_ms is not None and s.recompute_backward_bytes is not None, s.name
        assert s.recompute_extra_ms == max(0.0, s.recompute_backward_ms - s.backward_ms)
        # its re-run makes again what the stage saves: the transient holds at least the largest of them
        own = [t.bytes for t in profile.storages if t.saved_by == (s.index,) and t.producer == s.index]
        assert s.recompute_backward_bytes >= max(own, default=0), s.name


def test_the_simulator_charges_the_measured_rerun(profile: Profile) -> None:
    n = profile.n_stages
    extras = [s.recompute_extra_ms or 0.0 for s in profile.stages]
    plain = sum(s.forward_ms + s.backward_ms for s in profile.stages) + (profile.loss_ms or 0.0)
    # the whole step with every stage recomputed measured 2.5x what the stages' own re-runs add up to
    whole = profile.model_copy(update={"recompute_step_ms": plain + 2.5 * sum(extras)})
    assert whole.recompute_rerun_scale == pytest.approx(2.5)
    assert profile.recompute_step_ms is None and profile.recompute_rerun_scale == 1.0  # modeled: no clock
    for prof, scale in ((profile, 1.0), (whole, 2.5)):
        sim = Simulator(prof)
        keep, rec = sim.run(Plan.uniform(n)), sim.run(Plan.uniform(n, Action.RECOMPUTE))
        assert rec.recompute_ms == pytest.approx(sum(extras) * scale * sim.compute_scale)
        assert rec.step_ms - keep.step_ms == pytest.approx(rec.recompute_ms, abs=1e-9)
    # without the measurement the re-run is the stage's forward, as in a chain profile
    bare = profile.model_copy(
        update={
            "stages": tuple(
                s.model_copy(update={"recompute_backward_ms": None, "recompute_backward_bytes": None})
                for s in profile.stages
            )
        }
    )
    unmeasured = Simulator(bare).run(Plan.uniform(n, Action.RECOMPUTE))
    assert unmeasured.recompute_ms == pytest.approx(sum(s.forward_ms for s in profile.stages) * sim.compute_scale)


def test_the_whole_step_is_timed_with_every_stage_recomputed() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    stages = [model[0], model[2]]
    calls = {"n": 0}
    first = stages[0].forward

    def counted(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        return first(*args, **kwargs)

    stages[0].forward = counted  # type: ignore[method-assign]
    ms = _recompute_step_ms(model, as_inputs(torch.randn(8, 16)), _loss, "float32", torch.device("cpu"), (0, 2), stages)
    assert ms is not None and ms > 0
    assert calls["n"] == 4  # two steps, each stage run twice: forward and its re-run in backward
    assert stages[0].forward is counted and "forward" not in stages[1].__dict__  # left as found


def test_a_measured_transient_above_the_plain_one_raises_the_peak(profile: Profile) -> None:
    n = profile.n_stages
    plan = Plan.from_actions(["k", "r", "k", "k", "k"])
    base = Simulator(profile).run(plan).peak_bytes
    big = 1 << 30
    stages = list(profile.stages)
    stages[1] = stages[1].model_copy(update={"recompute_backward_bytes": big})
    heavy = Simulator(profile.model_copy(update={"stages": tuple(stages)})).run(plan).peak_bytes
    assert heavy > base and heavy >= big - stages[1].output_bytes
    assert (
        Simulator(profile).run(Plan.uniform(n)).peak_bytes
        == Simulator(profile.model_copy(update={"stages": tuple(stages)})).run(Plan.uniform(n)).peak_bytes
    )  # a kept stage never pays it


def test_selective_is_offered_against_the_measured_rerun(profile: Profile) -> None:
    k = 1  # a GELU: selective would keep nothing of it and re-run it in 1 ms more
    st = profile.stages[k].model_copy(
        update={
            "selective_saved_bytes": 0,
            "selective_forward_ms": profile.stages[k].forward_ms,
            "selective_backward_ms": profile.stages[k].backward_ms + 1.0,
        }
    )

    def with_rerun(extra_ms: float) -> Profile:
        changed = st.model_copy(update={"recompute_backward_ms": st.backward_ms + extra_ms})
        return profile.model_copy(update={"stages": tuple(changed if s.index == k else s for s in profile.stages)})

    assert selective_pays(with_rerun(2.0), k)  # recompute's measured re-run dearer than selective's 1 ms
    assert not selective_pays(with_rerun(0.5), k)


def test_the_bound_stays_below_the_simulated_recompute_plan(profile: Profile) -> None:
    sim = Simulator(profile)
    rec = sim.run(Plan.uniform(profile.n_stages, Action.RECOMPUTE))
    assert step_lower_bound(sim, rec.peak_bytes).step_ms <= rec.step_ms + 1e-9

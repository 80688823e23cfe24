"""The ``selective`` action (NOTE [ Selective stages ] in ``memtune.profiler.selective``): what it means for storages,
the
simulator's accounting of it, and the search offering it only where it frees memory."""

from __future__ import annotations

import pytest

from memtune.api.cli import resolve_profile
from memtune.profiler._profile import Profile
from memtune.profiler.zoo import build
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Action, Plan, resolve_storages
from memtune.tuner.search import Candidate, tune
from memtune.tuner.simulator import Simulator, simulate
from memtune.tuner.stage_choices import selective_gain_bytes, selective_pays, stage_actions


@pytest.fixture(scope="module")
def gpt() -> Profile:
    """The committed H200 GPT bf16 profile, whose blocks carry measured selective fields."""
    return resolve_profile(build("gpt", {}), 16, "bfloat16", "h200")


@pytest.mark.slow
def test_the_h200_profile_measured_what_a_selective_block_keeps(gpt: Profile) -> None:
    block = gpt.stages[3]
    assert block.kind == "transformer" and block.selective_saved_bytes is not None
    # qkv, attention (output and log-sum-exp), projection, fc1, fc2: 321 MiB of the block's 601 MiB, which
    # include its 64 MiB fp32 input
    assert block.selective_saved_bytes == 336_592_912
    assert selective_gain_bytes(gpt, 3) == block.saved_bytes - (64 << 20) - block.selective_saved_bytes
    assert selective_gain_bytes(gpt, gpt.n_stages - 1) == 0  # the head would keep its logits
    # in bf16 the caching mode costs more than the block's forward, which recompute re-runs to free more
    assert not selective_pays(gpt, 3) and all(Action.SELECTIVE not in acts for acts in stage_actions(gpt))
    fp32 = resolve_profile(build("gpt", {}), 16, "float32", "h200")
    assert selective_pays(fp32, 3) and Action.SELECTIVE in stage_actions(fp32)[3]


def test_a_selective_stage_saves_nothing_of_its_own_and_holds_its_input(gpt: Profile) -> None:
    n = gpt.n_stages
    actions = [Action.KEEP] * n
    actions[3] = Action.SELECTIVE
    fates = resolve_storages(gpt, actions)
    inp = gpt.stages[2].output_storage
    own = [sid for sid, s in enumerate(gpt.storages) if s.saved_by == (3,) and sid != inp]
    assert own and all(fates[sid].fate == "none" for sid in own)
    assert inp is not None and fates[inp].fate == "keep" and fates[inp].need == fates[inp].release == 3
    actions[3] = Action.RECOMPUTE  # a one-stage segment holds the same input, and re-makes what it saves
    assert resolve_storages(gpt, actions)[inp] == fates[inp]


def test_the_simulator_frees_the_gain_and_charges_the_measured_time(gpt: Profile) -> None:
    sim = Simulator(gpt)
    n = gpt.n_stages
    keep = Plan.uniform(n)
    sel = Plan.from_actions(["k"] * 3 + ["s"] + ["k"] * (n - 4))
    a, b = sim.run(keep, timeline=True), sim.run(sel, timeline=True)

    def before_loss(r: object) -> int:
        return next(live for _, live, label in r.timeline if label == "loss forward")  # type: ignore[attr-defined]

    assert before_loss(a) - before_loss(b) == selective_gain_bytes(gpt, 3)
    st = gpt.stages[3]
    assert st.selective_forward_ms is not None and st.selective_backward_ms is not None
    extra = (st.selective_forward_ms - st.forward_ms) + (st.selective_backward_ms - st.backward_ms)
    assert b.step_ms - a.step_ms == pytest.approx(extra * sim.compute_scale, rel=1e-9)
    assert b.recompute_ms == pytest.approx((st.selective_backward_ms - st.backward_ms) * sim.compute_scale)
    live: dict[object, int] = {}
    for op, key, nbytes in b.blocks:
        if op == "alloc":
            live[key] = nbytes
        else:
            assert live.pop(key) == nbytes
    assert ("sel", 3) not in live


def test_a_plan_cannot_make_an_unmeasured_stage_selective() -> None:
    prof = resolve_profile(build("vgg16", {}), 256, "float32", "h200")
    plan = Plan.from_actions(["s"] + ["k"] * (prof.n_stages - 1))
    with pytest.raises(PlanError, match=r"stage 0 \(features.0\) is 'selective'"):
        simulate(prof, plan)
    assert all(Action.SELECTIVE not in acts for acts in stage_actions(prof))


@pytest.mark.slow
def test_the_search_takes_selective_stages_where_they_are_cheap(gpt: Profile) -> None:
    """With the measured costs the search's trials leave GPT bf16's blocks to keep, offload and recompute (the
    caching mode costs more than a block's forward); made as cheap as a plain pass, selective stages win at 60% of
    the peak in the simulator (searched without allocator prices: NOTE [ One objective ] in
    ``memtune.tuner.search``)."""
    budget = int(0.6 * simulate(gpt, Plan.uniform(gpt.n_stages)).peak_bytes)

    def fastest(prof: Profile) -> Candidate:
        front = [c for c in tune(prof, budget, trials=60, seed=0, placement=False).pareto if c.peak_bytes <= budget]
        return min(front, key=lambda c: c.step_ms)

    measured = fastest(gpt)
    cheap_stages = tuple(
        s.model_copy(update={"selective_forward_ms": s.forward_ms, "selective_backward_ms": s.backward_ms + 0.05})
        if s.selective_saved_bytes is not None
        else s
        for s in gpt.stages
    )
    cheap = fastest(gpt.model_copy(update={"stages": cheap_stages}))
    blocks = [k for k, st in enumerate(gpt.stages) if st.kind == "transformer"]
    assert not any(measured.plan.actions[k] is Action.SELECTIVE for k in blocks), measured.plan.compact()
    assert any(cheap.plan.actions[k] is Action.SELECTIVE for k in blocks), cheap.plan.compact()
    assert cheap.step_ms < measured.step_ms

"""Per-stage prefetch lookaheads (NOTE [ Prefetch lookahead ]) and the per-layer trigger that chooses them (NOTE
[ Per-layer prefetch trigger ]): the plan knob, the simulator's pricing, the trigger's guarantees, the search."""

from __future__ import annotations

import itertools
import random

import optuna
import pytest
from chains import MiB, linear_chain
from profiles import conv_profile

from memtune.profiler import Profile
from memtune.tuner import PrefetchTrigger, prefetch_trigger
from memtune.tuner._prefetch_trigger import need_stages
from memtune.tuner.plan import Action, Plan
from memtune.tuner.search import Candidate, _params_for, _Search
from memtune.tuner.simulator import SimResult, Simulator

optuna.logging.set_verbosity(optuna.logging.WARNING)

SLOW_STAGE = 3  # the stage whose saved input takes SLOW_COPY_MS to come back


def slow_copy_chain(n: int = 8, slow_copy_ms: float = 6.0, copy_ms: float = 0.5) -> Profile:
    """``linear_chain(n)`` (1 ms forward, 2 ms backward per stage, 100 MiB per storage) whose stage ``SLOW_STAGE``
    brings its saved input back in ``slow_copy_ms`` and every other stage in ``copy_ms``: that layer alone needs an
    early prefetch (three stages of backward for 6 ms), the rest hide behind one stage."""
    p = linear_chain(n, forward_ms=1.0, copy_ms=copy_ms)
    stages = list(p.stages)
    stages[SLOW_STAGE] = stages[SLOW_STAGE].model_copy(update={"h2d_ms": slow_copy_ms})
    return p.model_copy(update={"stages": tuple(stages)})


def offload_middle(n: int = 8, **knobs: object) -> Plan:
    """Keep the first and last stage, offload the rest (deferred sync, one stage of overlap)."""
    return Plan.from_actions("k" + "o" * (n - 2) + "k", **{"sync": "deferred", "sync_delay": 1, **knobs})


# ---- the plan knob ---------------------------------------------------------------------------------
def test_per_stage_lookaheads_round_trip_json() -> None:
    plan = Plan.from_actions("kook", prefetch_lookaheads=(0, 3, 1, 1024), label="trigger")
    again = Plan.model_validate_json(plan.model_dump_json())
    assert again == plan and again.prefetch_lookaheads == (0, 3, 1, 1024)


def test_a_plan_without_the_field_still_loads() -> None:
    data = Plan.from_actions("kook", prefetch_lookahead=3).model_dump(mode="json")
    del data["prefetch_lookaheads"]
    plan = Plan.model_validate(data)
    assert plan.prefetch_lookaheads is None and plan.schema_version == 1
    assert plan.stage_lookaheads() == (3, 3, 3, 3)


def test_the_lookaheads_must_match_the_actions() -> None:
    with pytest.raises(ValueError, match=r"prefetch_lookaheads has 3 values but the plan has 4 actions"):
        Plan.from_actions("kook", prefetch_lookaheads=(1, 2, 3))


@pytest.mark.parametrize("bad", [-1, 1025])
def test_each_lookahead_is_within_0_to_1024(bad: int) -> None:
    with pytest.raises(ValueError, match=rf"prefetch_lookaheads\[2\] is {bad}: a lookahead is 0\.\.1024 stages"):
        Plan.from_actions("kook", prefetch_lookaheads=(1, 2, bad, 0))


def test_stage_lookaheads_apply_the_rule() -> None:
    assert Plan.from_actions("kok", prefetch_lookahead=2).stage_lookaheads() == (2, 2, 2)
    assert Plan.from_actions("kok", prefetch_lookaheads=(0, 5, 1)).stage_lookaheads() == (0, 5, 1)
    inline = Plan.from_actions("kok", sync="inline", prefetch_lookaheads=(0, 5, 1))
    assert inline.stage_lookaheads() == (0, 0, 0)  # fetched on demand


# ---- the simulator ---------------------------------------------------------------------------------
def _random_plans(n: int, rng: random.Random, count: int) -> list[Plan]:
    plans = []
    for _ in range(count):
        actions = tuple(rng.choice((Action.KEEP, Action.OFFLOAD, Action.OFFLOAD, Action.RECOMPUTE)) for _ in range(n))
        sync = rng.choice(("deferred", "layer", "points", "inline"))
        knobs: dict[str, object] = {"sync": sync, "sync_delay": rng.randint(0, 3)}
        if sync == "points":
            knobs["sync_points"] = tuple(sorted(rng.sample(range(n), 2)))
        plans.append(Plan(actions=actions, **knobs))  # type: ignore[arg-type]
    return plans


@pytest.mark.parametrize("profile", [linear_chain(7, forward_ms=1.0), conv_profile(), slow_copy_chain()])
def test_equal_per_stage_lookaheads_are_the_global_one(profile: Profile) -> None:
    sim = Simulator(profile)
    for plan in _random_plans(profile.n_stages, random.Random(3), 12):
        for lookahead in (0, 1, 2, 5):
            one = sim.run(plan.with_(prefetch_lookahead=lookahead), timeline=True)
            each = sim.run(plan.with_(prefetch_lookaheads=(lookahead,) * profile.n_stages), timeline=True)
            assert one == each, (plan.compact(), plan.sync, lookahead)


def test_a_stage_lookahead_moves_only_that_stages_prefetch() -> None:
    p = slow_copy_chain()
    sim = Simulator(p)
    base = sim.run(offload_middle(prefetch_lookahead=1))
    assert base.backward_stalls_ms[SLOW_STAGE] == pytest.approx(4.0)  # 6 ms copy behind one 2 ms backward stage
    early = [1] * 8
    early[SLOW_STAGE] = 3
    r = sim.run(offload_middle(prefetch_lookaheads=tuple(early)))
    assert r.backward_stalls_ms[SLOW_STAGE] == 0.0 and r.stall_ms < base.stall_ms
    # issued at stage 6 behind stage 5's 0.5 ms copy, the slow copy ends 6.5 ms into the backward; stage 4's copy,
    # issued at stage 5, waits for it on the one copy engine: ready at 7 ms, while stage 4's backward is due at 4 ms
    assert r.backward_stalls_ms[SLOW_STAGE + 1] == pytest.approx(3.0) and r.stall_ms == pytest.approx(3.0)
    assert r.peak_bytes > base.peak_bytes  # the buffer is held two stages longer
    # stage 0 keeps and stage 7 saves nothing offloaded: their lookaheads change nothing
    assert SLOW_STAGE in need_stages(p, offload_middle()) and 0 not in need_stages(p, offload_middle())
    other = list(early)
    other[0] = other[7] = 6
    assert sim.run(offload_middle(prefetch_lookaheads=tuple(other))) == r


def test_prefetches_issued_together_are_queued_by_need() -> None:
    """NOTE [ Prefetch lookahead ]: at lookahead 4 the slow storage is issued at the backward's first stage with the
    ones stages 6 and 5 need; those go first, as the runtime issues them, so nothing stalls."""
    sim = Simulator(slow_copy_chain())
    three, four = (sim.run(offload_middle(prefetch_lookahead=la)) for la in (3, 4))
    assert three.stall_ms == four.stall_ms == 0.0
    assert four.peak_bytes > three.peak_bytes


# ---- the trigger -----------------------------------------------------------------------------------
def _best_global(sim: Simulator, plan: Plan, budget: int) -> SimResult | None:
    """The fastest plan of one global lookahead (0 .. the last stage) within ``budget``, the lowest peak of equals."""
    fits = [r for la in range(sim.n) if (r := sim.run(plan.with_(prefetch_lookahead=la))).peak_bytes <= budget]
    return min(fits, key=lambda r: (r.step_ms, r.peak_bytes), default=None)


def test_the_trigger_fits_and_never_stalls_more_than_the_best_global_lookahead() -> None:
    p = slow_copy_chain()
    sim = Simulator(p)
    plan = offload_middle()
    less_stall = lower_peak = 0
    for budget_mib in range(640, 1250, 10):
        budget = budget_mib * MiB
        trig = prefetch_trigger(p, plan, budget, simulator=sim)
        best = _best_global(sim, plan, budget)
        assert trig.result == sim.run(trig.plan)  # the result is the plan's
        if best is None:
            assert not trig.fits
            continue
        assert trig.fits and trig.result.peak_bytes <= budget
        assert trig.result.stall_ms <= best.stall_ms + 1e-9 and trig.result.step_ms <= best.step_ms + 1e-9
        less_stall += trig.result.stall_ms < best.stall_ms - 1e-9
        lower_peak += trig.result.stall_ms == best.stall_ms and trig.result.peak_bytes < best.peak_bytes
    assert less_stall > 0 and lower_peak > 0


def test_the_long_copy_comes_back_earliest() -> None:
    """At 880 MiB a global lookahead of 3 (no stall) does not fit; 2 stalls 2 ms on the slow layer. Per layer, the
    slow layer's copy comes back three stages ahead (6 ms behind three 2 ms backward stages); the copies needed
    before it all come at the backward's first stage, so none of them queues behind it; the two needed after it
    one stage ahead (a 0.5 ms copy hides behind one stage, and none at all would stall): nothing stalls."""
    p = slow_copy_chain()
    budget = 880 * MiB
    best = _best_global(Simulator(p), offload_middle(), budget)
    assert best is not None and best.stall_ms == pytest.approx(2.0)
    trig = prefetch_trigger(p, offload_middle(), budget)
    assert isinstance(trig, PrefetchTrigger) and trig.fits
    assert trig.result.stall_ms == 0.0 and trig.start_lookahead == 2
    la = trig.plan.prefetch_lookaheads
    assert la is not None and need_stages(p, trig.plan) == [1, 2, 3, 4, 5, 6]
    assert la[SLOW_STAGE] == 3
    assert [k + la[k] for k in (4, 5, 6)] == [7, 7, 7] and la[1] == la[2] == 1


def test_the_trigger_only_changes_lookaheads() -> None:
    p = slow_copy_chain()
    plan = offload_middle(label="mine", sync_delay=2)
    trig = prefetch_trigger(p, plan, 900 * MiB)
    assert trig.plan.model_dump(exclude={"prefetch_lookaheads"}) == plan.model_dump(exclude={"prefetch_lookaheads"})


@pytest.mark.parametrize("seed", range(4))
def test_random_chains_and_plans_never_lose_to_the_global_lookahead(seed: int) -> None:
    rng = random.Random(seed)
    n = 7
    p = slow_copy_chain(n, slow_copy_ms=rng.uniform(1.0, 9.0), copy_ms=rng.uniform(0.2, 2.0))
    sim = Simulator(p)
    for plan, fraction in itertools.product(_random_plans(n, rng, 4), (0.5, 0.7, 0.9)):
        plan = plan.with_(sync=rng.choice(("deferred", "layer")))
        budget = int(fraction * sim.run(Plan.uniform(n)).peak_bytes)
        trig = prefetch_trigger(p, plan, budget, simulator=sim)
        best = _best_global(sim, plan, budget)
        if best is not None and need_stages(p, plan):
            assert trig.fits and trig.result.step_ms <= best.step_ms + 1e-9, (plan.compact(), fraction)


def test_a_plan_that_prefetches_nothing_comes_back_as_it_is() -> None:
    p = slow_copy_chain()
    for plan in (Plan.uniform(8), offload_middle(sync="inline")):
        trig = prefetch_trigger(p, plan, 1 << 40)
        assert trig.plan is plan and trig.simulations == 1 and trig.fits


def test_the_trigger_refuses_a_simulator_of_another_profile() -> None:
    with pytest.raises(ValueError, match="another profile"):
        prefetch_trigger(slow_copy_chain(), offload_middle(), 1 << 30, simulator=Simulator(linear_chain(8)))


# ---- the search ------------------------------------------------------------------------------------
def test_the_search_takes_the_trigger_where_it_scores_better_and_records_it() -> None:
    p = slow_copy_chain()
    budget = 880 * MiB
    search = _Search(p, budget, "fastest", 0, "sgd")
    plan = offload_middle(prefetch_lookahead=2, label="optuna")
    r = search.evaluate(plan)
    taken, r2 = search.per_layer(plan, r, budget)
    assert taken.prefetch_lookaheads is not None and r2.step_ms < r.step_ms and r2.peak_bytes <= budget
    assert _params_for(taken)["per_layer_prefetch"] is True and _params_for(plan)["per_layer_prefetch"] is False
    # a trial records the per-stage lookaheads, and the plan is rebuilt from its attributes
    c = Candidate("trial 0", taken, r2.step_ms, r2.peak_bytes, True)
    dists = search.distributions()
    params = {k: v for k, v in _params_for(taken).items() if k in dists}
    trial = optuna.trial.create_trial(
        value=c.step_ms, params=params, distributions={k: dists[k] for k in params}, user_attrs=search.trial_attrs(c)
    )
    assert search._candidate(trial).plan == taken
    # a plan that fits and never waits for a prefetch is left alone in the fastest mode
    calm = offload_middle(prefetch_lookahead=3)
    assert search.per_layer(calm, search.evaluate(calm), 2 << 30)[0] is calm


# ---- the GPU benchmark's choice of plans -----------------------------------------------------------
def test_the_benchmark_parses_its_configs() -> None:
    from benchmarks.prefetch_trigger import Config, parse_config

    assert parse_config("resnet50:128:float32:0.5") == Config("resnet50", 128, "float32", 0.5)
    for bad in ("resnet50:128:float32", "resnet50:x:float32:0.5", "resnet50:128:float32:1.5"):
        with pytest.raises(ValueError, match=r"model:batch:dtype:fraction|must be in"):
            parse_config(bad)


def test_the_benchmark_keeps_plans_whose_trigger_beats_the_best_global_lookahead() -> None:
    from benchmarks.prefetch_trigger import variants_for

    p = slow_copy_chain()
    budget = 880 * MiB
    chosen = variants_for(p, budget, budget, trials=12, headroom=0.0, plans=2)
    assert chosen
    for rows in chosen:
        assert rows[0].variant.startswith("own (lookahead") and rows[-1].variant == "per-layer"
        per_layer = rows[-1]
        assert per_layer.plan.prefetch_lookaheads is not None and per_layer.simulated_peak_bytes <= budget
        assert all(v.plan.actions == per_layer.plan.actions for v in rows)
        fitting = [v for v in rows[:-1] if v.simulated_peak_bytes <= budget]
        assert all(per_layer.simulated_step_ms <= v.simulated_step_ms + 1e-9 for v in fitting)

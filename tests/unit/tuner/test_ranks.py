"""Data-parallel plans over a shared host link (NOTE [ Shared host link ] in ``memtune.tuner._ranks``) on hand-made
profiles.

One rank is the single-GPU simulator; lockstep ranks see every copy N-contended; staggering lowers the time copies
lose to sharing; the all-reduce and DDP's buckets are checked against hand computations.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from profiles import DEVICE, Layer, MiB, chain_profile, conv_profile

from memtune.profiler import Profile
from memtune.tuner import Action, Plan, SharedLink, ranks_prefetch_trigger, simulate, simulate_ranks, stagger_for
from memtune.tuner._link import ring_allreduce_ms
from memtune.tuner._tuner_errors import CalibrationError
from memtune.tuner.calibration import Calibration, install_calibration, uninstall_calibrations

BUS = 100.0  # GB/s, the all-reduce rate the tests pass where it is not the subject


@pytest.fixture(autouse=True)
def _no_installed() -> Iterator[None]:
    uninstall_calibrations()
    yield
    uninstall_calibrations()


def _offload_plan(profile: Profile, sync: str = "layer") -> Plan:
    n = profile.n_stages
    return Plan(actions=tuple(Action.OFFLOAD if k < n - 3 else Action.KEEP for k in range(n)), sync=sync)  # type: ignore[arg-type]


def _plans(profile: Profile) -> list[Plan]:
    n = profile.n_stages
    mixed = tuple([Action.OFFLOAD, Action.RECOMPUTE, Action.RECOMPUTE, Action.KEEP] * n)[:n]
    return [
        Plan.uniform(n),
        _offload_plan(profile),
        _offload_plan(profile, "deferred"),
        Plan(actions=mixed, sync="deferred", sync_delay=1, prefetch_lookahead=1),
        Plan(actions=(Action.OFFLOAD,) * n, sync="inline"),
    ]


def _compute_heavy() -> Profile:
    """Ten linear layers of 6 ms forward, each saving a 32 MiB input: 4 ms to copy out, 1 ms back."""
    return chain_profile([Layer(f"l{i}", "linear", 6.0, 32, 1, saves_input=True) for i in range(10)])


def _doubled(profile: Profile) -> Profile:
    """``profile`` with every copy twice as long: what two ranks sharing a link fairly see in lockstep."""
    stages = tuple(st.model_copy(update={"d2h_ms": 2 * st.d2h_ms, "h2d_ms": 2 * st.h2d_ms}) for st in profile.stages)
    return profile.model_copy(update={"stages": stages})


def test_one_rank_is_the_single_gpu_simulator() -> None:
    p = conv_profile(2)
    lossy = SharedLink.from_table({"1": {"d2h": 8.0, "h2d": 30.0}, "2": {"d2h": 3.0, "h2d": 9.0}})
    for plan in _plans(p):
        alone = simulate(p, plan)
        for link in (None, lossy):
            r = simulate_ranks(p, plan, 1, link=link)
            assert (r.step_ms, r.compute_ms, r.peak_bytes) == (alone.step_ms, alone.step_ms, alone.peak_bytes)
            slot = r.slots[0].result
            assert slot.forward_stalls_ms == alone.forward_stalls_ms
            assert slot.backward_stalls_ms == alone.backward_stalls_ms
            assert (r.contention_ms, r.mean_copiers, r.allreduce_ms, r.bucket_bytes) == (0.0, 1.0, 0.0, 0)
            assert r.allreduce_gbps is None and r.rounds == 1


def test_lockstep_ranks_share_every_copy_and_the_step_slows_when_copies_saturate() -> None:
    p = conv_profile(2)  # its copies take longer than the compute beside them
    for plan in (_offload_plan(p), _offload_plan(p, "deferred")):
        alone = simulate(p, plan)
        two = simulate_ranks(p, plan, 2, allreduce_gbps=BUS)
        assert two.link_source == "fair share" and two.mean_copiers == 2.0
        # every copy twice as long, nothing else: the single-GPU simulation of the doubled profile
        assert two.compute_ms == pytest.approx(simulate(_doubled(p), plan).step_ms, abs=1e-9)
        assert two.compute_ms > alone.step_ms + 10.0
        assert two.slots[0].slowdown_d2h == pytest.approx(2.0) and two.slots[0].slowdown_h2d == pytest.approx(2.0)
        alone_copy_ms = sum(b - a for kind, _, a, b in simulate(p, plan, timeline=True).spans if kind != "backward")
        assert two.contention_ms == pytest.approx(alone_copy_ms)  # each copy lost its own length
        four = simulate_ranks(p, plan, 4, allreduce_gbps=BUS)
        assert four.compute_ms > two.compute_ms and four.contention_ms == pytest.approx(3 * alone_copy_ms)


def test_hidden_copies_are_shared_without_slowing_the_step() -> None:
    p = chain_profile([Layer(f"l{i}", "linear", 20.0, 16, 1, saves_input=True) for i in range(8)])
    plan = Plan(actions=(Action.OFFLOAD,) * 7 + (Action.KEEP,), sync="deferred", sync_delay=1)
    two = simulate_ranks(p, plan, 2, allreduce_gbps=BUS)
    assert two.contention_ms > 0 and two.compute_ms == pytest.approx(simulate(p, plan).step_ms)


def test_staggering_lowers_the_contended_time() -> None:
    for p in (conv_profile(2), _compute_heavy()):
        plan = _offload_plan(p)
        for ranks, slots in ((2, 2), (4, 2), (4, 4)):
            lockstep = simulate_ranks(p, plan, ranks, allreduce_gbps=BUS)
            staggered = simulate_ranks(p, plan, ranks, stagger_slots=slots, allreduce_gbps=BUS)
            assert staggered.contention_ms < lockstep.contention_ms, (ranks, slots)
            assert staggered.mean_copiers < lockstep.mean_copiers, (ranks, slots)
            assert staggered.slots[0].wait_ms == 0.0 and staggered.slots[-1].wait_ms > 0.0
            assert staggered.peak_bytes == lockstep.peak_bytes  # waits move no allocation


def test_staggering_pays_where_the_link_loses_rate_under_contention() -> None:
    """The paper's case: GPUs copying at once get less together than one alone; taking turns avoids it."""
    p = _compute_heavy()
    plan = _offload_plan(p)
    r1, h1 = DEVICE.d2h_gbps, DEVICE.h2d_gbps
    lossy = SharedLink.from_table(
        {
            "1": {"d2h": r1, "h2d": h1},
            "2": {"d2h": 0.3 * r1, "h2d": 0.3 * h1},
            "4": {"d2h": 0.12 * r1, "h2d": 0.12 * h1},
        }
    )
    for ranks in (2, 4):
        lockstep = simulate_ranks(p, plan, ranks, link=lossy, allreduce_gbps=BUS)
        staggered = simulate_ranks(p, plan, ranks, stagger_slots=ranks, link=lossy, allreduce_gbps=BUS)
        assert lockstep.link_source == "measured"
        assert staggered.step_ms < lockstep.step_ms - 10.0, ranks


def test_stagger_slots_and_waits_by_hand() -> None:
    link = SharedLink.from_table({"1": {"d2h": 50.0, "h2d": 50.0}, "2": {"d2h": 30.0, "h2d": 40.0}})
    st = [stagger_for(r, 4, 2, link) for r in range(4)]
    assert [s.slot for s in st] == [0, 1, 0, 1] and {s.copiers for s in st} == {2}
    assert st[1].d2h_gbps == 30.0 and st[1].h2d_gbps == 40.0
    assert st[0].delay_ms("d2h", 300_000_000) == 0.0
    assert st[3].delay_ms("d2h", 300_000_000) == pytest.approx(10.0)  # 0.3 GB at 30 GB/s
    assert st[3].delay_ms("h2d", 300_000_000) == pytest.approx(7.5)
    assert stagger_for(0, 3, 3, link).copiers == 1
    with pytest.raises(ValueError, match="slots"):
        stagger_for(0, 2, 3, link)
    with pytest.raises(ValueError, match="rank"):
        stagger_for(2, 2, 1, link)


def _params_in(stages: dict[int, int], n: int = 6) -> Profile:
    return chain_profile([Layer(f"l{k}", "linear", 1.0 + k, 8, stages.get(k, 0), saves_input=True) for k in range(n)])


def test_allreduce_of_the_last_gradients_is_all_exposed() -> None:
    p = _params_in({0: 40})  # the first stage's backward runs last
    plan = Plan.uniform(p.n_stages)
    r = simulate_ranks(p, plan, 4, allreduce_gbps=50.0)
    by_hand = 2 * 3 / 4 * (40 * MiB) / (50.0 * 1e6)  # ms
    assert r.allreduce_ms == pytest.approx(by_hand) and r.allreduce_exposed_ms == pytest.approx(by_hand)
    assert r.step_ms == pytest.approx(simulate(p, plan).step_ms + by_hand)
    assert r.allreduce_ms == pytest.approx(ring_allreduce_ms(40 * MiB, 4, 50.0))


def test_allreduce_overlaps_the_backward_bucket_by_bucket() -> None:
    p = _params_in({5: 3, 4: 2, 2: 6, 1: 1})
    plan = Plan.uniform(p.n_stages)
    bwd_end = {k: b for kind, k, _, b in simulate(p, plan, timeline=True).spans if kind == "backward"}
    # caps 2 MiB then 4 MiB, in backward order: {5} (3 MiB >= 2) closes at 5; {4, 3, 2} (8 >= 4) at 2; {1, 0} at 0
    r = simulate_ranks(p, plan, 2, allreduce_gbps=1.0, bucket_caps=(2 * MiB, 4 * MiB))
    ms = [ring_allreduce_ms(b * MiB, 2, 1.0) for b in (3, 8, 1)]
    t = bwd_end[5] + ms[0]
    t = max(t, bwd_end[2]) + ms[1]
    t = max(t, bwd_end[0]) + ms[2]
    compute = simulate(p, plan).step_ms
    assert r.allreduce_ms == pytest.approx(sum(ms))
    assert r.step_ms == pytest.approx(max(compute, t)) and r.allreduce_exposed_ms == pytest.approx(
        max(0.0, t - compute)
    )
    assert r.bucket_bytes == 12 * MiB and r.peak_bytes == simulate(p, plan).peak_bytes + 12 * MiB


def test_rates_come_from_the_calibration_and_the_allreduce_rate_is_required() -> None:
    p = conv_profile(1)
    plan = _offload_plan(p)
    with pytest.raises(CalibrationError, match=r"allreduce_gbps\.2") as err:
        simulate_ranks(p, plan, 2)
    assert err.value.field == "allreduce_gbps.2" and "benchmarks.shared_link" in str(err.value)
    install_calibration(
        {
            "gpu": DEVICE.key,
            "shared_link_gbps": {"1": {"d2h": 8.0, "h2d": 30.0}, "2": {"d2h": 6.0, "h2d": 20.0}},
            "allreduce_gbps": {"2": 90.0},
        }
    )
    r = simulate_ranks(p, plan, 2)
    assert (r.link_source, r.allreduce_gbps) == ("measured", 90.0)
    assert r.slots[0].slowdown_d2h == pytest.approx(8.0 / 6.0) and r.slots[0].slowdown_h2d == pytest.approx(1.5)


def test_shared_link_table_rules() -> None:
    link = SharedLink.from_table(
        {
            "1": {"d2h": 50, "h2d": 52, "both_d2h": 38, "both_h2d": 39},
            "2": {"d2h": 40, "h2d": 42},
            "4": {"d2h": 24, "h2d": 26},
        }
    )
    assert link.gbps("d2h", 1) == 50 and link.gbps("d2h", 3) == pytest.approx(32.0)  # halfway between 2 and 4
    assert link.gbps("h2d", 8) == pytest.approx(13.0)  # past 4: what four get together, shared by eight
    assert link.slowdown("d2h", 2) == pytest.approx(1.25) and link.both_gbps == ((1, 38.0, 39.0),)
    assert SharedLink.from_table(link.to_data()) == link
    fair = SharedLink.fair_share(40.0, 60.0)
    assert fair.gbps("d2h", 4) == 10.0 and fair.slowdown("h2d", 3) == pytest.approx(3.0) and fair.source == "fair share"
    bad = [
        ({"2": {"d2h": 1, "h2d": 1}}, "shared_link_gbps"),
        ({"1": {"d2h": 1}}, "shared_link_gbps.1.h2d"),
        ({"1": {"d2h": 1, "h2d": -2}}, "shared_link_gbps.1.h2d"),
        ({"0": {"d2h": 1, "h2d": 1}}, "shared_link_gbps.0"),
        ({"1": 5.0}, "shared_link_gbps.1"),
    ]
    for table, field in bad:
        with pytest.raises(CalibrationError) as err:
            Calibration.from_data({"gpu": "h100", "shared_link_gbps": table})
        assert err.value.field == field, table
    with pytest.raises(CalibrationError) as err:
        Calibration.from_data({"gpu": "h100", "allreduce_gbps": {"1": 5.0}})
    assert err.value.field == "allreduce_gbps.1"
    old = Calibration.from_data({"gpu": "h100", "headroom": 0.1})  # a file without the fields still loads
    assert old.shared_link is None and old.allreduce_gbps(2) is None


def test_swap_in_triggers_at_the_contended_rate() -> None:
    p = _compute_heavy()
    plan = _offload_plan(p, "deferred").with_(prefetch_lookahead=4)
    budget = simulate_ranks(p, plan, 2, allreduce_gbps=BUS).peak_bytes
    trig = ranks_prefetch_trigger(p, plan, 2, budget, allreduce_gbps=BUS)
    assert trig.fits and trig.plan.prefetch_lookaheads is not None
    before = simulate_ranks(p, plan, 2, allreduce_gbps=BUS)
    after = simulate_ranks(p, trig.plan, 2, allreduce_gbps=BUS)
    assert after.step_ms <= before.step_ms + 1e-9 and after.peak_bytes <= before.peak_bytes
    assert min(trig.plan.prefetch_lookaheads) < 4  # some prefetch moved later than the plan's

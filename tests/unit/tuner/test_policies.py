"""The baseline policies: each paper's rule checked on hand-made profiles (tests/unit/tuner/profiles.py)."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable

import pytest
from profiles import MiB, conv_profile

from memtune.profiler._profile import ConvAlgo, DeviceIdentity, Profile
from memtune.tuner._tuner_errors import TunerError
from memtune.tuner.plan import Action, ConvChoice, Plan, resolve_storages, segments
from memtune.tuner.policies import POLICIES, run_policy
from memtune.tuner.policies._checkpoint_sqrt import checkpoint_sqrt, sqrt_boundaries
from memtune.tuner.policies._layup import layup, layup_thresholds
from memtune.tuner.policies._none import none
from memtune.tuner.policies._save_on_cpu import save_on_cpu
from memtune.tuner.policies.hmms import capped_stages, hmms, hmms_schedule, offload_limit
from memtune.tuner.policies.layup_cumulative import cumulative_steps, layup_cumulative
from memtune.tuner.policies.storage_map import StorageMap, is_conv
from memtune.tuner.policies.vdnn import (
    conv_offload_stages,
    vdnn_all_m,
    vdnn_all_p,
    vdnn_conv_m,
    vdnn_conv_p,
)
from memtune.tuner.policies.vdnn_dyn import algo_ladder, conv_ladder, vdnn_dyn, vdnn_dyn_passes
from memtune.tuner.simulator import Simulator, simulate

NAMES = {
    "none",
    "vdnn_all_m",
    "vdnn_all_p",
    "vdnn_conv_m",
    "vdnn_conv_p",
    "vdnn_dyn",
    "layup",
    "layup_cumulative",
    "hmms",
    "checkpoint_sqrt",
    "save_on_cpu",
}


@pytest.fixture(scope="module")
def small() -> Profile:
    return conv_profile()


@pytest.fixture(scope="module")
def deep() -> Profile:
    return conv_profile(blocks=3)


def _fates(profile: Profile, plan: Plan) -> list[str]:
    return [f.fate for f in resolve_storages(profile, plan.actions)]


# ---- registry ---------------------------------------------------------------------------------------
def test_registry_has_every_policy_and_labels_plans(small: Profile, deep: Profile) -> None:
    assert set(POLICIES) == NAMES
    for profile in (small, deep):
        for budget in (0, 1, 250 * MiB, 10 << 30):  # never raises for budget reasons
            for name in POLICIES:
                plan = run_policy(name, profile, budget)
                plan.check(profile)
                assert plan.label == name
                assert len(plan.actions) == profile.n_stages
                assert run_policy(name, profile, budget) == plan  # deterministic


def test_run_policy_names_the_known_policies_on_a_typo(small: Profile) -> None:
    with pytest.raises(TunerError, match=r"unknown policy 'vdnn'.*vdnn_dyn"):
        run_policy("vdnn", small, 1 << 30)


def test_policies_import_no_torch() -> None:
    code = (
        "import sys, memtune.tuner.policies; assert 'torch' not in sys.modules, 'memtune.tuner.policies imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- shared storage helper ----------------------------------------------------------------------------
def test_storage_map_finds_stages_sharing_a_storage(small: Profile) -> None:
    m = StorageMap.of(small)
    assert m.sharers(2) == (1, 2)  # conv2's input is relu1's (in-place) output
    assert m.sharers(1) == (1, 2)
    assert m.sharers(0) == (0,)  # conv1 saves only the model input, which is always resident
    assert m.sharers(4) == (3, 4)  # pool saves relu2's output and its own indices
    assert m.saved[4] == (2, 4)
    assert m.first[4] == (4,)
    assert m.first[2] == ()
    assert m.output_storage(1) == 1 and m.output_storage(7) == 6
    # relu2 measured 8 ms for its 64 MiB; the indices are pool's whole S_i (2 ms)
    assert m.d2h_ms[2] == pytest.approx(8.0) and m.d2h_ms[4] == pytest.approx(2.0)
    assert m.saved_d2h_ms(4) == pytest.approx(10.0)
    assert [is_conv(s) for s in small.stages] == [True, False, True] + [False] * 5


# ---- none, save_on_cpu ----------------------------------------------------------------------------------
def test_none_keeps_everything(small: Profile) -> None:
    plan = none(small, 0)
    assert plan.compact() == "k" * 8 and plan.conv_rule == "default"
    assert set(_fates(small, plan)) <= {"keep", "none"}


def test_save_on_cpu_offloads_inline_without_prefetch(deep: Profile) -> None:
    plan = save_on_cpu(deep, 0)
    assert plan.compact() == "o" * deep.n_stages
    assert (plan.sync, plan.prefetch_lookahead) == ("inline", 0)
    base, cpu = simulate(deep, none(deep, 0)), simulate(deep, plan)
    assert cpu.peak_bytes < base.peak_bytes and cpu.step_ms > base.step_ms  # slower, smaller
    assert cpu.forward_ms - base.forward_ms == pytest.approx(sum(cpu.forward_stalls_ms))  # copies block


# ---- checkpoint_sqrt ----------------------------------------------------------------------------------
def test_checkpoint_sqrt_makes_about_sqrt_n_segments() -> None:
    for n in range(4, 400):
        kept = sqrt_boundaries(n)
        k = round(math.sqrt(n))
        assert len(kept) == k and kept[-1] == n - 1
        actions = [Action.KEEP if i in kept else Action.RECOMPUTE for i in range(n)]
        segs = segments(actions)
        assert len(segs) == k, n
        assert max(j - i + 1 for i, j in segs) <= math.ceil(n / k) - 1
    assert sqrt_boundaries(1) == (0,)
    with pytest.raises(ValueError, match="n=0"):
        sqrt_boundaries(0)


def test_checkpoint_sqrt_plan(small: Profile) -> None:
    plan = checkpoint_sqrt(small, 0)
    assert plan.compact() == "rrkrrkrk"  # 8 stages: round(sqrt 8) = 3 groups of 3, 3, 2
    assert len(segments(plan.actions)) == 3


# ---- vDNN static --------------------------------------------------------------------------------------
def test_vdnn_all_offloads_every_stage_with_layer_sync(small: Profile) -> None:
    for fn, rule in ((vdnn_all_m, "memory_optimal"), (vdnn_all_p, "fastest")):
        plan = fn(small, 0)
        assert plan.compact() == "o" * 8
        assert (plan.sync, plan.prefetch_lookahead, plan.conv_rule) == (
            "layer",
            1,
            rule,
        )
        # every storage but the model input and the unsaved logits leaves the GPU
        assert _fates(small, plan) == [
            "none",
            "offload",
            "offload",
            "offload",
            "offload",
            "offload",
            "none",
        ]


def test_vdnn_conv_offloads_conv_inputs_and_their_sharers(small: Profile, deep: Profile) -> None:
    # conv2's input (storage 1) is also saved by the in-place relu1: both must offload
    assert conv_offload_stages(small) == (0, 1, 2)
    for fn, rule in ((vdnn_conv_m, "memory_optimal"), (vdnn_conv_p, "fastest")):
        plan = fn(small, 0)
        assert plan.compact() == "oookkkkk" and plan.conv_rule == rule and plan.sync == "layer"
    fates = _fates(small, vdnn_conv_p(small, 0))
    assert fates[1] == "offload"  # conv2's input
    assert fates[2] == "keep" and fates[4] == "keep"  # relu2 / pool storages stay
    # why the sharers matter: offloading conv2 alone leaves its input on the GPU
    alone = Plan.from_actions("kkokkkkk")
    assert _fates(small, alone)[1] == "keep"
    # deeper: block b's conv1 saves the previous pool's output, which nobody else saves
    assert conv_offload_stages(deep) == (0, 1, 2, 5, 6, 7, 10, 11, 12)
    assert _fates(deep, vdnn_conv_p(deep, 0))[3] == "offload"  # block 0 pool output, block 1 conv1 input


# ---- vDNN dynamic -------------------------------------------------------------------------------------
def _passes(
    profile: Profile, budget: int, peak: Callable[[Plan], int] | None = None
) -> tuple[Plan, list[tuple[str, bool]]]:
    plan, records = vdnn_dyn_passes(profile, budget, peak=peak)
    return plan, [(r.name, r.fits) for r in records]


def test_vdnn_dyn_tries_its_passes_in_order_as_the_budget_tightens(
    deep: Profile,
) -> None:
    sim = Simulator(deep)
    peak = {name: sim.run(POLICIES[name](deep, 0)).peak_bytes for name in ("none", "vdnn_conv_p", "vdnn_all_p")}
    all_m = sim.run(vdnn_all_m(deep, 0)).peak_bytes
    assert peak["none"] > peak["vdnn_conv_p"] > peak["vdnn_all_p"] >= all_m  # the fixture separates them

    plan, trace = _passes(deep, peak["none"])
    assert trace == [("vdnn_all_m", True), ("none_p", True)]
    assert plan.compact() == "k" * deep.n_stages and plan.conv_rule == "fastest" and plan.label == "vdnn_dyn"

    plan, trace = _passes(deep, peak["none"] - 1)
    assert trace == [("vdnn_all_m", True), ("none_p", False), ("vdnn_conv_p", True)]
    assert plan.actions == vdnn_conv_p(deep, 0).actions and plan.conv_rule == "fastest"

    plan, trace = _passes(deep, peak["vdnn_conv_p"] - 1)
    assert trace == [
        ("vdnn_all_m", True),
        ("none_p", False),
        ("vdnn_conv_p", False),
        ("vdnn_all_p", True),
    ]
    assert plan.actions == vdnn_all_p(deep, 0).actions and plan.conv_rule == "fastest"

    plan, trace = _passes(deep, all_m - 1)  # not trainable: the least-memory pass is returned
    assert trace == [("vdnn_all_m", False)]
    assert plan.with_(label=None) == vdnn_all_m(deep, 0).with_(label=None)
    assert vdnn_dyn(deep, all_m - 1) == plan


def _workspace_peak(profile: Profile) -> Callable[[Plan], int]:
    """A stand-in training pass that charges convolution workspace: simulated peak + the largest workspace."""
    sim = Simulator(profile)

    def ws(algos: tuple[ConvAlgo, ...], pass_: str, choice: ConvChoice | None, rule: str) -> int:
        usable = [a for a in algos if a.pass_ == pass_ and a.status == "ok"]
        if choice is not None:
            algo = getattr(choice, pass_)
            return next(a.workspace_bytes for a in usable if a.algo == algo)
        if rule == "memory_optimal":
            return min(a.workspace_bytes for a in usable)
        return min(usable, key=lambda a: a.ms or 0.0).workspace_bytes

    def peak(plan: Plan) -> int:
        extra = 0
        for st in profile.stages:
            for c in st.convs:
                choice = plan.conv_algos.get(f"{st.index}.{c.name}")
                for p in ("fwd", "bwd_data", "bwd_filter"):
                    extra = max(extra, ws(c.algos, p, choice, plan.conv_rule))
        return sim.run(plan).peak_bytes + extra

    return peak


def test_conv_ladder_steps_down_the_largest_workspace_first(small: Profile) -> None:
    conv1, conv2 = small.stages[0].convs[0], small.stages[2].convs[0]
    assert [a.algo for a in algo_ladder(conv1.algos, "fwd")] == [1, 2, 0]
    assert [a.algo for a in algo_ladder(conv1.algos, "bwd_filter")] == [
        1,
        0,
    ]  # algo 3: slower and bigger
    assert [a.algo for a in algo_ladder(conv2.algos, "fwd")] == [
        1,
        0,
    ]  # the failed algo 5 is skipped
    steps = [(c.fwd, c.bwd_data, c.bwd_filter) for c in conv_ladder(conv1)]
    assert steps == [
        (1, 1, 1),
        (2, 1, 1),
        (2, 0, 1),
        (2, 0, 0),
        (0, 0, 0),
    ]  # workspace 100, 50, 20, 10, 0


def test_vdnn_dyn_greedy_downgrades_convs_in_forward_order(small: Profile, deep: Profile) -> None:
    # small: offloading saves nothing (its peak is in backward), so only cheaper algorithms help
    peak = _workspace_peak(small)
    base = Simulator(small).run(none(small, 0)).peak_bytes
    plan, trace = _passes(small, base + 45 * MiB, peak=peak)
    assert trace == [
        ("vdnn_all_m", True),
        ("none_p", False),
        ("vdnn_conv_p", False),
        ("vdnn_all_p", False),
        ("greedy_conv", True),
    ]
    assert plan.compact() == "oookkkkk"
    # conv1 stepped down until its largest workspace (20 MiB) is under conv2's fastest (40 MiB); conv2 untouched
    assert plan.conv_algos == {
        "0.": ConvChoice(fwd=2, bwd_data=0, bwd_filter=1),
        "2.": ConvChoice(fwd=1, bwd_data=0, bwd_filter=0),
    }
    assert peak(plan) <= base + 45 * MiB
    plan, _ = _passes(small, base + 15 * MiB, peak=peak)  # both convs all the way down
    assert plan.conv_algos["0."] == ConvChoice(fwd=0, bwd_data=0, bwd_filter=0)
    assert plan.conv_algos["2."] == ConvChoice(fwd=0, bwd_data=0, bwd_filter=0)

    # deep: vDNN_conv cannot fit even with memory-optimal algorithms, so the greedy pass moves to vDNN_all
    peak = _workspace_peak(deep)
    all_m = Simulator(deep).run(vdnn_all_m(deep, 0)).peak_bytes
    plan, trace = _passes(deep, all_m + 45 * MiB, peak=peak)
    assert [name for name, _ in trace] == [
        "vdnn_all_m",
        "none_p",
        "vdnn_conv_p",
        "vdnn_all_p",
        "greedy_conv",
        "greedy_all",
    ]
    assert [fits for _, fits in trace] == [True, False, False, False, False, True]
    assert plan.compact() == "o" * deep.n_stages and plan.sync == "layer"
    assert plan.conv_algos["0."] == ConvChoice(fwd=2, bwd_data=0, bwd_filter=1)


# ---- Layup --------------------------------------------------------------------------------------------
def test_layup_threshold_watershed_per_layer(small: Profile) -> None:
    # T_transfer (D2H of the stage's saved set) / T_forward, by hand:
    #   conv1 0 (model input only); relu1 8/0.5; conv2 8/10; relu2 8/0.5; pool (8+2)/1; fc1 2/1.25;
    #   relu3 0.5/0.1; fc2 0.5/0.25 = 2 exactly (>= 2: recompute)
    assert layup_thresholds(small) == pytest.approx((0.0, 16.0, 0.8, 16.0, 10.0, 1.6, 5.0, 2.0))
    plan = layup(small, 0)
    assert plan.compact() == "ororrorr" and plan.label == "layup" and plan.sync == "deferred"
    assert layup(small, 0, watershed=1.5).compact() == "ororrrrr"  # fc1's 1.6 crosses over
    with pytest.raises(ValueError, match="watershed"):
        layup(small, 0, watershed=0)


def test_layup_cumulative_follows_algorithm_1_step_by_step(small: Profile) -> None:
    steps = cumulative_steps(small)
    # a checkpoint copies its saved set and its output: conv1 8 (output), relu1 8, conv2 8+8, relu2 8,
    # pool 8+2 (+2 output), fc1 2 (+0.5 output), relu3 0.5, fc2 0.5 (the last stage's output stays)
    assert [s.transfer_ms for s in steps] == pytest.approx([8, 8, 16, 8, 12, 2.5, 0.5, 0.5])
    # cumulative forward ms since the last checkpoint; it resets after relu2 and relu3
    assert [s.cumulative_ms for s in steps] == pytest.approx([4, 4.5, 14.5, 15, 1, 2.25, 2.35, 0.25])
    assert [s.ratio for s in steps] == pytest.approx([2, 8 / 4.5, 16 / 14.5, 8 / 15, 12, 2.5 / 2.25, 0.5 / 2.35, 2])
    assert [s.stage for s in steps if s.checkpoint] == [3, 6]
    plan = layup_cumulative(small, 0)
    assert plan.compact() == "rrrorror"
    assert plan.prefetch_lookahead == 4  # longest gap between checkpoints: input (-1) .. 3
    fates = _fates(small, plan)
    assert fates[2] == "offload"  # relu2's output: checkpoint, and input of the next segment
    assert fates[1] == "none"  # dropped, recomputed from the model input

    # the threshold argument moves the checkpoints
    assert layup_cumulative(small, 0, threshold=1.2).compact() == "rrorrorr"  # conv2 16/14.5 < 1.2
    assert layup_cumulative(small, 0, threshold=0.5).compact() == "rrrrrorr"  # relu2 8/15 no longer
    assert layup_cumulative(small, 0, threshold=100).compact() == "oooooooo"
    with pytest.raises(ValueError, match="threshold"):
        layup_cumulative(small, 0, threshold=-1)


# ---- HMMS ---------------------------------------------------------------------------------------------
def test_hmms_syncs_where_the_capacity_balance_turns_non_negative(
    small: Profile,
) -> None:
    # 8 MiB per ms of D2H. Losses (MiB) 0, 64, 0, 64, 16, 16, 4, 0; gains forward ms x 8
    s = hmms_schedule(small)
    assert [b / MiB for b in s.balances] == pytest.approx([32, -60, 20, -60, -68, -74, -77.2, -75.2])
    assert s.sync_points == (
        2,
        7,
    )  # conv2 pays off relu1's 64 MiB; the rest waits for the last op
    plan = hmms(small, 0, cap=False)
    assert plan.compact() == "o" * 8 and plan.sync == "points" and plan.sync_points == (2, 7)
    # prefetch, analysed from the last backward op: need (MiB) at 2: 64, 4: 80, 5: 16, 7: 4; H2D 32 MiB/ms
    assert s.prefetch_starts == (-1, -1, 4, -1, 5, 7, -1, 7)
    assert plan.prefetch_lookahead == 2


def test_hmms_offloads_up_to_its_theoretical_limit(small: Profile) -> None:
    """NOTE [ HMMS offload cap ]: the forward's gains (forward ms x 8 MiB/ms: 32, 4, 80, 4, 8, 10, 0.8, 2 = 140.8
    MiB) over the saved bytes (164 MiB) cap the share offloaded; the first stages are offloaded while their bytes
    (0, 64, 0, 64 = 128 MiB; with stage 4's 16 it would be 144) stay within it, the rest keep."""
    assert offload_limit(small) == pytest.approx(140.8 / 164)
    assert capped_stages(small, offload_limit(small)) == frozenset({0, 1, 2, 3})
    plan = hmms(small, 0)
    assert plan.compact() == "ooookkkk" and plan.sync == "points"
    assert hmms_schedule(small, frozenset({0, 1, 2, 3})).sync_points == plan.sync_points == (2, 7)
    assert capped_stages(small, 1.0) == frozenset(range(8)) and capped_stages(small, 0.0) == frozenset({0})
    plan.check(small)


def test_hmms_a_faster_link_syncs_more_often(small: Profile) -> None:
    fast = DeviceIdentity(
        name="Fast",
        key="fast",
        memory_bytes=16 << 30,
        d2h_gbps=80 * MiB / 1e6,
        h2d_gbps=80 * MiB / 1e6,
    )
    profile = small.model_copy(update={"device": fast})
    # gains x 80 MiB: 320, 40, 800, 40, 80, 100, 8, 20 -> balance >= 0 after conv2, pool, fc1, relu3
    assert hmms_schedule(profile).sync_points == (2, 4, 5, 6)
    hmms(profile, 0).check(profile)

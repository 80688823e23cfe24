"""Simulator invariants on hand-made chains (numbers chosen so they can be checked by hand)."""

from __future__ import annotations

import itertools
import random

import pytest
from chains import MiB, linear_chain

from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import Simulator, simulate
from memtune.tuner.stage_choices import stage_actions


def unplanned_peak(profile, optimizer_factor: float = 1.0) -> int:
    """Independent accounting of the plain PyTorch step for a linear chain (NOTE [ Simulator memory accounting ]).

    At the end of forward every saved storage is live, plus the last output; backward starts by allocating the
    loss gradient; the peak is the larger of that moment and each backward step's extra gradients.
    """
    base = int(profile.param_bytes * (1 + optimizer_factor)) + profile.input_bytes
    saved = sum(s.bytes for s in profile.storages if s.saved_by)
    last_out = profile.stages[-1].output_bytes
    # NOTE [ Loss memory ]: the loss's forward frees the output (no stage saves it); the fp32 cross-entropy's
    # backward then holds log_softmax's saved output, its incoming and its outgoing gradient
    peak = base + saved + 3 * last_out
    live = base + saved + last_out  # the output's gradient
    grads = 0
    for k in range(profile.n_stages - 1, -1, -1):
        st = profile.stages[k]
        grad_in = profile.stages[k - 1].output_bytes if k > 0 else 0
        grads += st.param_bytes
        peak = max(peak, live + grad_in + st.param_bytes)
        live += grad_in + st.param_bytes - st.output_bytes
        # stage k frees the storage it was the last reader of: x_{k-1}
        if k >= 1:
            live -= profile.storages[k - 1].bytes
    return peak


def test_all_keep_peak_equals_unplanned_accounting() -> None:
    p = linear_chain(6)
    r = simulate(p, Plan.uniform(6))
    assert r.peak_bytes == unplanned_peak(p)
    assert r.step_ms == pytest.approx(sum(s.forward_ms + s.backward_ms for s in p.stages))
    assert r.stall_ms == 0 and r.d2h_bytes == 0 and r.recompute_ms == 0


def test_offloading_never_raises_peak() -> None:
    """Offloading any set of stages, in any sync mode and lookahead, never raises the peak over keeping them."""
    rng = random.Random(0)
    for fwd in (0.5, 5.0, 50.0):
        p = linear_chain(7, forward_ms=fwd)
        sim = Simulator(p)
        for _ in range(60):
            base = [rng.choice([Action.KEEP, Action.RECOMPUTE]) for _ in range(7)]
            keep_plan = Plan(actions=tuple(base))
            kept = sim.run(keep_plan).peak_bytes
            for k in range(7):
                if base[k] is Action.KEEP:
                    trial = list(base)
                    trial[k] = Action.OFFLOAD
                    for sync, la in itertools.product(("deferred", "layer", "inline"), (0, 1, 3)):
                        r = sim.run(Plan(actions=tuple(trial), sync=sync, prefetch_lookahead=la))
                        assert r.peak_bytes <= kept, (base, k, sync, la)


def test_offload_lowers_peak_when_copies_hide() -> None:
    p = linear_chain(6, forward_ms=50.0)  # 100 MiB copies take 10.5 ms: they hide behind 50 ms stages
    keep = simulate(p, Plan.uniform(6))
    off = simulate(p, Plan.from_actions("kooook", sync_delay=1))
    assert off.peak_bytes < keep.peak_bytes
    assert off.stall_ms == 0
    assert off.step_ms == pytest.approx(keep.step_ms)
    assert off.d2h_bytes == off.h2d_bytes == 4 * 100 * MiB


def test_stalls_appear_when_copies_cannot_hide() -> None:
    p = linear_chain(6, forward_ms=1.0)  # 10.5 ms copies behind 1 ms stages
    keep = simulate(p, Plan.uniform(6))
    layer = simulate(p, Plan.from_actions("kooook", sync="layer"))
    assert layer.stall_ms > 0
    assert sum(layer.forward_stalls_ms) > 0 and sum(layer.backward_stalls_ms) > 0
    assert layer.step_ms == pytest.approx(keep.step_ms + layer.stall_ms)
    # prefetching later stalls more
    late = simulate(p, Plan.from_actions("kooook", sync="layer", prefetch_lookahead=0))
    assert late.stall_ms > layer.stall_ms


def test_inline_copies_block_compute() -> None:
    p = linear_chain(4, forward_ms=50.0, copy_ms=7.0)
    r = simulate(p, Plan.from_actions("kooo", sync="inline"))
    keep = simulate(p, Plan.uniform(4))
    # three storages x_1..x_3 (x_0 stays with stage 0's keep... stage 1 saves x_0), each copied out and back
    assert r.step_ms == pytest.approx(keep.step_ms + 3 * 2 * 7.0)


def test_recompute_costs_forward_time_and_saves_memory() -> None:
    p = linear_chain(8, forward_ms=2.0)
    keep = simulate(p, Plan.uniform(8))
    r = simulate(p, Plan.from_actions("krrrkrrr"))
    assert r.recompute_ms == pytest.approx(2.0 * 6)
    assert r.step_ms == pytest.approx(keep.step_ms + r.recompute_ms)
    assert r.peak_bytes < keep.peak_bytes


def test_one_segment_over_everything_saves_little() -> None:
    """Checkpointing the whole chain as one segment re-materialises everything at once in backward."""
    p = linear_chain(8)
    keep = simulate(p, Plan.uniform(8)).peak_bytes
    one = simulate(p, Plan.from_actions("krrrrrrr")).peak_bytes
    sqrt = simulate(p, Plan.from_actions("krrkrrkr")).peak_bytes
    assert sqrt < one <= keep


def test_optimizer_state_counts() -> None:
    p = linear_chain(4)
    sgd = simulate(p, Plan.uniform(4), optimizer="sgd").peak_bytes
    adam = simulate(p, Plan.uniform(4), optimizer="adam").peak_bytes
    none = simulate(p, Plan.uniform(4), optimizer="none").peak_bytes
    assert adam - sgd == sgd - none == p.param_bytes
    with pytest.raises(ValueError, match="optimizer"):
        simulate(p, Plan.uniform(4), optimizer="lamb")


def test_timeline_ends_at_base_plus_gradients_and_peak_matches() -> None:
    p = linear_chain(5)
    r = simulate(p, Plan.from_actions("korko"), timeline=True)
    assert max(live for _, live, _ in r.timeline) == r.peak_bytes
    times = [t for t, _, _ in r.timeline]
    assert times == sorted(times)
    assert r.timeline[-1][1] == r.base_bytes + p.param_bytes  # parameter gradients stay for the optimizer


def test_plan_must_match_profile() -> None:
    p = linear_chain(5)
    with pytest.raises(ValueError, match="5 stages"):
        simulate(p, Plan.uniform(4))


def test_simulator_is_deterministic() -> None:
    p = linear_chain(9, forward_ms=0.7)
    plan = Plan.from_actions("kororkoro", sync="layer")
    assert simulate(p, plan) == simulate(p, plan)


def test_merging_storages_changes_no_number() -> None:
    """merge_storages changes no number under any sync mode (members are freed together)."""
    from memtune.profiler.modeled import modeled_profile
    from memtune.profiler.zoo import build
    from memtune.tuner.simulator import merge_storages

    profile = modeled_profile(build("resnet18", {"image_size": 32}), 8, "float32", "h200")
    assert len(merge_storages(profile).storages) < len(profile.storages)
    fast, slow = Simulator(profile), Simulator(profile, merge=False)
    rng = random.Random(3)
    for _ in range(40):
        plan = Plan(
            actions=tuple(rng.choice(acts) for acts in stage_actions(profile)),
            prefetch_lookahead=rng.randint(0, 4),
            sync=rng.choice(["layer", "inline", "deferred"]),
            sync_delay=rng.randint(0, 5),
        )
        a, b = fast.run(plan), slow.run(plan)
        assert a.peak_bytes == b.peak_bytes
        assert a.step_ms == pytest.approx(b.step_ms, rel=1e-12)
        assert a.stall_ms == pytest.approx(b.stall_ms, rel=1e-9, abs=1e-9)


def test_deferred_waits_sync_delay_stages_after_the_pack_stage() -> None:
    """NOTE [ Deferred frees ]: x_0 (offloaded by stage 1) is copied from t=1 to t=6 (5 ms); compute waits for it
    at the end of stage 1 + sync_delay, i.e. at t = 2 + delay, and stalls for what is left of the copy."""
    p = linear_chain(6, forward_ms=1.0, copy_ms=5.0)
    plain = sum(s.forward_ms + s.backward_ms for s in p.stages)
    keep = simulate(p, Plan.uniform(6))
    layer = simulate(p, Plan.from_actions("kokkkk", sync="layer"))
    for delay, stall in ((0, 4.0), (1, 3.0), (2, 2.0), (4, 0.0)):
        r = simulate(p, Plan.from_actions("kokkkk", sync="deferred", sync_delay=delay))
        assert sum(r.forward_stalls_ms) == pytest.approx(stall), delay
        assert r.forward_stalls_ms[1 + delay] == pytest.approx(stall)
        assert r.d2h_bytes == r.h2d_bytes == 100 * MiB
        assert r.peak_bytes < keep.peak_bytes
    zero = simulate(p, Plan.from_actions("kokkkk", sync="deferred", sync_delay=0))
    assert (zero.step_ms, zero.peak_bytes) == (layer.step_ms, layer.peak_bytes)  # delay 0 is vDNN's layer sync
    # past the forward's end: copied (wasted), never freed, used in place by backward, no stall
    late = simulate(p, Plan.from_actions("kokkkk", sync="deferred", sync_delay=5))
    assert late.d2h_bytes == 100 * MiB and late.h2d_bytes == 0
    assert late.step_ms == pytest.approx(plain) and late.peak_bytes == keep.peak_bytes


def test_a_stage_copies_what_it_saves_while_it_computes() -> None:
    """NOTE [ Copies during the forward ]: stage 1 makes and saves 100 MiB (12.5 ms of copy) in 10 ms of compute.
    Under layer sync its forward ends when both are done (max), not one after the other (sum)."""
    from profiles import D2H_MS_PER_MIB, Layer, chain_profile

    p = chain_profile(
        [Layer("s0", "linear", 1.0, 8), Layer("s1", "mix", 10.0, 8, extra_mib=100), Layer("s2", "linear", 1.0, 8)]
    )
    copy = 100 * D2H_MS_PER_MIB
    keep = simulate(p, Plan.from_actions("kkk", sync="layer"))
    r = simulate(p, Plan.from_actions("kok", sync="layer"))
    assert r.d2h_bytes == 100 * MiB
    assert r.forward_stalls_ms[1] == pytest.approx(copy - 10.0)
    assert r.forward_ms == pytest.approx(keep.forward_ms + copy - 10.0)
    # a copy shorter than the compute costs nothing; the stage's input (packed by it, made before it) still
    # waits for the stage's end: it is queued when the stage before ends
    fast = chain_profile(
        [Layer("s0", "linear", 1.0, 8), Layer("s1", "mix", 20.0, 8, extra_mib=100), Layer("s2", "linear", 1.0, 8)]
    )
    assert simulate(fast, Plan.from_actions("kok", sync="layer")).forward_stalls_ms[1] == 0.0


def test_the_first_convolution_runs_only_its_weight_pass() -> None:
    """NOTE [ Convolution costs ]: the model input needs no gradient, so stage 0's first convolution costs its
    chosen weight pass (against the fastest one) and its weight pass's workspace, never its data pass."""
    from profiles import conv_profile

    p = conv_profile()
    stages = list(p.stages)
    for k in (0, 2):  # give both convolutions the framework's timings, so chosen algorithms replace them
        conv = stages[k].convs[0].model_copy(update={"default_ms": 1.0, "default_bwd_ms": 4.0})
        stages[k] = stages[k].model_copy(update={"convs": (conv,)})
    p = p.model_copy(update={"stages": tuple(stages)})
    sim = Simulator(p)
    base = sim.bwd
    _, fastest_bwd, _, fastest_ws = sim.stage_costs(Plan.uniform(p.n_stages, conv_rule="fastest"))
    _, lean_bwd, _, lean_ws = sim.stage_costs(Plan.uniform(p.n_stages, conv_rule="memory_optimal"))
    assert fastest_bwd[0] == pytest.approx(base[0]) and fastest_ws[0] == 20 * MiB  # bwd_filter 1, not bwd_data's 50
    assert lean_bwd[0] == pytest.approx(base[0] + 6.0 - 2.0) and lean_ws[0] == 0
    # stage 2's convolution reads a gradient-carrying input: both of its passes count
    assert lean_bwd[2] == pytest.approx(base[2] + 6.0 + 6.0 - 4.0)


def test_the_backward_transient_does_not_count_the_gradients_twice() -> None:
    """NOTE [ Backward transient ]: the profiler's W is measured above max(before, after); a max-pool frees its
    indices as it makes its input's gradient, so its whole W is that gradient, which the simulator adds anyway."""
    import json
    from pathlib import Path

    from memtune.api.cli import resolve_profile
    from memtune.profiler.zoo import build
    from memtune.tuner.policies import POLICIES
    from memtune.tuner.simulator import backward_transients

    prof = resolve_profile(build("vgg16", {}), 256, "bfloat16", "h200")
    assert all(s.chained_backward_bytes is not None for s in prof.stages)  # measured as in a chain too
    # as in a chain: the measured transient less the output's gradient, which the simulator holds already
    chained = backward_transients(prof)
    assert chained == [max(0, (s.chained_backward_bytes or 0) - s.output_bytes) for s in prof.stages]
    assert chained[4] <= 1 << 20  # the max-pool: its input's gradient and nothing else (up to rounding)
    # measured alone (the rule for profiles without the chained measurement)
    alone = prof.model_copy(
        update={"stages": tuple(s.model_copy(update={"chained_backward_bytes": None}) for s in prof.stages)}
    )
    ws = backward_transients(alone)
    pool, conv = prof.stages[4], prof.stages[2]
    assert pool.kind == "maxpool2d" and pool.backward_workspace_bytes == prof.stages[3].output_bytes
    assert ws[4] == 0  # its W is its input's gradient
    # a convolution frees only the bf16 copy of its weight: its W stands but for that
    assert 0 <= conv.backward_workspace_bytes - ws[2] <= conv.param_bytes
    assert all(0 <= w <= s.backward_workspace_bytes for w, s in zip(ws, prof.stages, strict=True))

    # the H200's uncapped per-stage trace of checkpoint_sqrt (scripts/memory_trace.py) peaked at 9.11 GiB
    results = Path(__file__).parents[3] / "benchmarks/results/memtrace"
    trace = results / "trace-vgg16-256-bfloat16-0.7-policy-checkpoint_sqrt.json"
    rows = json.loads(trace.read_text())["uncapped"]["rows"]
    measured = max(r["peak_bytes"] for r in rows)
    by_stretch = {r["stretch"]: r["peak_bytes"] for r in rows}
    budget = int(0.7 * simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes)
    for profile in (prof, alone):
        peak = simulate(profile, POLICIES["checkpoint_sqrt"](profile, budget)).peak_bytes
        assert abs(peak - measured) / measured < 0.02, (peak / 2**30, measured / 2**30)
    assert by_stretch["bwd 4"] < by_stretch["bwd 5"]  # the pool's backward is not where it peaks


def test_a_re_run_makes_its_own_copy_of_a_kept_storage() -> None:
    """NOTE [ Re-made copies ]: stage 2 saves its own output (an in-place ReLU saves its result) and stage 3
    keeps it as its input; re-running segment 1..2 makes a second copy for stage 2, freed after its backward."""
    p = linear_chain(5)
    x2 = p.storages[2]
    p = p.model_copy(
        update={"storages": (*p.storages[:2], x2.model_copy(update={"saved_by": (2, 3)}), *p.storages[3:])}
    )
    r = simulate(p, Plan.from_actions("krrkk"), timeline=True)
    live = {label: b for _, b, label in r.timeline}
    labels = [label for _, _, label in r.timeline]
    at = labels.index("recompute 1..2")
    made = r.timeline[at][1] - r.timeline[at - 1][1]
    # x_1 (re-made for stage 2), the copy of x_2, and one output in flight
    assert made == 3 * 100 * MiB
    # stage 2's backward frees its output's gradient, x_1 and the copy: what stays is its parameters' gradient
    assert live["bwd 2 end"] == r.timeline[at - 1][1] + 10 * MiB
    plain = simulate(linear_chain(5), Plan.from_actions("krrkk"), timeline=True)
    assert live["bwd 2 start"] - {label: b for _, b, label in plain.timeline}["bwd 2 start"] == 100 * MiB


def test_a_chosen_stage_keeps_its_transient_besides_the_convolution_workspace() -> None:
    """NOTE [ Lean transients ]: with the lean transients measured, a stage's transient under chosen algorithms is
    the lean one plus what the chosen workspace adds to the memory-optimal one; unmeasured, the chosen workspace."""
    from profiles import conv_profile

    p = conv_profile()
    stages = list(p.stages)
    # conv1.0 is stage 0 (weight pass only); give conv2's stage (2) 30 MiB forward, 70 MiB backward lean transients
    stages[2] = stages[2].model_copy(
        update={"lean_forward_workspace_bytes": 30 * MiB, "lean_backward_workspace_bytes": 70 * MiB}
    )
    measured = p.model_copy(update={"stages": tuple(stages)})
    fastest = Plan.uniform(p.n_stages, conv_rule="fastest")
    lean = Plan.uniform(p.n_stages, conv_rule="memory_optimal")
    _, _, ws_f, ws_b = Simulator(p).stage_costs(fastest)
    assert (ws_f[2], ws_b[2]) == (40 * MiB, 0)  # conv2: fwd algo 1 (40 MiB); its backward passes need none
    _, _, ws_f, ws_b = Simulator(measured).stage_costs(fastest)
    # the backward was measured with its output's gradient (64 MiB), which the simulator holds already
    assert (ws_f[2], ws_b[2]) == (30 * MiB + 40 * MiB, 6 * MiB)
    _, _, ws_f, ws_b = Simulator(measured).stage_costs(lean)
    assert (ws_f[2], ws_b[2]) == (30 * MiB, 6 * MiB)
    assert Simulator(measured).stage_costs(fastest)[2][0] == Simulator(p).stage_costs(fastest)[2][0]  # unmeasured


def test_a_segment_starting_in_place_holds_a_clone_of_its_input() -> None:
    """NOTE [ In-place at segment boundaries ]: the runtime runs such a segment on a clone of its input, which the
    storage table counts as one with the input; the simulator adds it from the stage's forward to its backward."""
    from profiles import Layer, chain_profile

    layers = [
        Layer("lin0", "linear", 1.0, 64, 1),
        Layer("relu", "relu", 0.5, 64, inplace=True),
        Layer("lin1", "linear", 1.0, 64, 1, saves_input=True),
        Layer("lin2", "linear", 1.0, 64, 1, saves_input=True),
    ]
    p = chain_profile(layers)
    plain = simulate(p, Plan.from_actions("kkrk"), timeline=True)  # the segment starts at lin1: no clone
    cloned = simulate(p, Plan.from_actions("krkk"), timeline=True)  # it starts at the in-place ReLU

    def grew(r, label: str) -> int:
        at = [lbl for _, _, lbl in r.timeline].index(label)
        return r.timeline[at][1] - r.timeline[at - 1][1]

    assert grew(cloned, "fwd 1 start") == 64 * MiB  # the clone; the ReLU itself makes nothing
    assert grew(plain, "fwd 2 start") == 64 * MiB  # lin1's own output
    live = {lbl: b for _, b, lbl in cloned.timeline}
    # after the ReLU's backward: lin1's and lin2's parameter gradients and x_0's gradient; the clone is gone
    assert live["bwd 1 end"] == cloned.base_bytes + 2 * MiB + 64 * MiB
    # inside a longer segment the clone lives to the next stage's forward end, and the re-run clones again
    longer = simulate(p, Plan.from_actions("krrk"), timeline=True)
    assert grew(longer, "fwd 1 start") == 64 * MiB
    assert grew(longer, "fwd 2 clone") == -64 * MiB
    assert grew(longer, "recompute 1..2") == 2 * 64 * MiB  # the clone again, and one output in flight
    # an offloaded input leaves the clone the only copy on the GPU: nothing to add
    assert grew(simulate(p, Plan.from_actions("orkk"), timeline=True), "fwd 1 start") == 0


def test_the_choice_bound_takes_the_largest_workspace_memory_optimal_algorithms_free() -> None:
    """``benchmarks.choice_bound``: F is the most bytes memory-optimal algorithms free at one stage against the
    framework's measured transients (here the hand-made chain's conv1 forward, 100 MiB of workspace measured)."""
    from profiles import conv_profile

    from benchmarks.choice_bound import freeable_bytes

    p = conv_profile()
    stages = list(p.stages)
    stages[0] = stages[0].model_copy(update={"forward_workspace_bytes": 100 * MiB})
    sim = Simulator(p.model_copy(update={"stages": tuple(stages)}))
    free, where = freeable_bytes(sim)
    assert (free, where) == (100 * MiB, "conv1.0")  # memory-optimal conv1 forward needs none


@pytest.mark.parametrize("model", ["vgg16", pytest.param("resnet50", marks=pytest.mark.slow)])
def test_rule_choices_choose_as_choose_algorithms_at_every_cap(model: str) -> None:
    """``RuleChoices`` (the simulator's and the budget bound's chooser) lists each convolution's working algorithms
    once and then picks as ``choose_algorithms`` does, for every rule and every workspace cap of a measured profile's
    algorithm tables (with its batch-split runs), plus caps between, below and above them."""
    from memtune.profiler import find_profile
    from memtune.tuner._conv_choice import RuleChoices, choose_algorithms

    profile = find_profile(model, 256, "float32", "h200")
    assert profile is not None and profile.has_conv_algos
    sizes = sorted({a.workspace_bytes for st in profile.stages for c in st.convs for a in c.algos})
    caps = {0, 1, *sizes, *(w + 1 for w in sizes), *(w - 1 for w in sizes if w), 1 << 50}
    plans = [Plan.uniform(profile.n_stages, conv_rule=r) for r in ("default", "fastest", "memory_optimal")]
    plans += [Plan.uniform(profile.n_stages, conv_rule="fastest_within", conv_workspace_limit_bytes=c) for c in caps]
    choices = RuleChoices(profile)
    for plan in plans:
        assert choices.choose(plan) == choose_algorithms(profile, plan, check=False)


def test_a_stage_in_place_on_its_input_holds_its_new_gradient_beside_the_incoming_one() -> None:
    """NOTE [ Backward transient ]: the stem's lone in-place ``relu`` of ResNet-50 (regions at depth 1, H100 profile)
    makes its input's gradient while the incoming one lives. The H100 trace of the 60% plan
    (``resnet50-trace-60.txt``) held 2,007 MiB in that stage's backward; the simulation holds the same within 8 MiB."""
    import json
    from pathlib import Path

    from memtune.profiler import Profile
    from memtune.tuner.simulator import backward_transients

    folder = Path(__file__).parents[3] / "benchmarks/results/h100/compiled-regions"
    prof = Profile.from_json((folder / "resnet50-regions-d1-b0.5.json").read_text())
    k = next(i for i, s in enumerate(prof.stages) if s.name == "relu")
    relu = prof.stages[k]
    assert relu.inplace and relu.output_storage in (relu.input_storages or ())
    transients = backward_transients(prof)
    assert transients[k] == relu.chained_backward_bytes == relu.output_bytes  # not 0: the new gradient
    others = [t for i, (t, s) in enumerate(zip(transients, prof.stages, strict=True)) if i != k]
    assert others == [
        max(0, (s.chained_backward_bytes or 0) - s.output_bytes) for i, s in enumerate(prof.stages) if i != k
    ]
    row = json.loads((folder / "resnet50.json").read_text())
    plan = Plan.model_validate(next(p for p in row["plans"] if p["fraction"] == 0.6)["plan"])
    timeline = simulate(prof, plan.named(prof), timeline=True).timeline
    held = next(live for _, live, label in timeline if label == f"bwd {k} start")
    traced = next(
        line
        for line in (folder / "resnet50-trace-60.txt").read_text().splitlines()
        if line.split()[:2] == ["bwd", str(k)]
    )
    assert abs(held / 2**20 - int(traced.split()[5])) <= 8, (held / 2**20, traced)

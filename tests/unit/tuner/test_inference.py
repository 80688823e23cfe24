"""Inference plans (NOTE [ Inference plans ]): the schema, working sets, the simulator and the planner, torch-free."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from memtune.tuner import InferenceFacts, InferencePlan, LayerFitError, LayerPlan, plan_inference, simulate_inference
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.inference import LayerFacts, working_sets
from memtune.tuner.inference._facts import part_ms
from memtune.tuner.inference._memory import part_units

KiB = 1 << 10


def layer(name: str, kind: str = "relu", *, units: int = 1, w: int = 0, x: int = 0, y: int = 0,
          alias: bool = False, scratch: int = 0, ms: float = 1.0) -> LayerFacts:  # fmt: skip
    return LayerFacts(name=name, kind=kind, units=units, weight_bytes=w, input_bytes=x, output_bytes=y,
                      aliases_input=alias, scratch_bytes=scratch, forward_ms=ms)  # fmt: skip


def facts(*layers: LayerFacts, overlap: bool = True, gbps: float = 1.0, floor: float = 0.1) -> InferenceFacts:
    """Facts with a 1 GB/s link (1e6 bytes per ms) and no copy latency, so that copy times are bytes / 1e6."""
    return InferenceFacts(model="toy", batch=1, dtype="float32", device="toy", source="modeled", layers=layers,
                          h2d_gbps=gbps, d2h_gbps=gbps, copy_latency_ms=0.0, copies_overlap=overlap,
                          partition_floor_ms=floor)  # fmt: skip


def mlp() -> InferenceFacts:
    """fc1 (100 units, 4 KiB each: 400 KiB) -> relu in place -> fc2 (10 units, 1 KiB each)."""
    return facts(
        layer("fc1", "linear", units=100, w=100 * 4 * KiB, x=4 * KiB, y=400, ms=2.0),
        layer("act", "relu", x=400, y=400, alias=True, ms=0.2),
        layer("fc2", "linear", units=10, w=10 * KiB, x=400, y=40, ms=0.5),
    )


def cnn() -> InferenceFacts:
    """conv1 (8 units) -> relu -> pool -> conv2 (16 units) -> flatten -> fc (10 units); big activations early."""
    return facts(
        layer("conv1", "conv2d", units=8, w=8 * 300, x=12 * KiB, y=64 * KiB, ms=1.0),
        layer("relu", "relu", x=64 * KiB, y=64 * KiB, alias=True, ms=0.1),
        layer("pool", "maxpool2d", x=64 * KiB, y=16 * KiB, ms=0.2),
        layer("conv2", "conv2d", units=16, w=16 * 2400, x=16 * KiB, y=32 * KiB, ms=1.5),
        layer("flatten", "flatten", x=32 * KiB, y=32 * KiB, alias=True, ms=0.01),
        layer("fc", "linear", units=10, w=10 * 4 * KiB, x=32 * KiB, y=40, ms=0.4),
    )


# ---- the schema ----------------------------------------------------------------------------------------------------


def test_plan_round_trips_through_json() -> None:
    plan = InferencePlan(model="toy", budget_bytes=4096, layers=(
        LayerPlan(name="fc1", channel_parts=4, weights="host_prefetch", output="host"),
        LayerPlan(name="act"), LayerPlan(name="fc2", weights="host_prefetch")))  # fmt: skip
    assert InferencePlan.model_validate_json(plan.model_dump_json()) == plan
    assert plan.compact() == "fc1:4ph fc2:1p"
    assert InferencePlan.resident(["a", "b"]).compact() == "resident"


@pytest.mark.parametrize(
    ("layer_fields", "words"),
    [
        ({"name": "conv3", "channel_parts": 0}, ["conv3", "channel_parts 0", ">= 1"]),
        ({"name": "conv3", "output": "host"}, ["conv3", "output 'host'", "channel_parts > 1"]),
        ({"name": "conv3", "weights": "disk"}, ["weights"]),
        ({"name": "conv3", "parts": 2}, ["parts", "Extra inputs are not permitted"]),
    ],
)
def test_layer_validation_errors_name_the_layer(layer_fields: dict[str, object], words: list[str]) -> None:
    with pytest.raises(ValidationError) as info:
        InferencePlan.model_validate({"layers": [{"name": "conv1"}, layer_fields]})
    for word in words:
        assert word in str(info.value)


def test_plan_refuses_duplicate_layers_other_versions_and_extra_fields() -> None:
    with pytest.raises(ValidationError, match="layer 'a' appears twice"):
        InferencePlan.model_validate({"layers": [{"name": "a"}, {"name": "a"}]})
    with pytest.raises(ValidationError, match="schema_version 2"):
        InferencePlan.model_validate({"schema_version": 2, "layers": [{"name": "a"}]})
    with pytest.raises(ValidationError, match="Extra inputs"):
        InferencePlan.model_validate({"layers": [{"name": "a"}], "actions": []})


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({0: {"channel_parts": 101}}, ["'fc1'", "channel_parts 101", "100 output channels"]),
        ({1: {"weights": "host_prefetch"}}, ["'act'", "no weights to prefetch"]),
        ({1: {"channel_parts": 2}}, ["'act'", "no output channels to split"]),
        ({1: {"channel_parts": 2, "output": "host"}}, ["'act'"]),
        ({2: {"name": "fc3"}}, ["plan layer 2 is 'fc3'", "'fc2'"]),
    ],
)
def test_plan_check_names_the_layer(change: dict[int, dict[str, object]], words: list[str]) -> None:
    layers = [{"name": n} for n in ("fc1", "act", "fc2")]
    for k, fields in change.items():
        layers[k].update(fields)
    plan = InferencePlan.model_validate({"layers": layers})
    with pytest.raises(PlanError) as info:
        plan.check(mlp())
    for word in words:
        assert word in str(info.value)


def test_output_to_host_refused_on_a_layer_that_returns_its_input() -> None:
    plan = InferencePlan(layers=(LayerPlan(name="fc1"), LayerPlan(name="act"), LayerPlan(name="fc2")))
    aliasing = facts(*[dataclasses.replace(f, units=4) if f.name == "act" else f for f in mlp().layers])
    bad = plan.model_copy(update={"layers": (plan.layers[0], LayerPlan(name="act", channel_parts=2, output="host"),
                                             plan.layers[2])})  # fmt: skip
    with pytest.raises(PlanError, match=r"'act'.*returns its input's storage"):
        bad.check(aliasing)


# ---- working sets --------------------------------------------------------------------------------------------------


def test_working_sets_follow_the_note() -> None:
    f = mlp()
    plan = InferencePlan(layers=(
        LayerPlan(name="fc1", channel_parts=3, weights="host_prefetch"),  # 34, 33, 33 units of 4 KiB
        LayerPlan(name="act"), LayerPlan(name="fc2", weights="host_prefetch")))  # fmt: skip
    ws = working_sets(f, plan)
    # fc1 at partition 0: input 4 KiB + its 34 units + the whole output 400 B + partition 0's output (34 of 100
    # units: 136 B) + partition 1 (33 units) arriving
    assert ws[0].input_bytes == 4 * KiB and ws[0].weight_bytes == 34 * 4 * KiB
    assert ws[0].output_bytes == 400 + 136 and ws[0].arriving_bytes == 33 * 4 * KiB
    assert ws[0].total_bytes == 4 * KiB + 34 * 4 * KiB + 536 + 33 * 4 * KiB
    # act holds nothing of its own: its input, and fc2's only partition arriving; the caller holds the model's input
    assert (ws[1].weight_bytes, ws[1].output_bytes, ws[1].arriving_bytes) == (0, 0, 10 * KiB)
    assert (ws[0].model_input_bytes, ws[1].model_input_bytes) == (0, 4 * KiB)
    # fc2, the last: its weights and output, nothing arriving
    assert (ws[2].weight_bytes, ws[2].output_bytes, ws[2].arriving_bytes) == (10 * KiB, 40, 0)
    assert ws[2].total_bytes == 4 * KiB + 400 + 10 * KiB + 40
    resident = working_sets(f, InferencePlan.resident(["fc1", "act", "fc2"]))
    assert all(w.resident_bytes == 410 * KiB and w.weight_bytes == 0 for w in resident)


def test_the_model_input_is_held_beside_other_inputs() -> None:
    # a Flatten (a view) first: the next layer still reads the model's input, counted once
    f = facts(layer("flat", "flatten", x=100, y=100, alias=True), layer("fc", "linear", units=2, w=8, x=100, y=8),
              layer("pool", "maxpool2d", x=8, y=4, scratch=8))  # fmt: skip
    ws = working_sets(f, InferencePlan.resident(["flat", "fc", "pool"]))
    assert [w.model_input_bytes for w in ws] == [0, 0, 100]
    assert ws[2].total_bytes == 8 + 100 + 8 + 4 + 8  # weights, model input, input, output, the pool's indices


def test_output_to_host_holds_one_partition() -> None:
    f = cnn()
    names = [lay.name for lay in f.layers]
    lp = [LayerPlan(name=n) for n in names]
    lp[0] = LayerPlan(name="conv1", channel_parts=4, output="host")
    ws = working_sets(f, InferencePlan(layers=tuple(lp)))
    assert ws[0].output_bytes == 16 * KiB  # one of 4 partitions of 64 KiB; the rest went to the host
    assert part_units(10, 4, 0) == 3 and part_units(10, 4, 3) == 2


# ---- the simulator -------------------------------------------------------------------------------------------------


def test_simulator_prices_prefetch_one_partition_ahead() -> None:
    # two layers of 2 partitions each: weights of 1e6 bytes per partition (1 ms each at 1 GB/s), 0.5 ms of compute
    f = facts(layer("a", "linear", units=2, w=2_000_000, x=8, y=8, ms=1.0),
              layer("b", "linear", units=2, w=2_000_000, x=8, y=8, ms=1.0), floor=0.0)  # fmt: skip
    plan = InferencePlan(layers=(LayerPlan(name="a", channel_parts=2, weights="host_prefetch"),
                                 LayerPlan(name="b", channel_parts=2, weights="host_prefetch")))  # fmt: skip
    sim = simulate_inference(f, plan)
    # copies end at 1, 2, 3, 4 ms (each issued when the partition before it starts); compute waits for each
    assert sim.latency_ms == pytest.approx(4.5)
    assert sim.stall_ms == pytest.approx(1.0 + 0.5 * 3)
    assert sim.copies == 4 and sim.h2d_bytes == 4_000_000
    serial = simulate_inference(dataclasses.replace(f, copies_overlap=False), plan)
    assert serial.latency_ms == pytest.approx(4 * 1.0 + 4 * 0.5)


def test_simulator_prices_outputs_sent_to_the_host() -> None:
    f = facts(layer("a", "conv2d", units=4, w=400, x=1000, y=4_000_000, ms=2.0),
              layer("b", "maxpool2d", x=4_000_000, y=1_000, ms=1.0), floor=0.0)  # fmt: skip
    plan = InferencePlan(layers=(LayerPlan(name="a", channel_parts=4, output="host"), LayerPlan(name="b")))
    sim = simulate_inference(f, plan)
    # 4 partitions of 0.5 ms each followed by a 1 ms copy out; b's input comes back whole (4 ms); then 1 ms
    assert sim.latency_ms == pytest.approx(4 * (0.5 + 1.0) + 4.0 + 1.0)
    assert sim.d2h_bytes == 4_000_000 and sim.h2d_bytes == 4_000_000


def test_measured_one_channel_partitions_price_the_fixed_cost() -> None:
    f = layer("a", "conv2d", units=101, w=101, x=8, y=404, ms=11.0)
    measured = dataclasses.replace(f, one_channel_ms=1.0)
    base = facts(f, floor=0.0)
    assert part_ms(base, f, 101, 1) == pytest.approx(11.0 / 101)  # the share, unmeasured
    assert part_ms(base, measured, 101, 1) == pytest.approx(1.0)  # one channel as measured
    assert part_ms(base, measured, 2, 51) == pytest.approx(1.0 + 10.0 * 50 / 100)  # on the line to the whole
    assert part_ms(base, measured, 1, 101) == pytest.approx(11.0)
    whole = simulate_inference(facts(measured, floor=0.0), InferencePlan(layers=(LayerPlan(name="a"),)))
    finest = simulate_inference(
        facts(measured, floor=0.0), InferencePlan(layers=(LayerPlan(name="a", channel_parts=101),))
    )
    assert whole.latency_ms == pytest.approx(11.0) and finest.latency_ms == pytest.approx(101.0)


def test_partitions_cost_at_least_the_floor() -> None:
    f = facts(layer("a", "linear", units=100, w=100, x=8, y=400, ms=1.0), floor=0.25)
    whole = simulate_inference(f, InferencePlan(layers=(LayerPlan(name="a"),)))
    split = simulate_inference(f, InferencePlan(layers=(LayerPlan(name="a", channel_parts=10),)))
    assert whole.latency_ms == pytest.approx(1.0) and split.latency_ms == pytest.approx(10 * 0.25)


# ---- the planner ---------------------------------------------------------------------------------------------------


def test_planner_keeps_the_plain_model_when_it_fits() -> None:
    f = cnn()
    peak = max(w.total_bytes for w in working_sets(f, InferencePlan.resident([x.name for x in f.layers])))
    plan = plan_inference(f, peak)
    assert plan.label == "resident" and plan.compact() == "resident"
    assert plan_inference(f, peak - 1).label == "mmcnn"


@pytest.mark.parametrize("make", [mlp, cnn])
@pytest.mark.parametrize("fraction", [0.9, 0.5, 0.25, 0.1])
def test_planner_fits_and_no_layer_can_drop_a_partition(make: object, fraction: float) -> None:
    assert callable(make)
    f = make()
    peak = max(w.total_bytes for w in working_sets(f, InferencePlan.resident([x.name for x in f.layers])))
    budget = int(fraction * peak)
    try:
        plan = plan_inference(f, budget, residency=False)
    except LayerFitError as exc:
        assert exc.need_bytes > budget
        return
    sets = working_sets(f, plan)
    assert max(w.total_bytes for w in sets) <= budget
    for k, lp in enumerate(plan.layers):  # fewest for the output place it chose (NOTE [ Inference plans ])
        if lp.channel_parts == 1 or (lp.output == "host" and lp.channel_parts == 2):
            continue
        fewer = list(plan.layers)
        fewer[k] = lp.model_copy(update={"channel_parts": lp.channel_parts - 1})
        worse = working_sets(f, plan.model_copy(update={"layers": tuple(fewer)}))
        assert max(w.total_bytes for w in worse) > budget, (k, lp)


def test_planner_refuses_an_impossible_budget_naming_the_layer() -> None:
    f = cnn()
    with pytest.raises(LayerFitError) as info:
        plan_inference(f, 40 * KiB)
    exc = info.value
    # the pool holds its 64 KiB input and 16 KiB output whatever happens: the most any layer needs
    assert exc.layer == "pool" and exc.budget_bytes == 40 * KiB
    assert exc.need_bytes == 12 * KiB + 64 * KiB + 16 * KiB + 2400  # the model's input, conv2's first channel
    text = str(exc)
    assert repr(exc.layer) in text and "40.00 KiB" in text and "raise the budget to at least" in text
    assert "smaller batch or input size" in text
    # what it says is needed is the least budget that fits
    plan = plan_inference(f, exc.need_bytes)
    assert max(w.total_bytes for w in working_sets(f, plan)) <= exc.need_bytes
    with pytest.raises(LayerFitError):
        plan_inference(f, exc.need_bytes - 1)


def test_planner_splits_a_fat_layer_by_channels() -> None:
    # the paper's case: a layer whose weights alone exceed the budget runs in partitions of its output channels
    f = mlp()
    plan = plan_inference(f, 100 * KiB, residency=False)
    fc1 = plan.layers[0]
    assert fc1.weights == "host_prefetch" and fc1.channel_parts > 4
    assert max(w.total_bytes for w in working_sets(f, plan)) <= 100 * KiB


def test_residency_only_lowers_the_latency() -> None:
    f = cnn()
    peak = max(w.total_bytes for w in working_sets(f, InferencePlan.resident([x.name for x in f.layers])))
    for fraction in (0.95, 0.8, 0.6):
        budget = int(fraction * peak)
        host = plan_inference(f, budget, residency=False)
        mixed = plan_inference(f, budget)
        assert simulate_inference(f, mixed).latency_ms <= simulate_inference(f, host).latency_ms
        assert max(w.total_bytes for w in working_sets(f, mixed)) <= budget


def test_facts_refuse_bad_values_naming_the_layer() -> None:
    with pytest.raises(PlanError, match="layer 'x': units 0"):
        layer("x", units=0)
    with pytest.raises(PlanError, match="'a' appears twice"):
        facts(layer("a"), layer("a"))

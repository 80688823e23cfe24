"""Inference plans run on the CPU (NOTE [ Inference plans ]): the output equals the plain model's at every budget."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable

import pytest
import torch
from torch import nn

from memtune.profiler import build, modeled_profile
from memtune.tuner import InferenceFacts, InferencePlan, LayerFitError, LayerPlan, plan_inference
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.inference import LayerFacts, facts_from_profile, plain_plan, working_sets
from memtune.tuner.measure.inference_measure import measure_facts
from memtune.tuner.runtime import InferenceRunner
from memtune.tuner.runtime import _inference_runner as runtime_inference
from memtune.tuner.runtime.inference_facts import chain_layers, layer_shapes

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def vgg_like() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(2),
        nn.Flatten(), nn.Linear(256, 64), nn.ReLU(inplace=True), nn.Dropout(), nn.Linear(64, 10),
    )  # fmt: skip


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 96), nn.ReLU(inplace=True),
                         nn.Linear(96, 10))  # fmt: skip


CASES: dict[str, tuple[Callable[[], nn.Sequential], tuple[int, ...]]] = {
    "vgg_like": (vgg_like, (2, 3, 16, 16)),
    "mlp": (mlp, (3, 4, 16)),
}


def toy_facts(model: nn.Module, shape: tuple[int, ...]) -> InferenceFacts:
    """Facts from the model's shapes with made-up times (1 ms a layer, a 10 GB/s link): plans, not timings, matter."""
    layers = tuple(LayerFacts(**dataclasses.asdict(s), forward_ms=1.0) for s in layer_shapes(model, shape))
    return InferenceFacts(model="toy", batch=shape[0], dtype="float32", device="cpu", source="measured", layers=layers,
                          h2d_gbps=10.0, d2h_gbps=10.0, copy_latency_ms=0.01, copies_overlap=False,
                          partition_floor_ms=0.1)  # fmt: skip


def setup(case: str) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor, InferenceFacts]:
    make, shape = CASES[case]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(shape)
    with torch.no_grad():
        ref = model(x.clone())
    return model, x, ref, toy_facts(model, shape)


def budgets(facts: InferenceFacts) -> list[int]:
    """The plain model's peak, two fractions of it, and the least budget any plan fits."""
    peak = max(w.total_bytes for w in working_sets(facts, plain_plan(facts)))
    with pytest.raises(LayerFitError) as info:
        plan_inference(facts, 1)
    return [peak, int(0.6 * peak), int(0.3 * peak), info.value.need_bytes]


@pytest.mark.parametrize("case", [pytest.param("vgg_like", marks=pytest.mark.slow), "mlp"])
def test_planned_output_equals_the_model_at_every_budget(case: str) -> None:
    model, x, ref, facts = setup(case)
    before = [p.detach().clone() for p in model.parameters()]
    seen = set()
    for budget in budgets(facts):
        for residency in (True, False):
            try:
                plan = plan_inference(facts, budget, residency=residency)
            except LayerFitError:
                assert budget < budgets(facts)[-1]
                continue
            seen.add(plan.compact())
            y = InferenceRunner(model, plan)(x.clone())
            torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6, msg=lambda m, p=plan: f"{p.compact()}: {m}")
    assert len(seen) >= 3  # the budgets made different plans
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # nothing changed


@pytest.mark.parametrize("case", list(CASES))
def test_every_layer_split_finest_with_outputs_to_the_host(case: str) -> None:
    model, x, ref, facts = setup(case)
    layers = tuple(
        LayerPlan(name=f.name, channel_parts=f.units, weights="host_prefetch" if f.has_weights else "resident",
                  output="host" if f.units > 1 else "device")
        for f in facts.layers
    )  # fmt: skip
    plan = InferencePlan(layers=layers)
    plan.check(facts)
    runner = InferenceRunner(model, plan)
    for _ in range(2):  # the staging buffers are reused
        torch.testing.assert_close(runner(x.clone()), ref, rtol=1e-5, atol=1e-6)
    uneven = tuple(
        lp.model_copy(update={"channel_parts": 3, "output": "device"}) if lp.channel_parts > 3 else lp for lp in layers
    )  # fmt: skip  (partitions of unequal size)
    torch.testing.assert_close(InferenceRunner(model, InferencePlan(layers=uneven))(x.clone()), ref, rtol=1e-5,
                               atol=1e-6)  # fmt: skip


def test_weights_arrive_one_partition_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, ref, facts = setup("vgg_like")
    plan = InferencePlan(layers=tuple(
        LayerPlan(name=f.name, channel_parts=min(f.units, 4), weights="host_prefetch" if f.has_weights else "resident")
        for f in facts.layers))  # fmt: skip
    alive = [0]
    most = [0]
    copied = [0]
    h2d = runtime_inference._Copier.h2d

    def counting(self: object, *hosts: torch.Tensor | None, after_compute: bool = False) -> object:
        outs, ready = h2d(self, *hosts, after_compute=after_compute)  # type: ignore[arg-type]
        if not after_compute:  # a weight partition: count it while it lives
            copied[0] += 1
            alive[0] += 1
            most[0] = max(most[0], alive[0])
            weakref.finalize(outs[0], lambda: alive.__setitem__(0, alive[0] - 1))
        return outs, ready

    monkeypatch.setattr(runtime_inference._Copier, "h2d", counting)
    torch.testing.assert_close(InferenceRunner(model, plan)(x.clone()), ref, rtol=1e-5, atol=1e-6)
    assert copied[0] == sum(lp.channel_parts for lp in plan.layers if lp.weights == "host_prefetch")
    assert most[0] == 2  # the partition in use and the one arriving (NOTE [ Inference copy order ])


@pytest.mark.parametrize("conv_workspace", ["framework", "none"])
def test_measured_facts_plan_and_run(conv_workspace: str) -> None:
    model, x, ref, _ = setup("vgg_like")
    facts = measure_facts(model, x, "cpu", repeats=1, name="vgg_like", conv_workspace=conv_workspace)  # type: ignore[arg-type]
    assert facts.source == "measured" and not facts.copies_overlap and facts.h2d_gbps > 0
    assert all(f.forward_ms > 0 for f in facts.layers) and facts.partition_floor_ms > 0
    assert [f.name for f in facts.layers] == [n for n, _ in chain_layers(model)]
    plan = plan_inference(facts, budgets(facts)[-1])
    assert plan.conv_workspace == conv_workspace  # the plan runs convolutions as its facts timed them
    torch.testing.assert_close(InferenceRunner(model, plan)(x.clone()), ref, rtol=1e-5, atol=1e-6)
    other = "none" if conv_workspace == "framework" else "framework"
    with pytest.raises(PlanError, match=f"conv_workspace {other!r} but the facts timed them with"):
        plan.model_copy(update={"conv_workspace": other}).check(facts)


def test_shapes_describe_each_layer() -> None:
    shapes = {s.name: s for s in layer_shapes(vgg_like(), (2, 3, 16, 16))}
    conv = shapes["2"]
    assert (conv.kind, conv.units, conv.weight_bytes) == ("conv2d", 32, (32 * 16 * 9 + 32) * 4)
    assert (conv.input_bytes, conv.output_bytes) == (2 * 16 * 256 * 4, 2 * 32 * 256 * 4)
    assert shapes["1"].aliases_input and not shapes["3"].aliases_input  # ReLU in place, ReLU not
    assert shapes["8"].aliases_input and shapes["11"].aliases_input  # Flatten's view, Dropout in eval
    assert shapes["12"].units == 10 and shapes["4"].units == 1
    assert shapes["4"].scratch_bytes == 2 * 32 * 64 * 8 and shapes["2"].scratch_bytes == 0  # max pool: int64 indices


def test_unsupported_layers_are_named() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    with pytest.raises(PlanError, match=r"layer '1' \(BatchNorm2d\) is not supported"):
        layer_shapes(model, (1, 3, 8, 8))
    with pytest.raises(PlanError, match=r"layer 'prelu' \(PReLU\)"):
        chain_layers(nn.PReLU())
    with pytest.raises(PlanError, match=r"layer '1' .*cannot take an input of shape"):
        layer_shapes(nn.Sequential(nn.Flatten(), nn.Linear(5, 2)), (1, 3, 4))


def test_runner_refuses_a_plan_of_another_model() -> None:
    model = mlp()
    plan = InferencePlan.resident(["0", "1", "2"])
    with pytest.raises(PlanError, match="layer 3 of the model is '3' but the plan's is 'nothing'"):
        InferenceRunner(model, plan)
    names = [n for n, _ in chain_layers(model)]
    too_many = plan.resident(names).model_copy(
        update={"layers": (LayerPlan(name="0"), LayerPlan(name="1", channel_parts=129), *[LayerPlan(name=n) for n in
                                                                                        names[2:]])})  # fmt: skip
    with pytest.raises(PlanError, match=r"layer '1' .*channel_parts 129 but it has 128"):
        InferenceRunner(model, too_many)


@pytest.mark.slow
def test_zoo_vgg16_priced_by_its_profile_runs_as_planned() -> None:
    chain = build("vgg16", {"image_size": 32})
    facts = facts_from_profile(modeled_profile(chain, 1, "float32", "h200"), layer_shapes(chain, (1, 3, 32, 32)))
    assert facts.layers[0].name == "features.0" and facts.layers[-1].units == 1000
    x = torch.randn(1, 3, 32, 32)
    ref = InferenceRunner(chain, InferencePlan.resident([f.name for f in facts.layers]))(x.clone())
    plan = plan_inference(facts, 4 << 20)
    assert plan.layers[-7].channel_parts > 1  # classifier.0's 392 MiB of weights run in partitions
    torch.testing.assert_close(InferenceRunner(chain, plan)(x.clone()), ref, rtol=1e-5, atol=1e-6)


def test_facts_from_another_models_profile_are_refused() -> None:
    prof = modeled_profile(build("alexnet", {"image_size": 63}), 1, "float32", "h200")
    with pytest.raises(PlanError, match="has 13 layers but the profile of 'alexnet'"):
        facts_from_profile(prof, layer_shapes(vgg_like(), (1, 3, 16, 16)))
    renamed = nn.Sequential(*[m for _, m in chain_layers(build("alexnet", {"image_size": 63}))])
    with pytest.raises(PlanError, match=r"layer 0 of the model is '0' but stage 0 of the profile is 'features\.0'"):
        facts_from_profile(prof, layer_shapes(renamed, (1, 3, 63, 63)))

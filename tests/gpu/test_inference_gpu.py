"""Inference plans on a CUDA GPU (NOTE [ Inference plans ]): the output equals the plain model's, and the device
memory a call allocates is the plan's working set.

Skipped without CUDA (run with ``pytest -m gpu tests/gpu/test_inference_gpu.py``). Allocated memory is the peak of
``torch.cuda.max_memory_allocated`` during one call above what was allocated before it, plus the resident weights
and the input (allocated before, counted by the working set). Working sets count tensors, not a library's scratch
memory: the bound is checked on a chain of Linear layers, whose cuBLAS workspace is allocated once, before, and on
convolutions run by cuDNN's workspace-free algorithm (``conv_workspace="none"``); with the framework's algorithms a
convolution's cuDNN workspace comes on top, and is only printed.
"""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch
from torch import nn

from memtune.profiler import build
from memtune.tuner import InferenceFacts, InferencePlan, LayerFitError, LayerPlan, plan_inference, simulate_inference
from memtune.tuner.inference import LayerFacts, plain_plan, working_sets
from memtune.tuner.inference._facts import ConvWorkspace
from memtune.tuner.measure.inference_measure import measure_facts
from memtune.tuner.runtime import InferenceRunner
from memtune.tuner.runtime.inference_facts import layer_shapes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SLACK_BYTES = 16 << 10  # the allocator rounds each live block up to 512 bytes


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(1024, 2048), nn.ReLU(inplace=True), nn.Linear(2048, 2048), nn.GELU(),
                         nn.Linear(2048, 1000))  # fmt: skip


def vgg_like() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True),
        nn.MaxPool2d(2), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(2048, 1024), nn.ReLU(inplace=True), nn.Dropout(), nn.Linear(1024, 10),
    )  # fmt: skip


def toy_facts(model: nn.Module, shape: tuple[int, ...], conv_workspace: ConvWorkspace = "framework") -> InferenceFacts:
    layers = tuple(LayerFacts(**dataclasses.asdict(s), forward_ms=0.05) for s in layer_shapes(model, shape))
    return InferenceFacts(model="toy", batch=shape[0], dtype="float32", device="gpu", source="modeled", layers=layers,
                          h2d_gbps=50.0, d2h_gbps=50.0, copy_latency_ms=0.0085, copies_overlap=True,
                          partition_floor_ms=0.01, conv_workspace=conv_workspace)  # fmt: skip


def allocated_by_call(runner: InferenceRunner, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The output of one call on ``x`` (on the device) and the device bytes of its working set as allocated."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    y = runner(x)
    torch.cuda.synchronize()
    return y, torch.cuda.max_memory_allocated() - before + runner.resident_bytes + x.numel() * x.element_size()


def plans(facts: InferenceFacts) -> list[InferencePlan]:
    """Plans at the plain model's peak, half and an eighth of it, and the least budget that fits; then every layer
    split one channel per partition, its output sent to the host."""
    peak = max(w.total_bytes for w in working_sets(facts, plain_plan(facts)))
    with pytest.raises(LayerFitError) as info:
        plan_inference(facts, 1)
    least = info.value.need_bytes
    out = [plan_inference(facts, b) for b in (peak, peak // 2, peak // 8, least) if b >= least]
    finest = tuple(
        LayerPlan(name=f.name, channel_parts=f.units, weights="host_prefetch" if f.has_weights else "resident",
                  output="host" if f.units > 1 and not f.aliases_input else "device")
        for f in facts.layers
    )  # fmt: skip
    return [*out, InferencePlan(layers=finest, conv_workspace=facts.conv_workspace)]


@pytest.mark.usefixtures("deterministic")
def test_linear_chain_allocates_its_working_set() -> None:
    torch.manual_seed(0)
    model = mlp().eval()
    x = torch.randn(4, 1, 32, 32)
    facts = toy_facts(model, tuple(x.shape))
    ref = InferenceRunner(model, InferencePlan.resident([f.name for f in facts.layers]), device="cuda")(x).cpu()
    for plan in plans(facts):
        runner = InferenceRunner(model, plan, device="cuda")
        runner(x.cuda())  # cuBLAS takes its workspace on a first call
        y, allocated = allocated_by_call(runner, x.cuda())
        torch.testing.assert_close(y.cpu(), ref, rtol=1e-5, atol=1e-6, msg=lambda m, p=plan: f"{p.compact()}: {m}")
        planned = simulate_inference(facts, plan).peak_bytes
        print(f"{plan.compact()[:50]}: planned {planned} B, allocated {allocated} B")
        assert planned - SLACK_BYTES <= allocated <= planned + SLACK_BYTES, (plan.compact(), allocated, planned)
        del runner, y


@pytest.mark.usefixtures("deterministic")
@pytest.mark.parametrize("conv_workspace", ["framework", "none"])
def test_convolution_chain_equals_the_model(conv_workspace: ConvWorkspace) -> None:
    torch.manual_seed(0)
    model = vgg_like().eval()
    x = torch.randn(2, 3, 32, 32)
    facts = toy_facts(model, tuple(x.shape), conv_workspace)
    ref = InferenceRunner(model, InferencePlan.resident([f.name for f in facts.layers]), device="cuda")(x).cpu()
    for plan in plans(facts):
        runner = InferenceRunner(model, plan, device="cuda")
        runner(x.cuda())
        y, allocated = allocated_by_call(runner, x.cuda())
        torch.testing.assert_close(y.cpu(), ref, rtol=1e-5, atol=1e-6, msg=lambda m, p=plan: f"{p.compact()}: {m}")
        planned = simulate_inference(facts, plan).peak_bytes
        print(f"{plan.compact()[:50]}, convolutions {conv_workspace}: planned {planned} B, allocated {allocated} B")
        if conv_workspace == "none":  # no workspace: the working set is all a call allocates
            assert planned - SLACK_BYTES <= allocated <= planned + SLACK_BYTES, (plan.compact(), allocated, planned)
        del runner, y


@pytest.mark.usefixtures("deterministic")
def test_zoo_vgg16_at_4_mib_on_measured_facts() -> None:
    chain = build("vgg16", {"image_size": 32})
    x = torch.randn(1, 3, 32, 32)
    facts = measure_facts(chain, x, "cuda", repeats=3, name="vgg16", conv_workspace="none")
    assert facts.copies_overlap and facts.h2d_gbps > 1.0 and facts.partition_floor_ms > 0
    ref = InferenceRunner(chain, InferencePlan.resident([f.name for f in facts.layers]), device="cuda")(x).cpu()
    plan = plan_inference(facts, 4 << 20)
    y, allocated = allocated_by_call(InferenceRunner(chain, plan, device="cuda"), x.cuda())
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-5, atol=1e-6)
    assert allocated <= (4 << 20) + SLACK_BYTES

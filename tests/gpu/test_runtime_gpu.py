"""The runtime on a CUDA GPU: same math as the unplanned run, less memory, budget enforcement.

Skipped without CUDA (run on the H200 with ``pytest -m gpu tests/gpu``). Gradients are compared with
the tolerance ``max(1e-6, 10 x the noise of two unplanned runs)``: with deterministic cuDNN/cuBLAS the
noise is zero and the bar is 1e-6; an op that only has an atomic (non-deterministic) CUDA kernel would
otherwise make even two unplanned runs differ.
"""

from __future__ import annotations

import gc
import os
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic GEMMs

import pytest
import torch

from memtune.profiler import zoo
from memtune.profiler.chain import ModelChain
from memtune.profiler.measure import model_input
from memtune.profiler.modeled import modeled_profile
from memtune.tuner.plan import Action, Plan, resolve_storages, segments
from memtune.tuner.policies import POLICIES
from memtune.tuner.runtime import (
    PlanOutOfMemoryError,
    budget_guard,
    check_equivalence,
    planned,
    reference_step,
)
from memtune.tuner.runtime.verify import relative_error
from memtune.tuner.simulator import simulate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEVICE = torch.device("cuda")

MODELS: dict[str, tuple[dict[str, int], int]] = {
    "vgg16": ({"image_size": 32, "num_classes": 10}, 8),
    "alexnet": ({"image_size": 64, "num_classes": 10}, 8),
    "overfeat": ({"image_size": 71, "num_classes": 10}, 8),
    "resnet18": ({"image_size": 64, "num_classes": 10}, 16),
    "resnet50": ({"image_size": 64, "num_classes": 10}, 16),
    "gpt": ({"layers": 4, "width": 128, "heads": 4, "seq_len": 64, "vocab": 512}, 8),
}


@pytest.fixture(autouse=True)
def _deterministic(deterministic: None) -> None:
    """Every test here runs deterministically (the ``deterministic`` fixture of ``conftest``)."""


def build(name: str) -> tuple[ModelChain, torch.Tensor]:
    params, batch = MODELS[name]
    torch.manual_seed(0)
    chain = zoo.build(name, params)
    for stage in chain.stages:
        stage.module.to(DEVICE)
    torch.manual_seed(1)
    return chain, model_input(chain, batch, DEVICE)


def policy_plans(chain: ModelChain, batch: int) -> dict[str, Plan]:
    prof = modeled_profile(chain, batch, "float32", "h200")
    budget = simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes // 2
    out: dict[str, Plan] = {}
    seen: set[Any] = set()
    for name, policy in POLICIES.items():
        plan = policy(prof, budget)
        key = (plan.actions, plan.sync, plan.sync_points, plan.prefetch_lookahead)
        if key not in seen:
            seen.add(key)
            out[name] = plan
    return out


def tolerance(chain: ModelChain, x: torch.Tensor) -> float:
    a = reference_step(chain, x)
    b = reference_step(chain, x)
    noise = max(
        [relative_error(a.loss, b.loss)]
        + [relative_error(g, h) for g, h in zip(a.grads, b.grads, strict=True) if g is not None and h is not None]
    )
    return max(1e-6, 10 * noise)


@pytest.mark.parametrize("name", list(MODELS))
def test_every_policy_keeps_the_math_on_cuda(name: str) -> None:
    chain, x = build(name)
    rtol = tolerance(chain, x)
    ref = reference_step(chain, x)
    failures = []
    for policy, plan in policy_plans(chain, x.shape[0]).items():
        eq, pm = check_equivalence(chain, plan, x, steps=2, reference=ref)
        if not eq.ok(rtol):
            failures.append(f"{policy} ({plan.compact()}, sync={plan.sync}): {eq}")
        if Action.OFFLOAD in plan.actions:
            assert pm.pool is not None and pm.pool.pin_memory
    assert not failures, f"rtol {rtol:g}\n" + "\n".join(failures)


@pytest.mark.parametrize("sync", ["layer", "deferred", "points", "inline"])
@pytest.mark.parametrize("lookahead", [0, 2, 50])
def test_sync_modes_and_lookaheads_keep_the_math_on_cuda(sync: str, lookahead: int) -> None:
    chain, x = build("resnet18")
    n = len(chain)
    rtol = tolerance(chain, x)
    ref = reference_step(chain, x)
    knobs: dict[str, Any] = {"sync": sync, "prefetch_lookahead": lookahead}
    if sync == "points":
        knobs["sync_points"] = (1, n // 2, n - 2)
    for letters in ("o" * n, ("or" * n)[:n], ("okr" * n)[:n]):
        eq, pm = check_equivalence(chain, Plan.from_actions(letters, **knobs), x, steps=3, reference=ref)
        assert eq.ok(rtol), (letters, eq)
        pool = pm.pool
        assert pool is not None and pool.pin_memory and pm.stats.pool_resets == 2


def test_pinned_pool_is_reused_across_steps() -> None:
    chain, x = build("resnet50")
    pm = planned(chain, Plan.uniform(len(chain), Action.OFFLOAD))
    for _ in range(2):
        pm(x).square().mean().backward()
    pool = pm.pool
    assert pool is not None and pool.pin_memory
    allocations, pointers = pool.allocations, pool.chunk_pointers
    for _ in range(3):
        pm(x).square().mean().backward()
    torch.cuda.synchronize()
    assert (pool.allocations, pool.chunk_pointers) == (allocations, pointers)


@pytest.mark.parametrize("name", ["vgg16", "alexnet", "resnet18", "resnet50"])
def test_cuda_copies_exactly_the_bytes_the_plan_semantics_copy(name: str) -> None:
    chain, x = build(name)
    prof = modeled_profile(chain, x.shape[0], "float32", "h200")
    for policy, plan in policy_plans(chain, x.shape[0]).items():
        if any(prof.stages[i].inplace for i, _ in segments(plan.actions)):
            continue  # NOTE [ In-place at segment boundaries ]: one storage more than the table
        fates = resolve_storages(prof, plan.actions)
        expected = sum(st.bytes for st, f in zip(prof.storages, fates, strict=True) if f.copied)
        pm = planned(chain, plan)
        pm(x).square().mean().backward()
        assert pm.stats.d2h_bytes == expected, policy


def peak_step_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Peak bytes allocated during one step above what was allocated before it (grads already exist)."""
    model(x).square().mean().backward()  # warm-up: gradients, cuDNN workspaces, pool
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model(x).square().mean().backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def _small_resnet50() -> tuple[ModelChain, torch.Tensor]:
    """ResNet-50 at 128x128, 10 classes, on the GPU (seeded), with a batch of 32 inputs."""
    torch.manual_seed(0)
    chain = zoo.build("resnet50", {"image_size": 128, "num_classes": 10})
    for stage in chain.stages:
        stage.module.to(DEVICE)
    return chain, model_input(chain, 32, DEVICE)


def test_offload_and_recompute_reduce_peak_memory() -> None:
    chain, x = _small_resnet50()
    n = len(chain)
    keep = peak_step_bytes(planned(chain, Plan.uniform(n)), x)
    offload = peak_step_bytes(planned(chain, Plan.uniform(n, Action.OFFLOAD, sync="layer")), x)
    recompute = peak_step_bytes(planned(chain, Plan.from_actions(("rrrk" * n)[:n])), x)
    assert offload < 0.6 * keep, (offload, keep)
    assert recompute < 0.8 * keep, (recompute, keep)


def test_deferred_frees_where_the_plan_says_however_far_the_host_runs_ahead() -> None:
    """NOTE [ Deferred frees ]: the free is a stream wait at a planned stage, not a host poll. Freed one stage
    after packing, offloaded storages leave the peak; deferred past the forward's end, they all stay."""
    chain, x = _small_resnet50()
    n = len(chain)
    keep = peak_step_bytes(planned(chain, Plan.uniform(n)), x)
    soon = peak_step_bytes(planned(chain, Plan.uniform(n, Action.OFFLOAD, sync_delay=1, prefetch_lookahead=1)), x)
    never = peak_step_bytes(planned(chain, Plan.uniform(n, Action.OFFLOAD, sync_delay=n)), x)
    assert soon < 0.6 * keep, (soon, keep)
    assert never > 0.9 * keep, (never, keep)


def test_budget_guard_raises_plan_oom_and_the_next_step_runs() -> None:
    torch.manual_seed(0)
    chain = zoo.build("vgg16", {"image_size": 128, "num_classes": 10})
    for stage in chain.stages:
        stage.module.to(DEVICE)
    x = model_input(chain, 32, DEVICE)
    n = len(chain)
    keep = planned(chain, Plan.uniform(n, label="none"))
    keep_peak = peak_step_bytes(keep, x)
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()  # parameters and gradients
    previous_fraction = torch.cuda.get_per_process_memory_fraction()
    budget = resident + keep_peak // 4
    with pytest.raises(PlanOutOfMemoryError) as info, budget_guard(budget, keep):
        keep(x).square().mean().backward()
    err = info.value
    assert err.label == "none" and err.stage is not None and 0 <= err.stage < n
    assert err.phase in ("forward", "backward") and err.budget_bytes == budget
    assert "ran out of GPU memory" in str(err) and keep.stage_names[err.stage] in str(err)
    del info, err
    gc.collect()
    assert torch.cuda.get_per_process_memory_fraction() == previous_fraction  # restored
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= resident + (64 << 20)  # the failed step's tensors are gone
    # the process is usable: the same model runs a step, planned and unplanned
    offload = planned(chain, Plan.uniform(n, Action.OFFLOAD, label="vdnn_all"))
    with budget_guard(resident + 2 * keep_peak, offload):
        loss = offload(x).square().mean()
        loss.backward()
    assert torch.isfinite(loss)
    keep(x).square().mean().backward()


@pytest.mark.parametrize("name", ["resnet50", "gpt", "vgg16"])
def test_selective_plans_keep_the_math_on_cuda(name: str) -> None:
    """Selective stages (NOTE [ Selective stages ] in ``memtune.profiler.selective``): all of them, alternating with
    keep, and
    mixed with recompute and offload."""
    chain, x = build(name)
    n = len(chain)
    rtol = tolerance(chain, x)
    ref = reference_step(chain, x)
    failures = []
    for letters in ("s" * n, ("sk" * n)[:n], ("sro" * n)[:n], ("kso" * n)[:n]):
        eq, _ = check_equivalence(chain, Plan.from_actions(letters), x, steps=2, reference=ref)
        if not eq.ok(rtol):
            failures.append(f"{letters}: {eq}")
    assert not failures, f"rtol {rtol:g}\n" + "\n".join(failures)

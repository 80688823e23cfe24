"""Compiled regions on a CUDA GPU (NOTE [ Regions ] in ``memtune.profiler.region_tree``): keep / offload / recompute
around regions compiled by ``torch.compile`` give the gradients and buffers of the same regions compiled without a plan,
within ``max(1e-6, 10 x the noise of two unplanned compiled runs)``; offload copies on the side stream into the pinned
pool and brings storages back ahead of need, with their strides (the model and its input are channels-last, so the
compiled regions save channels-last tensors, and the compiled backward asserts strides); each region compiles once; a
plan that ``memtune.tune(..., compile=True)`` serves runs within its budget under ``budget_guard``, its regions
compiled by a first step before the cap (NOTE [ Regions compile at their first call ] in
``memtune.tuner.runtime._planned_module``). Skipped without CUDA (``pytest -m gpu tests/gpu/test_regions_gpu.py``).
"""

from __future__ import annotations

import copy
import gc
import os
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic GEMMs

import pytest
import torch
from torch import nn

from memtune.profiler.region_tree import CompiledRegions, edge_writes, region_partitions
from memtune.tuner.plan import Plan
from memtune.tuner.runtime import planned
from memtune.tuner.runtime.verify import relative_error
from tests.unit.modules.region_models import TinyEncoder, TinyResNet, square, taken_grads

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _resnet(batch: int = 16, size: int = 64) -> tuple[nn.Module, torch.Tensor]:
    """TinyResNet and its input, both channels-last: every convolution, eager or compiled, then works in that layout,
    so the regions' saved activations are channels-last tensors (not contiguous), whatever inductor's own layout
    heuristics would choose for contiguous inputs (on the H100 they kept this small model's tensors contiguous)."""
    torch.manual_seed(0)
    model = TinyResNet(width=32, classes=10).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    return model, x.contiguous(memory_format=torch.channels_last)


def _compiled_step(model: nn.Module, names: tuple[str, ...], eager: list[int], x: torch.Tensor) -> dict[str, Any]:
    state = copy.deepcopy(model.state_dict())
    with CompiledRegions([model.get_submodule(n) for n in names], 0.5, eager, names):
        square(model(x)).backward()
    grads = taken_grads(model)
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    model.load_state_dict(state)
    return {**grads, **{f"buffer:{n}": b for n, b in buffers.items()}}


def _noise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(relative_error(a[n], b[n]) for n in a)


def _spy(model: nn.Module, regions: list[nn.Module], contiguous: list[bool]) -> tuple[Any, list[Any]]:
    """A pack hook that records, for each activation a compiled region saves (parameters left out), whether it is
    contiguous, and the hooks on the regions' calls that tell it when a compiled region runs; remove the hooks."""
    params = {p.data_ptr() for p in model.parameters()}
    inside = [0]

    def enter(*_: Any) -> None:
        inside[0] += 1

    def leave(*_: Any) -> None:
        inside[0] -= 1

    handles = [h for m in regions for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if inside[0] and t.data_ptr() not in params:
            contiguous.append(t.is_contiguous())
        return t

    return pack, handles


def test_offload_and_recompute_around_compiled_regions_keep_the_compiled_math_on_cuda(deterministic: None) -> None:
    model, x = _resnet()
    names = region_partitions(model, ((x,), {}))[0].names
    eager = sorted(edge_writes(model, list(names), ((x,), {}), loss_fn=square))
    reference = _compiled_step(model, names, eager, x)
    noise = _noise(reference, _compiled_step(model, names, eager, x))
    state = copy.deepcopy(model.state_dict())  # before the spy's step moves the batch norms' running statistics
    saved_strides: list[bool] = []
    regions = CompiledRegions([model.get_submodule(n) for n in names], 0.5, eager, names)
    compiled = [model.get_submodule(n) for k, n in enumerate(names) if k not in eager]
    pack, handles = _spy(model, compiled, saved_strides)
    with regions, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        square(model(x)).backward()
    for h in handles:
        h.remove()
    model.zero_grad(set_to_none=True)
    assert saved_strides, f"no compiled region saved an activation (regions {names}, eager {eager})"
    assert not all(saved_strides), "no compiled region saved a non-contiguous tensor: the strides check tests nothing"
    n = len(names)
    for actions in ("k" * n, "o" * n, "r" * n, ("okr" * n)[:n]):
        model.load_state_dict(state)
        run = planned(model, Plan.from_actions(actions, stages=names, compile_budget=0.5, eager_stages=tuple(eager)))
        square(run(x)).backward()
        got = {**taken_grads(model), **{f"buffer:{k}": b.detach().clone() for k, b in model.named_buffers()}}
        worst = _noise(got, reference)
        assert worst <= max(1e-6, 10 * noise), (actions, worst, noise)
        if "o" in actions:
            stats = run.stats
            assert stats.d2h_copies > 0 and stats.prefetched + stats.on_demand > 0, stats
            assert run.pool is not None and run.pool.pin_memory
        run.release()
    model.load_state_dict(state)


def test_a_region_compiles_once_across_steps_on_cuda() -> None:
    from memtune.profiler.compiled import GRAPHS_COMPILED

    torch.manual_seed(0)
    model = TinyEncoder(vocab=256, width=128, depth=4).cuda()
    ids = torch.randint(0, 256, (8, 128), device="cuda")
    run = planned(model, Plan.from_actions("kor", stages=("embed", "encoder", "head"), compile_budget=1.0))
    wrapped = model.encoder.forward
    square(run(ids)).backward()
    graphs = sum(GRAPHS_COMPILED.values())
    for _ in range(3):
        square(run(ids)).backward()
        assert model.encoder.forward is wrapped
    assert sum(GRAPHS_COMPILED.values()) == graphs
    run.release()


def test_a_compiled_region_plan_that_tune_serves_runs_within_its_budget_on_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At batch 64 and 128 x 128 images the step's activations are hundreds of MiB, so the budget (80% of the peak:
    on the H100 every plan of this model, eager or compiled, needs at least 65% of it, 531 of 813 MiB with every stage
    offloaded, and plans must fit 90% of the budget)
    stands far above what the process holds anyway (cuBLAS's workspace, 32 MiB with this module's
    ``CUBLAS_WORKSPACE_CONFIG``; the model and its input), which is asserted before the cap; each plan's first step,
    which compiles its regions and runs inductor's autotuning (NOTE [ Regions compile at their first call ]), runs
    before the cap, and no graph compiles under it."""
    import memtune.tuner.measure.tune_module
    from memtune.profiler.compiled import GRAPHS_COMPILED

    monkeypatch.setattr(memtune.tuner.measure.tune_module, "COMPILE_BUDGETS", (1.0, 0.5))
    gc.collect()
    torch.cuda.empty_cache()  # what earlier tests left in the cache does not count against the cap
    model, x = _resnet(batch=64, size=128)
    tuned = memtune.tune(model, "80% of peak", example_inputs=x, loss_fn=square, compile=True, trials=60,
                         progress=False, calibrate=False)  # fmt: skip
    assert tuned.regions and all(t.error is None for t in tuned.regions), [t.line() for t in tuned.regions]
    plans = [t.plan for t in tuned.regions if t.plan is not None]
    assert plans, ("no compiled-region plan fits 80% of the peak", tuned.result.budget_bytes, str(tuned))
    budget = tuned.result.budget_bytes
    assert budget > 256 << 20, f"a budget of {budget / 2**20:.1f} MiB is too small to test a plan against"
    for plan in [tuned.plan, plans[0]]:
        assert plan is not None
        run = memtune.planned(model, plan)
        square(run(x)).backward()  # compiles the regions and autotunes their kernels, uncapped
        model.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        assert held < budget // 4, f"{held / 2**20:.1f} MiB allocated before the cap of {budget / 2**20:.1f} MiB"
        graphs = sum(GRAPHS_COMPILED.values())
        with memtune.budget_guard(budget, run):
            for _ in range(2):
                square(run(x)).backward()
                model.zero_grad(set_to_none=True)
        assert sum(GRAPHS_COMPILED.values()) == graphs, "a region compiled under the cap"
        run.release()


def test_the_kept_region_plan_peaks_within_what_its_profile_predicts_on_cuda(deterministic: None) -> None:
    """NOTE [ Region backward measured in the chain ]: a profile of compiled regions reads each region's backward in
    one kept step, so the simulated peak of the plan that keeps every region covers what that plan's step reaches (at
    most 1 MiB over), and is not far above it (at most 10% over). Regions at depth 2 of the channels-last TinyResNet:
    each compiled backward hands the one before it its gradient."""
    from memtune.profiler._region_chain import chain_backward_bytes
    from memtune.profiler.region_profile import profile_regions
    from memtune.tuner import simulate
    from memtune.tuner.measure.module_bench import measure_step

    model, x = _resnet(batch=64, size=128)
    parts = region_partitions(model, ((x,), {}))
    finest = max(parts, key=lambda p: len(p.names))
    (region,) = profile_regions(model, x, [0.5], partitions=[finest], loss_fn=square, rules=[], warmup=1, repeats=3)
    assert region.profile is not None, region.error
    prof = region.profile
    eager = tuple(prof.eager_stages)
    modules = [model.get_submodule(n) for n in finest.names]
    with CompiledRegions(modules, 0.5, list(eager), finest.names):
        chained = chain_backward_bytes(
            model, modules, [k not in eager for k in range(len(modules))], ((x,), {}), square, "float32", x.device
        )
    model.zero_grad(set_to_none=True)
    read = [c for k, c in enumerate(chained) if k not in eager]
    assert read and all(c is not None and c > 0 for c in read), chained
    plan = Plan.from_actions("k" * len(finest.names), stages=finest.names, compile_budget=0.5, eager_stages=eager)
    predicted = simulate(prof, plan.named(prof)).peak_bytes
    run = planned(model, plan)
    got = measure_step(model, run, x, square, warmup=1, steps=3, output_held=True)
    run.release()
    measured = got["peak_bytes"]
    print(f"regions {finest.names}: chain readings {chained}; predicted {predicted} B, measured {measured} B")
    assert measured <= predicted + (1 << 20), (measured, predicted)
    assert predicted <= 1.10 * measured, (measured, predicted)


def test_tune_measures_its_finalists_and_serves_the_fastest_that_ran_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ Measured finalists ]: ``memtune.tune`` on a CUDA module measures up to ``finalists`` plans under the
    budget, the fastest compiler point that fits among them, serves the fastest measured, and leaves the model's
    parameters and buffers as they were (the update runs at learning rate 0; the buffers are restored)."""
    import memtune
    import memtune.tuner.measure.tune_module

    monkeypatch.setattr(memtune.tuner.measure.tune_module, "COMPILE_BUDGETS", (1.0, 0.5))
    gc.collect()
    torch.cuda.empty_cache()
    model, x = _resnet(batch=64, size=128)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tuned = memtune.tune(model, "80% of peak", example_inputs=x, loss_fn=square, compile=True, trials=60,
                         progress=False, calibrate=False, finalists=3)  # fmt: skip
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "tune changed the model's parameters or buffers"
    assert 1 <= len(tuned.measured) <= 3, str(tuned)
    points = [f for f in tuned.measured if f.name.startswith("compiled whole")]
    fitting = [c for r in tuned.searched for c in r.compiled if c.feasible]
    assert len(points) == (1 if fitting else 0), str(tuned)
    (won,) = [f for f in tuned.measured if f.served]
    timed = [f.step_ms for f in tuned.measured if f.step_ms is not None]
    assert won.step_ms == min(timed), str(tuned)
    assert won.reserved_bytes is not None and won.reserved_bytes <= tuned.result.budget_bytes
    best = tuned.result.best
    assert best is not None and (best.step_ms, best.peak_bytes) == (won.predicted_ms, won.predicted_peak_bytes)
    assert "measured before serving" in str(tuned) and "<- served" in str(tuned)


def test_host_prices_of_a_region_profile_are_measured_with_the_runtime_on_cuda() -> None:
    """NOTE [ Host prices ]: a region profile's kept step's host time, and what offloading and recomputing each region
    add, measured with memtune's runtime; the model's parameters and buffers are left as found, and the simulator's
    kept step is then at least the host's."""
    from memtune.profiler.region_profile import profile_regions
    from memtune.tuner import simulate
    from memtune.tuner.measure.host_price import with_host_prices

    model, x = _resnet(batch=32, size=64)
    parts = region_partitions(model, ((x,), {}))
    finest = max(parts, key=lambda p: len(p.names))
    (region,) = profile_regions(model, x, [1.0], partitions=[finest], loss_fn=square, rules=[], warmup=1, repeats=3)
    assert region.profile is not None, region.error
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    prof = with_host_prices(model, x, region.profile, square)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "pricing changed the model's parameters or buffers"
    host = prof.host
    assert host is not None and host.keep_ms > 0
    n = prof.n_stages
    assert host.offload_ms is not None and len(host.offload_ms) == n and sum(host.offload_ms) > 0
    assert host.recompute_ms is not None and len(host.recompute_ms) == n and sum(host.recompute_ms) > 0
    keep = Plan.from_actions("k" * n).named(prof)
    got = simulate(prof, keep)
    print(f"host prices of {n} regions: {host}; kept step simulated {got.step_ms:.2f} ms, host {got.host_ms:.2f} ms")
    assert got.host_ms == host.keep_ms and got.step_ms >= host.keep_ms

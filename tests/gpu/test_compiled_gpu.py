"""Compiled plans on a CUDA GPU (NOTE [ Compiled stages ] in ``memtune.profiler.compiled``): keep / offload / recompute
around stages compiled by ``torch.compile`` give the loss, gradients and buffers of the same model run compiled
without a plan (offload keeps strides, which the compiled backward asserts), within ``max(1e-6, 10 x the noise of two
unplanned compiled runs)``: bitwise where the kernels are deterministic (ResNet-18 was), not where a kernel adds
atomically (the GPT's embedding backward). Skipped without CUDA (``pytest -m gpu tests/gpu``).
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic GEMMs

import pytest
import torch

from memtune.profiler import zoo
from memtune.profiler.compiled import compiled_chain
from memtune.profiler.measure import model_input, profile
from memtune.tuner.plan import Action, Plan
from memtune.tuner.runtime import check_equivalence, reference_step
from memtune.tuner.runtime.verify import relative_error
from memtune.tuner.search import tune
from memtune.tuner.simulator import simulate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize(
    ("name", "params", "batch", "budget"),
    [
        ("resnet18", {"image_size": 64, "num_classes": 10}, 8, 0.5),
        ("gpt", {"layers": 2, "width": 64, "heads": 4, "seq_len": 32, "vocab": 128}, 4, 1.0),
    ],
)
def test_compiled_plans_keep_the_compiled_math_on_cuda(
    name: str, params: dict[str, int], batch: int, budget: float
) -> None:
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    chain = zoo.build(name, params)
    for s in chain.stages:
        s.module.cuda()
    x = model_input(chain, batch, "cuda")
    run = compiled_chain(chain, budget).as_sequential()
    ref = reference_step(chain, x, run=run)
    again = reference_step(chain, x, run=run)  # atomics (an embedding's backward) make two runs differ
    noise = max(
        [relative_error(ref.loss, again.loss)]
        + [relative_error(g, h) for g, h in zip(ref.grads, again.grads, strict=True) if g is not None and h is not None]
    )
    n = len(chain)
    for acts in ("k" * n, "o" * n, "r" * n, ("okr" * n)[:n]):
        plan = Plan.from_actions(acts, compile_budget=budget)
        eq, pm = check_equivalence(chain, plan, x, steps=2, reference=ref)
        assert eq.ok(max(1e-6, 10 * noise)), (acts, eq, noise)
        if Action.OFFLOAD in plan.actions:
            assert pm.stats.d2h_copies > 0


def test_a_plan_tuned_on_a_compiled_profile_runs_compiled() -> None:
    torch.manual_seed(0)
    chain = zoo.build("resnet18", {"image_size": 64, "num_classes": 10})
    prof = profile(chain, 16, device="cuda", warmup=1, repeats=2, compile_budget=1.0)
    assert prof.compile_budget == 1.0 and prof.compile_seconds is not None
    fits = simulate(prof, Plan.uniform(prof.n_stages, Action.RECOMPUTE)).peak_bytes
    best = tune(prof, fits, trials=30, seed=0).best
    assert best is not None and best.plan.compile_budget == 1.0


def test_whole_compile_plans_are_measured_chosen_and_run_on_cuda() -> None:
    """NOTE [ Whole-model compile ]: compiler points measured in fresh processes, a plan ``tune`` serves from them, and
    ``planned`` running it gives the compiler's own run at that budget (within the noise of two such runs)."""
    import functools

    from memtune.tuner.measure._peers import compiled_model
    from memtune.tuner.measure.compiler_points import measure_compiler_points, with_compiler_points
    from memtune.tuner.runtime._planned import CompiledWhole

    params = {"image_size": 64, "num_classes": 10}
    torch.manual_seed(0)
    chain = zoo.build("resnet18", params)
    prof = profile(chain, 16, device="cuda", warmup=1, repeats=2)
    points, rows = measure_compiler_points(functools.partial(zoo.build, "resnet18", params), prof, [0.5, 1.0])
    assert [p.activation_budget for p in points] == [0.5, 1.0], [r.error for r in rows]
    assert all(p.step_ms > 0 and p.peak_bytes > 0 for p in points)
    assert all(p.update_ms is not None and 0 < p.update_ms < p.step_ms for p in points)  # SGD's update, by CUDA events
    prof = with_compiler_points(prof, points)
    fastest = min(points, key=lambda p: p.step_ms)
    result = tune(prof, 4 * fastest.peak_bytes, trials=20, seed=0)
    assert result.best is not None and result.best.plan.whole_compile is not None
    chosen = next(p for p in points if p.activation_budget == result.best.plan.whole_compile)
    assert result.best.step_ms == pytest.approx(chosen.forward_backward_ms)  # NOTE [ The optimizer's update ]
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    for s in chain.stages:
        s.module.cuda()
    x = model_input(chain, 8, "cuda")
    budget = result.best.plan.whole_compile
    run = compiled_model(chain.as_sequential(), budget)
    ref = reference_step(chain, x, run=run)
    again = reference_step(chain, x, run=run)
    noise = max(
        [relative_error(ref.loss, again.loss)]
        + [relative_error(g, h) for g, h in zip(ref.grads, again.grads, strict=True) if g is not None and h is not None]
    )
    tol = max(1e-6, 10 * noise)
    eq, pm = check_equivalence(chain, result.best.plan, x, steps=2, reference=ref)
    assert isinstance(pm, CompiledWhole)
    assert eq.ok(tol), (eq, tol)

"""Per-stage prefetch lookaheads on a CUDA GPU (NOTE [ Prefetch lookahead ] in ``memtune.tuner.plan``): the same math as
the unplanned run, prefetches issued at each need stage's own trigger on the copy stream, and the per-layer trigger's
plan measured beside the same plan with one global lookahead (``benchmarks.prefetch_trigger``'s rows, small).

Skipped without CUDA (run on the GPU with ``pytest -m gpu tests/gpu``). Gradients are compared with the tolerance
``max(1e-6, 10 x the noise of two unplanned runs)``, as in ``test_runtime_gpu``.
"""

from __future__ import annotations

import functools
import itertools
import os
import random

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic GEMMs

import pytest
import torch

from memtune.profiler import zoo
from memtune.profiler.chain import ModelChain
from memtune.profiler.measure import model_input
from memtune.profiler.modeled import modeled_profile
from memtune.tuner import prefetch_trigger
from memtune.tuner.measure.bench import bench_plans
from memtune.tuner.plan import Action, Plan
from memtune.tuner.policies import POLICIES
from memtune.tuner.runtime import check_equivalence, planned, reference_step
from memtune.tuner.runtime.offload import StepState
from memtune.tuner.runtime.verify import relative_error
from memtune.tuner.simulator import simulate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEVICE = torch.device("cuda")
PARAMS = {"image_size": 64, "num_classes": 10}
BATCH = 16


@pytest.fixture(autouse=True)
def _deterministic(deterministic: None) -> None:
    """Every test here runs deterministically (the ``deterministic`` fixture of ``conftest``)."""


def _chain() -> tuple[ModelChain, torch.Tensor]:
    torch.manual_seed(0)
    chain = zoo.build("resnet18", PARAMS)
    for stage in chain.stages:
        stage.module.to(DEVICE)
    torch.manual_seed(1)
    return chain, model_input(chain, BATCH, DEVICE)


def _tolerance(chain: ModelChain, x: torch.Tensor) -> float:
    a, b = reference_step(chain, x), reference_step(chain, x)
    noise = [relative_error(a.loss, b.loss)]
    noise += [relative_error(g, h) for g, h in zip(a.grads, b.grads, strict=True) if g is not None and h is not None]
    return max(1e-6, 10 * max(noise))


def _lookaheads(n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.choice((0, 1, 2, 3, n)) for _ in range(n))


def _trigger_plan(chain: ModelChain, name: str) -> tuple[Plan, Plan, int]:
    """A baseline at half the all-keep peak of a modeled profile: its plan with the best global lookahead that fits,
    the same with the per-layer trigger's lookaheads, and the budget (bytes)."""
    prof = modeled_profile(chain, BATCH, "float32", "h200")
    budget = simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes // 2
    plan = POLICIES[name](prof, budget).with_(conv_rule="default", conv_algos={}, conv_workspace_limit_bytes=None)
    trig = prefetch_trigger(prof, plan, max(budget, simulate(prof, plan).peak_bytes))
    return plan.with_(prefetch_lookahead=trig.start_lookahead), trig.plan, budget


@pytest.mark.parametrize("sync", ["layer", "deferred"])
def test_per_stage_lookaheads_keep_the_math_on_cuda(sync: str) -> None:
    chain, x = _chain()
    n = len(chain)
    rtol = _tolerance(chain, x)
    ref = reference_step(chain, x)
    plans = [Plan.from_actions(letters, sync=sync, prefetch_lookaheads=_lookaheads(n, k))
             for k, letters in enumerate(("o" * n, ("or" * n)[:n], ("okr" * n)[:n]))]  # fmt: skip
    plans += [_trigger_plan(chain, name)[1].with_(sync=sync) for name in ("vdnn_all_p", "vdnn_conv_p")]
    for plan in plans:
        eq, pm = check_equivalence(chain, plan, x, steps=3, reference=ref)
        assert eq.ok(rtol), (plan.compact(), plan.prefetch_lookaheads, eq)
        assert pm.pool is not None and pm.pool.pin_memory and pm.stats.prefetched > 0


def test_prefetches_fire_at_each_need_stages_trigger_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    issued: list[tuple[int, int]] = []
    original = StepState._fetch

    def spy(self: StepState, entry: object, *, prefetch: bool) -> None:
        if prefetch:
            assert self.backward_stage is not None
            issued.append((self.backward_stage, entry.need))  # type: ignore[attr-defined]
        original(self, entry, prefetch=prefetch)  # type: ignore[arg-type]

    monkeypatch.setattr(StepState, "_fetch", spy)
    chain, x = _chain()
    n = len(chain)
    las = _lookaheads(n, 7)
    pm = planned(chain, Plan.uniform(n, Action.OFFLOAD, sync="deferred", sync_delay=1, prefetch_lookaheads=las))
    pm(x).square().mean().backward()
    torch.cuda.synchronize()
    assert issued and pm.stats.on_demand == 0
    for at, need in issued:
        assert at == min(n - 1, need + las[need]), (at, need)
    for (at, need), (at2, need2) in itertools.pairwise(issued):
        assert at2 < at or need2 <= need


def test_the_trigger_plan_runs_under_its_budget_beside_the_global_one() -> None:
    chain, _ = _chain()
    best_global, per_layer, budget = _trigger_plan(chain, "vdnn_conv_p")
    prof = modeled_profile(chain, BATCH, "float32", "h200")
    rows = bench_plans(
        None,
        prof,
        BATCH,
        "float32",
        max(budget, simulate(prof, per_layer).peak_bytes, simulate(prof, best_global).peak_bytes) * 2,
        [("best global", "variant", best_global), ("per-layer", "variant", per_layer)],
        pytorch_builtins=False,
        warmup=1,
        iters=3,
        unconstrained=False,
        chain_factory=functools.partial(zoo.build, "resnet18", PARAMS),
    )
    assert [r.name for r in rows] == ["best global", "per-layer"]
    for row in rows:
        assert row.error is None and row.fits and row.step_ms is not None and row.step_ms > 0, row
        assert row.offload_stats is not None and row.offload_stats["prefetched"] > 0

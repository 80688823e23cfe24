"""Per-stage prefetch lookaheads on a live model (NOTE [ Prefetch lookahead ] in ``memtune.tuner.plan``): each offloaded
storage comes back at its need stage's own trigger, those issued together by need, and the math never changes:
loss, gradients and buffers bitwise equal to the unplanned run's on CPU, also for the per-layer trigger's plans."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from memtune.profiler import zoo
from memtune.profiler.chain import ModelChain
from memtune.profiler.measure import model_input
from memtune.profiler.modeled import modeled_profile
from memtune.profiler.module_profile import profile_module
from memtune.tuner import prefetch_trigger
from memtune.tuner.plan import Action, Plan
from memtune.tuner.runtime import check_equivalence, planned, reference_step
from memtune.tuner.simulator import simulate
from tests.unit.modules.models import build_case
from tests.unit.profiler.small_chains import small_vgg
from tests.unit.runtime.prefetch_spy import record_prefetches

torch.set_num_threads(1)


def _lookaheads(n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.choice((0, 0, 1, 2, 3, 5, n + 3)) for _ in range(n))


@pytest.mark.parametrize("seed", range(3))
def test_each_storage_comes_back_at_its_need_stages_own_trigger(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    issued = record_prefetches(monkeypatch)  # (backward stage when issued, stage that needs it)
    chain = small_vgg()
    n = len(chain)
    las = _lookaheads(n, seed)
    pm = planned(chain, Plan.uniform(n, Action.OFFLOAD, sync="layer", prefetch_lookaheads=las))
    x = model_input(chain, 2)
    pm(x).square().mean().backward()
    assert len(issued) > 3
    for at, need in issued:
        assert at == min(n - 1, need + las[need]), (at, need, las[need])
    for (at, need), (at2, need2) in itertools.pairwise(issued):
        assert at2 < at or need2 <= need  # issued together: the one needed first goes first
    assert pm.stats.prefetched == len(issued) and pm.stats.on_demand == 0


def _check_bitwise(chain: ModelChain, plans: list[Plan], batch: int = 2, steps: int = 2) -> None:
    torch.manual_seed(1)
    x = model_input(chain, batch)
    ref = reference_step(chain, x)
    for plan in plans:
        eq, pm = check_equivalence(chain, plan, x, steps=steps, reference=ref)
        assert eq.ok(0.0), (plan.compact(), plan.sync, plan.prefetch_lookaheads, eq)
        assert pm.stats.h2d_copies > 0 or plan.sync == "inline" or Action.OFFLOAD not in plan.actions


def _per_stage_plans(n: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    mixed = Plan.from_actions([rng.choice("koor") for _ in range(n)])
    offload = Plan.uniform(n, Action.OFFLOAD)
    return [
        offload.with_(sync="layer", prefetch_lookaheads=_lookaheads(n, seed)),
        offload.with_(sync="deferred", sync_delay=1, prefetch_lookaheads=_lookaheads(n, seed + 1)),
        mixed.with_(sync="deferred", prefetch_lookaheads=_lookaheads(n, seed + 2)),
        mixed.with_(sync="points", sync_points=(0, n // 2, n - 1), prefetch_lookaheads=_lookaheads(n, seed + 3)),
    ]


def _trigger_plans(chain: ModelChain, batch: int) -> list[Plan]:
    """The per-layer trigger's plans for every offloading baseline at half the all-keep peak of a modeled profile."""
    from memtune.tuner.policies import POLICIES

    prof = modeled_profile(chain, batch, "float32", "h200")
    budget = simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes // 2
    out = []
    for name in ("vdnn_all_p", "vdnn_conv_p", "hmms", "layup_cumulative"):
        plan = POLICIES[name](prof, budget).with_(conv_rule="default", conv_algos={}, conv_workspace_limit_bytes=None)
        trig = prefetch_trigger(prof, plan, max(budget, simulate(prof, plan).peak_bytes))
        if trig.plan.prefetch_lookaheads is not None:
            out.append(trig.plan)
    assert out, "some baseline should offload"
    return out


def test_per_stage_lookaheads_keep_the_math_on_a_small_chain() -> None:
    chain = small_vgg()
    _check_bitwise(chain, _per_stage_plans(len(chain), 0) + _trigger_plans(chain, 2))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("resnet18", {"image_size": 16, "num_classes": 5}),
        ("gpt", {"layers": 2, "width": 32, "heads": 4, "seq_len": 8, "vocab": 64}),
    ],
)
def test_per_stage_lookaheads_keep_the_math_on_zoo_models(name: str, params: dict[str, int]) -> None:
    torch.manual_seed(0)
    chain = zoo.build(name, params)
    _check_bitwise(chain, _per_stage_plans(len(chain), 5) + _trigger_plans(chain, 2))


@pytest.mark.slow
def test_per_stage_lookaheads_keep_the_math_on_module_stages() -> None:
    """A U-Net of module stages: its skip connections are needed far from where they are made."""
    case = build_case("unet")
    prof = profile_module(case.model, case.inputs, loss_fn=case.loss_fn, warmup=0, repeats=1)
    n = prof.n_stages
    offload = Plan.uniform(n, Action.OFFLOAD, sync="deferred", sync_delay=1)
    budget = simulate(prof, Plan.uniform(n)).peak_bytes
    plans = [offload.with_(prefetch_lookaheads=_lookaheads(n, 9)), prefetch_trigger(prof, offload, budget).plan]
    ref = reference_step(case.model, case.inputs, loss_fn=case.loss_fn)
    for plan in plans:
        eq, pm = check_equivalence(
            case.model, plan.named(prof), case.inputs, steps=2, reference=ref, loss_fn=case.loss_fn
        )
        assert eq.ok(0.0), (plan.prefetch_lookaheads, eq)
        assert pm.stats.prefetched > 0

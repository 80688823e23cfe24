"""A plan never changes the math: loss, every parameter gradient and every buffer equal the unplanned run's.

Tiny versions of every zoo model family under every baseline policy (profiles are modeled, budgets half
the all-keep simulated peak) and with selective stages, and hand-made plans (all keep / offload / recompute /
selective, alternating, seeded random, every sync mode and several prefetch lookaheads) on small chains.
Runs on CPU, fp32: the tolerance is 1e-6 relative (``memtune.tuner.runtime.verify.relative_error``); in practice
results are bitwise equal. Dropout (p=0.5 in the VGG/AlexNet/OverFeat classifiers) checks that recompute replays RNG.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import pytest
import torch
from torch import nn

from memtune.profiler import zoo
from memtune.profiler.chain import ModelChain
from memtune.profiler.measure import model_input
from memtune.profiler.modeled import modeled_profile
from memtune.tuner.plan import Action, Plan
from memtune.tuner.policies import POLICIES
from memtune.tuner.runtime import check_equivalence, reference_step
from memtune.tuner.simulator import simulate
from tests.unit.profiler.small_chains import small_vgg

torch.set_num_threads(1)

RTOL = 1e-6

# name -> (zoo parameters, batch, planned steps per plan); the VGG family's 4096-wide classifier makes
# a step cost ~1 s on CPU, so those take one planned step per plan (pool reuse is tested on the others)
TINY: dict[str, tuple[dict[str, int], int, int]] = {
    "vgg16": ({"image_size": 32, "num_classes": 10}, 2, 1),
    "alexnet": ({"image_size": 63, "num_classes": 10}, 2, 2),
    "overfeat": ({"image_size": 71, "num_classes": 10}, 2, 2),
    "resnet18": ({"image_size": 32, "num_classes": 10}, 2, 2),
    "resnet50": ({"image_size": 32, "num_classes": 10}, 2, 2),
    "gpt": ({"layers": 2, "width": 64, "heads": 4, "seq_len": 16, "vocab": 128}, 2, 2),
}
# same layer types as vgg16, deeper; several seconds each on CPU
TINY_SLOW: dict[str, tuple[dict[str, int], int, int]] = {
    "vgg19": ({"image_size": 32, "num_classes": 10}, 2, 1),
    "vgg116": ({"image_size": 32, "num_classes": 10}, 1, 1),
}


def build(name: str, params: dict[str, int]) -> ModelChain:
    torch.manual_seed(0)
    return zoo.build(name, params)


def distinct_policy_plans(chain: ModelChain, batch: int) -> dict[str, Plan]:
    """Every policy's plan at half the all-keep peak, one per distinct runtime behaviour.

    Plans that differ only in convolution algorithms (which the runtime leaves to the framework) or
    label run identically, so only the first policy giving each is kept.
    """
    prof = modeled_profile(chain, batch, "float32", "h200")
    budget = simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes // 2
    out: dict[str, Plan] = {}
    seen: set[tuple[Any, ...]] = set()
    for name, policy in POLICIES.items():
        plan = policy(prof, budget)
        key = (plan.actions, plan.sync, plan.sync_points, plan.prefetch_lookahead)
        if key not in seen:
            seen.add(key)
            out[name] = plan
    return out


def check_all_policies(name: str, params: dict[str, int], batch: int, steps: int) -> None:
    chain = build(name, params)
    torch.manual_seed(1)
    x = model_input(chain, batch)
    plans = distinct_policy_plans(chain, batch)
    assert len(plans) >= 4, plans  # keep, offload-all, recompute-heavy and mixed plans at least
    assert any(Action.RECOMPUTE in p.actions for p in plans.values())
    assert any(Action.OFFLOAD in p.actions for p in plans.values())
    ref = reference_step(chain, x)
    failures = []
    for policy, plan in plans.items():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*conv_rule")
            eq, pm = check_equivalence(chain, plan, x, steps=steps, reference=ref)
        if not eq.ok(RTOL):
            failures.append(f"{policy} ({plan.compact()}, sync={plan.sync}): {eq}")
        if Action.OFFLOAD in plan.actions and steps > 1:
            pool = pm.pool
            assert pool is not None and pm.stats.pool_resets == steps - 1, policy
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TINY))
def test_every_policy_keeps_the_math(name: str) -> None:
    params, batch, steps = TINY[name]
    check_all_policies(name, params, batch, steps)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TINY_SLOW))
def test_every_policy_keeps_the_math_deep_vgg(name: str) -> None:
    params, batch, steps = TINY_SLOW[name]
    check_all_policies(name, params, batch, steps)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TINY))
def test_selective_stages_keep_the_math(name: str) -> None:
    """Every stage ``selective`` (NOTE [ Selective stages ] in ``memtune.profiler.selective``), then every other one."""
    params, batch, steps = TINY[name]
    chain = build(name, params)
    torch.manual_seed(1)
    x = model_input(chain, batch)
    n = len(chain)
    ref = reference_step(chain, x)
    for letters in ("s" * n, ("sk" * n)[:n]):
        eq, _ = check_equivalence(chain, Plan.from_actions(letters), x, steps=steps, reference=ref)
        assert eq.ok(RTOL), (letters, eq)


def test_every_zoo_family_is_covered() -> None:
    """vgg216..vgg516 are vgg116 with more of the same convs (GBs of weights even at 32x32): not run."""
    covered = set(TINY) | set(TINY_SLOW)
    assert covered | {"vgg216", "vgg316", "vgg416", "vgg516"} == set(zoo.ZOO_NAMES)


# ---- hand-made plans -------------------------------------------------------------------------------


def hand_made(n: int) -> dict[str, Plan]:
    rng = random.Random(1234)
    plans = {
        "keep": Plan.uniform(n, Action.KEEP),
        "offload": Plan.uniform(n, Action.OFFLOAD),
        "recompute": Plan.uniform(n, Action.RECOMPUTE),
        "alt-ko": Plan.from_actions(("ko" * n)[:n]),
        "alt-kr": Plan.from_actions(("kr" * n)[:n]),
        "alt-or": Plan.from_actions(("or" * n)[:n]),
        "alt-ro": Plan.from_actions(("ro" * n)[:n]),
        "pairs": Plan.from_actions(("oorrk" * n)[:n]),
        "selective": Plan.uniform(n, Action.SELECTIVE),
        "alt-so": Plan.from_actions(("so" * n)[:n]),
        "alt-rs": Plan.from_actions(("rs" * n)[:n]),
    }
    for k in range(4):
        plans[f"random-{k}"] = Plan.from_actions([rng.choice("kor") for _ in range(n)])
    for k in range(2):
        plans[f"random-s{k}"] = Plan.from_actions([rng.choice("kors") for _ in range(n)])
    return plans


FULL_SYNC_SWEEP = {"offload", "alt-or", "pairs", "random-0"}


def sync_variants(plan: Plan, n: int) -> list[Plan]:
    return [
        plan.with_(sync="layer", prefetch_lookahead=0),
        plan.with_(sync="layer", prefetch_lookahead=1),
        plan.with_(sync="deferred", prefetch_lookahead=2),
        plan.with_(sync="deferred", prefetch_lookahead=n + 5),
        plan.with_(sync="points", sync_points=(0, n // 2, n - 1), prefetch_lookahead=3),
        plan.with_(sync="inline", prefetch_lookahead=0),
    ]


SMALL: dict[str, tuple[Any, int]] = {
    "small-vgg": (small_vgg, 2),
    "resnet18": (lambda: build("resnet18", {"image_size": 16, "num_classes": 5}), 2),
    "gpt": (lambda: build("gpt", {"layers": 2, "width": 32, "heads": 4, "seq_len": 8, "vocab": 64}), 2),
}


@pytest.mark.slow
@pytest.mark.parametrize("model", list(SMALL))
def test_hand_made_plans_keep_the_math(model: str) -> None:
    make, batch = SMALL[model]
    chain = make()
    torch.manual_seed(1)
    x = model_input(chain, batch)
    n = len(chain)
    ref = reference_step(chain, x)
    failures = []
    for index, (label, plan) in enumerate(hand_made(n).items()):
        if Action.OFFLOAD not in plan.actions:
            variants = [plan]
        elif label in FULL_SYNC_SWEEP:
            variants = sync_variants(plan, n)
        else:  # one knob setting each, rotating through them
            options = sync_variants(plan, n)
            variants = [options[index % len(options)]]
        for variant in variants:
            eq, pm = check_equivalence(chain, variant, x, steps=2, reference=ref)
            if not eq.ok(RTOL):
                failures.append(f"{label} {variant.compact()} sync={variant.sync}: {eq}")
            if Action.OFFLOAD in variant.actions:
                assert pm.stats.d2h_copies > 0 and pm.stats.pool_resets == 1, (label, variant.sync)
    assert not failures, "\n".join(failures)


def test_checks_detect_a_changed_gradient() -> None:
    """The comparison is not vacuous: a model whose planned run differs is reported."""
    chain = small_vgg()
    x = model_input(chain, 2)
    eq, _ = check_equivalence(chain, Plan.uniform(len(chain), Action.RECOMPUTE), x, steps=1, seed=0)
    assert eq.ok(RTOL)
    dropout = chain.stages[12].module
    assert isinstance(dropout, nn.Dropout)

    calls = {"n": 0}

    def reseed_on_second_call(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the planned forward draws a different dropout mask
            torch.manual_seed(99)

    handle = dropout.register_forward_pre_hook(reseed_on_second_call)
    try:
        eq, _ = check_equivalence(chain, Plan.uniform(len(chain)), x, steps=1, seed=0)
    finally:
        handle.remove()
    assert not eq.ok(RTOL) and eq.grad > RTOL

"""The simulator's two views of one step agree on module profiles: the running total of the ledger's events (whose
maximum is ``SimResult.peak_bytes``) and the blocks the allocator model replays tensor by tensor (NOTE [ Allocator
placement ]) peak alike on random plans of the committed module profiles, gradients that are slices of larger storages
included (NOTE [ Gradient storages made in the backward ] in ``memtune.tuner._stage_backward``). The chain profiles'
agreement is ``test_simulator_ledger.py``'s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtune.profiler import Profile
from memtune.tuner._ledger import blocks_peak
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import Simulator
from tests.unit.tuner.random_plans import random_plans

PROMISES = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "h100" / "promises"
#: module profiles of the H100 promises: (file, gradients made slices of storages twice their size)
CASES = (
    ("unet", False),  # the decoder's concatenations: gradients that are slices (NOTE [ Gradient storages ])
    ("modeled-unet", False),
    ("unet", True),
    ("gpt2", True),
    ("mobilenet_v2", True),
    ("t5_small", True),
)
SLOW_CASES = (("densenet121", False), ("densenet121", True), ("llama", True), ("resnet50", True), ("bert_mlm", True))


def _profile(name: str, sliced: bool) -> Profile:
    profile = Profile.model_validate(json.loads((PROMISES / f"{name}.json").read_text())["profile"])
    if not sliced:
        return profile
    storages = tuple(
        s.model_copy(update={"grad_storage_bytes": 2 * s.grad_bytes}) if s.grad_bytes else s for s in profile.storages
    )
    return profile.model_copy(update={"storages": storages})


def _assert_views_agree(profile: Profile, plans: list[Plan], what: str) -> None:
    sim = Simulator(profile)
    for plan in [Plan.uniform(profile.n_stages), *plans]:
        r = sim.run(plan, timeline=True, check=False)
        where = f"{what}: {plan.compact()} {plan.sync}"
        assert blocks_peak(r.base_bytes, r.blocks) == r.peak_bytes, where
        assert max(live for _, live, _ in r.timeline) == r.peak_bytes, where
        assert r.base_bytes + sum(b if kind == "alloc" else -b for kind, _, b in r.blocks) == r.timeline[-1][1], where
        assert sim.run(plan, check=False).peak_bytes == r.peak_bytes, where  # the fast path or the reference alike


@pytest.mark.parametrize(("name", "sliced"), CASES)
def test_the_blocks_peak_where_the_running_total_does_on_module_profiles(name: str, sliced: bool) -> None:
    """100 plans of each of six profiles, and the unplanned step: 606 in all."""
    _assert_views_agree(_profile(name, sliced), random_plans(_profile(name, sliced), 100, seed=11), name)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "sliced"), CASES + SLOW_CASES)
def test_the_views_agree_on_many_plans(name: str, sliced: bool) -> None:
    profile = _profile(name, sliced)
    _assert_views_agree(profile, random_plans(profile, 400, seed=12), name)


def test_a_slice_of_a_storage_is_made_after_the_incoming_gradient_and_before_the_transient_goes() -> None:
    """The U-Net's ``dec.2`` makes the skip's gradient as a slice of the concatenation's: the rest of that storage is
    allocated in the stage's backward, after its incoming gradient is freed and before its transient is."""
    profile = _profile("unet", False)
    sim = Simulator(profile)
    tab = sim.tables
    k = next(k for k in range(profile.n_stages) if tab.grad_rest_made[k])
    r = sim.run(Plan.uniform(profile.n_stages), timeline=True)
    keys = [(kind, key) for kind, key, _ in r.blocks]
    made = [i for i, (kind, key) in enumerate(keys) if kind == "alloc" and isinstance(key, tuple) and key[0] == "gr"]
    stage = next(i for i in made if keys[i][1][1] in tab.grad_made[k])
    incoming = [keys.index(("free", ("gs", sid))) for sid in tab.grad_freed[k]]
    assert incoming and max(incoming) < stage
    if ("free", ("wsb", k)) in keys:
        assert stage < keys.index(("free", ("wsb", k)))
    assert blocks_peak(r.base_bytes, r.blocks) == r.peak_bytes

"""The allocator placement model (NOTE [ Allocator placement ]) and the search's ranking by it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from memtune.api.cli import resolve_profile
from memtune.profiler.zoo import build
from memtune.tuner.calibration import calibration_for
from memtune.tuner.placement import (
    LARGE_PAGE,
    AllocatorModel,
    AllocatorOutOfMemory,
    AllocatorPricer,
    allocator_cost,
    predict_retries,
)
from memtune.tuner.plan import Action, Plan
from memtune.tuner.policies import POLICIES
from memtune.tuner.search import tune
from memtune.tuner.simulator import Simulator
from memtune.tuner.stage_choices import stage_actions

MiB = 2**20
GiB = 2**30
EVENTS = Path(__file__).parents[3] / "benchmarks/results/allocator/events-vgg16-256-float32-0.7.json.gz"


def test_a_freed_block_is_reused_best_fit_and_split() -> None:
    m = AllocatorModel(10 * GiB)
    m.malloc("a", 100 * MiB)
    m.malloc("b", 300 * MiB)
    m.malloc("c", 50 * MiB)
    m.free("b")
    reserved = m.reserved
    m.malloc("d", 200 * MiB)  # fits in b's hole: no new pages
    assert m.reserved == reserved and m.retries == 0
    m.malloc("e", 100 * MiB)  # the rest of b's hole
    assert m.reserved == reserved


def test_fragmented_free_memory_costs_a_retry_and_an_impossible_request_fails() -> None:
    m = AllocatorModel(1000 * MiB)
    for i in range(5):
        m.malloc(i, 200 * MiB)  # 1000 MiB mapped: the cap
    m.free(1)
    m.free(3)  # 400 MiB free, but in two 200 MiB holes
    assert m.malloc("big", 400 * MiB - LARGE_PAGE)  # 380 MiB: True, it took a retry...
    assert m.retries == 1 and m.remapped_bytes == 400 * MiB  # ...which unmapped both holes
    with pytest.raises(AllocatorOutOfMemory):
        m.malloc("too much", 200 * MiB)


def test_bad_requests_say_what_is_wrong(vgg16) -> None:  # type: ignore[no-untyped-def]
    m = AllocatorModel(GiB)
    m.malloc("a", MiB)
    with pytest.raises(ValueError, match="'a' is already live"):
        m.malloc("a", MiB)
    with pytest.raises(ValueError, match="no live allocation 'b'"):
        m.free("b")
    with pytest.raises(ValueError, match="steps must be at least 1"):
        predict_retries(vgg16, Plan.uniform(vgg16.n_stages), GiB, steps=0)
    with pytest.raises(ValueError, match="block_scale must be positive"):
        predict_retries(vgg16, Plan.uniform(vgg16.n_stages), GiB, block_scale=0.0)


def test_frees_merge_with_free_neighbours() -> None:
    m = AllocatorModel(1000 * MiB)
    for i in range(3):
        m.malloc(i, 300 * MiB)
    m.free(0)
    m.free(1)  # 0 and 1 become one 600 MiB block
    assert not m.malloc("x", 600 * MiB)
    assert m.retries == 0


def test_the_model_retries_where_the_h200_did() -> None:
    """Replaying the exact requests of a capped VGG-16 step traced on the H200 (three steps, 17 retries)."""
    with gzip.open(EVENTS) as f:
        data = json.loads(f.read())
    events = data["events"]
    retried_at = set()
    k = 0
    while k < len(events):  # a retry shows as a run of segment_unmap rows before the request it served
        if events[k][0] == "segment_unmap":
            while events[k][0] != "alloc":
                k += 1
            retried_at.add(k)
        k += 1
    assert len(retried_at) == data["retries"] == 17
    # the segment already held the parameters, the batch and a free block below the first mapping
    first_map, first_alloc = events[0][1], events[1][1]
    m = AllocatorModel(14647401731)  # the traced budget, bytes
    m.reserved = int(1.2 * GiB)  # mapped before the trace began (parameters, gradients' pool, batch)
    seg = m._large
    free_below = first_map - first_alloc
    seg.blocks[0].start = 0
    seg.blocks.insert(0, type(seg.blocks[0])(-free_below, free_below, "free"))
    seg.blocks.insert(0, type(seg.blocks[0])(-free_below - GiB, GiB, "alloc"))
    seg.index_free()
    predicted = set()
    for k, (action, addr, size, _stream) in enumerate(events):
        if action == "alloc":
            if m.malloc(addr, size):
                predicted.add(k)
        elif action == "free_completed":
            m.free(addr)
    assert len(predicted & retried_at) >= 15  # 15 of 17 at the very request, measured 2026-11-21
    assert len(predicted - retried_at) <= 1


@pytest.fixture(scope="module")
def vgg16():  # type: ignore[no-untyped-def]
    return resolve_profile(build("vgg16", {}), 256, "float32", "h200")


def test_every_tensor_the_simulator_allocates_it_frees(vgg16) -> None:  # type: ignore[no-untyped-def]
    """Tensor by tensor, a step leaves only the parameters' gradients (freed by zero_grad)."""
    sim = Simulator(vgg16, merge=False)
    peak = sim.run(Plan.uniform(vgg16.n_stages)).peak_bytes
    for name, policy in POLICIES.items():
        plan = policy(vgg16, int(0.7 * peak))
        res = sim.run(plan, timeline=True)
        live: dict[object, int] = {}
        for op, key, nbytes in res.blocks:
            if op == "alloc":
                assert key not in live, (name, key)
                live[key] = nbytes
            else:
                assert live.pop(key) == nbytes, (name, key)
        assert all(isinstance(k, tuple) and k[0] == "p" for k in live), (name, sorted(map(str, live)))
        assert sum(live.values()) == sum(s.param_bytes for s in vgg16.stages)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "batch", "dtype"), [("resnet50", 256, "bfloat16"), ("gpt", 16, "float32")])
def test_random_plans_free_every_tensor(model: str, batch: int, dtype: str) -> None:
    """Random mixes of keep/offload/recompute under every sync mode: the tensor events stay consistent."""
    import random

    prof = resolve_profile(build(model, {}), batch, dtype, "h200")
    sim = Simulator(prof, merge=False)
    rng = random.Random(0)
    for i in range(40):
        actions = [rng.choice(acts) for acts in stage_actions(prof)]
        sync = ("deferred", "layer", "inline")[i % 3]
        plan = Plan(actions=actions, sync=sync, prefetch_lookahead=rng.randrange(9), sync_delay=rng.randrange(1, 6))
        live: dict[object, int] = {}
        for op, key, nbytes in sim.run(plan, timeline=True).blocks:
            if op == "alloc":
                assert key not in live, (plan.compact(), key)
                live[key] = nbytes
            else:
                assert live.pop(key) == nbytes, (plan.compact(), key)
        assert all(isinstance(k, tuple) and k[0] == "p" for k in live), plan.compact()
        predict_retries(prof, plan, 2**40, steps=2)  # replays without error


def test_predicted_retries_follow_the_budget(vgg16) -> None:  # type: ignore[no-untyped-def]
    plan = Plan.uniform(vgg16.n_stages, Action.KEEP)
    roomy = predict_retries(vgg16, plan, 40 * GiB)
    assert roomy.out_of_memory is None and roomy.steady_retries == 0 and roomy.cost_ms(3.0) == 0
    tight = predict_retries(vgg16, plan, 10 * GiB)
    assert tight.out_of_memory is not None  # 19.5 GiB of live tensors cannot fit 10 GiB


@pytest.mark.slow
def test_the_search_prices_retries_and_stays_no_worse_than_the_baselines(vgg16) -> None:  # type: ignore[no-untyped-def]
    budget = int(0.9 * 20924859616)
    plain = tune(vgg16, budget, trials=60, headroom=0.05, placement=False)
    placed = tune(vgg16, budget, trials=60, headroom=0.05)
    assert plain.best is not None and placed.best is not None
    assert plain.best.alloc_retries is None
    assert placed.best.alloc_retries is not None
    # the priced step: simulator plus what its predicted retries cost
    again = predict_retries(vgg16, placed.best.plan, budget)
    assert placed.best.allocator_ms == pytest.approx(again.cost_ms(calibration_for("h200").remap_ms_per_gib or 0.0))
    feasible = [c.step_ms for c in placed.policies if c.feasible]
    assert not feasible or placed.best.step_ms <= min(feasible) + 1e-9
    assert "allocator_ms" in placed.best.to_dict() and "allocator_ms" not in plain.best.to_dict()


def test_the_free_index_follows_the_blocks_and_the_first_fit_rule() -> None:
    """Random requests and frees: the segments' index of free blocks is their free blocks, and each request takes
    the block a scan of every block in (size, address) order picks (``get_free_block``)."""
    import random

    rng = random.Random(3)
    for cap in (1 * GiB, 3 * GiB):
        m = AllocatorModel(cap)
        live: list[int] = []
        for k in range(1500):
            if live and rng.random() < 0.45:
                m.free(live.pop(rng.randrange(len(live))))
            else:
                size = rng.choice(
                    (rng.randrange(1, MiB), rng.randrange(MiB, 64 * MiB), rng.randrange(64 * MiB, 300 * MiB))
                )
                seg = m._small if size <= MiB else m._large
                bl = seg.blocks
                fits = sorted((b.size, b.start, i) for i, b in enumerate(bl) if b.state == "free" and b.size >= size)

                def grows(bl: list, i: int) -> int:  # type: ignore[type-arg]
                    nxt = bl[i + 1] if i + 1 < len(bl) else None
                    return bl[i].size + (nxt.size if nxt is not None and nxt.state == "unmapped" else 0)

                j = 0
                while j + 1 < len(fits) and grows(bl, fits[j + 1][2]) < grows(bl, fits[j][2]):
                    j += 1
                assert m._best_fit(seg, -(-size // 512) * 512) == (fits[j][2] if fits else None)
                try:
                    m.malloc(k, size)
                    live.append(k)
                except AllocatorOutOfMemory:
                    pass
            for seg in (m._small, m._large):
                assert seg.free == {b.start: b for b in seg.blocks if b.state == "free"}


def test_the_pricer_prices_as_allocator_cost(vgg16) -> None:  # type: ignore[no-untyped-def]
    """``AllocatorPricer`` (one simulator, one replay per sequence of events) gives ``allocator_cost``'s answers."""
    peak = Simulator(vgg16).run(Plan.uniform(vgg16.n_stages)).peak_bytes
    pricer = AllocatorPricer(vgg16, 13 * GiB)
    for name, policy in POLICIES.items():
        plan = policy(vgg16, int(0.65 * peak))
        assert pricer.cost(plan) == allocator_cost(vgg16, plan, 13 * GiB), name
        assert pricer.cost(plan) == allocator_cost(vgg16, plan, 13 * GiB), name  # replayed once

"""The simulator's memory ledger (``memtune.tuner._ledger``): its two views of one step, the running total whose maximum
is ``SimResult.peak_bytes`` and the tensor-by-tensor blocks the allocator model replays (NOTE [ Allocator placement ]),
agree on random plans of committed chain profiles: the blocks replayed one at a time peak at ``peak_bytes``, end where
the timeline ends, and the timeline's maximum is the peak.

Under ``inline`` sync the blocks peak at most at ``peak_bytes``: a stage's on-demand fetches are written as one block
allocated and freed before its workspace and gradients, where the running total counts them together (NOTE [ Inline
fetches ])."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtune.profiler import Profile
from memtune.tuner._ledger import Ledger, blocks_peak
from memtune.tuner.simulator import SimResult, Simulator
from tests.unit.tuner.random_plans import random_plans

DATA = Path(__file__).resolve().parents[3] / "memtune" / "profiler" / "data"
PROFILES = (
    "resnet50-b256-float32-h100",  # convolution algorithm tables, selective stages
    "vgg16-b256-bfloat16-h100",
    "gpt-b16-float32-h200",
    "alexnet-b256-float32-h100",
    "resnet18-b256-bfloat16-h200",
    "overfeat-b256-bfloat16-h100",
)


def _profile(name: str) -> Profile:
    return Profile.model_validate_json((DATA / f"{name}.json").read_text())


def _final_live(r: SimResult) -> int:
    return r.base_bytes + sum(b if kind == "alloc" else -b for kind, _, b in r.blocks)


def test_the_ledger_replays_the_running_total_and_its_peak() -> None:
    led = Ledger(100, detail=True)
    add = led.events.append
    add((0.0, 50, "fwd %d start", 3))
    add((1.5, -30, "fwd %d end", 3))
    add((2.0, 200, "recompute %d..%d", (1, 2)))
    add((2.5, -220, "loss grad", ()))
    assert led.replay() == (
        320,
        [(0.0, 150, "fwd 3 start"), (1.5, 120, "fwd 3 end"), (2.0, 320, "recompute 1..2"), (2.5, 100, "loss grad")],
    )
    plain = Ledger(100)
    plain.events.append((0.0, 50, "fwd %d start", 3))
    assert (plain.replay(), plain.blocks) == ((150, None), None)
    assert blocks_peak(10, [("alloc", "a", 5), ("alloc", "b", 7), ("free", "a", 5), ("alloc", "c", 4)]) == 22


@pytest.mark.parametrize("name", PROFILES)
def test_the_blocks_peak_where_the_running_total_does(name: str) -> None:
    """60 plans of each profile under ``layer``, ``deferred`` and ``points`` sync: 360 in all."""
    profile = _profile(name)
    sim = Simulator(profile)
    for plan in random_plans(profile, 60, seed=len(name), syncs=("layer", "deferred", "points")):
        r = sim.run(plan, timeline=True, check=False)
        what = f"{name}: {plan.compact()} {plan.sync}"
        assert blocks_peak(r.base_bytes, r.blocks) == r.peak_bytes, what
        assert max(live for _, live, _ in r.timeline) == r.peak_bytes, what
        assert _final_live(r) == r.timeline[-1][1], what
        assert sim.run(plan, check=False).peak_bytes == r.peak_bytes, what  # the fast path or the reference alike


@pytest.mark.parametrize("name", PROFILES[:3])
def test_inline_blocks_peak_at_most_where_the_running_total_does(name: str) -> None:
    profile = _profile(name)
    sim = Simulator(profile)
    for plan in random_plans(profile, 30, seed=len(name) + 1, syncs=("inline",)):
        r = sim.run(plan, timeline=True, check=False)
        assert blocks_peak(r.base_bytes, r.blocks) <= r.peak_bytes, f"{name}: {plan.compact()}"
        assert _final_live(r) == r.timeline[-1][1]

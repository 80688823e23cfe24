"""NOTE [ Peak parts ] (``memtune.tuner.peak_parts``): what a chain's simulated peak holds, part by part, summing to the
peak;
and where a step's time goes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from profiles import MiB, conv_profile

from memtune.profiler import Profile
from memtune.tuner.peak_parts import PARTS, peak_parts, step_parts
from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import Simulator
from memtune.tuner.stage_choices import stage_actions

PROMISES = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "h100" / "promises"


def test_the_peak_of_keeping_everything_by_hand() -> None:
    """relu2's backward starts: the gradients of fc1 and fc2 (9 MiB), relu2's output gradient and its input's (2 x
    64), conv1's and conv2's outputs kept (2 x 64); parameters, momentum and the batch 12 MiB each."""
    p = conv_profile()
    peak = peak_parts(Simulator(p, "sgd"), Plan.uniform(p.n_stages))
    assert (peak.where, peak.stage) == ("bwd 3 start", "relu2.0")
    assert {k: v / MiB for k, v in peak.parts.items() if v} == {
        "parameters": 12,
        "optimizer state": 12,
        "input batch": 12,
        "parameter gradients": 9,
        "activation gradients": 128,
        "kept activations": 128,
    }
    assert list(peak.parts) == list(PARTS)
    assert peak.peak_bytes == 301 * MiB


def test_offloaded_maps_at_the_peak_are_prefetched_ones() -> None:
    p = conv_profile()
    sim = Simulator(p, "adam")
    plan = Plan.uniform(p.n_stages, Action.OFFLOAD)
    parts = peak_parts(sim, plan).parts
    assert parts["kept activations"] == parts["offloads in flight"] == 0
    assert parts["prefetched activations"] == 128 * MiB  # conv1's and conv2's outputs, brought back
    assert parts["optimizer state"] == 2 * parts["parameters"]
    t = step_parts(sim.run(plan))
    assert t.compute_ms + t.forward_stall_ms + t.backward_stall_ms == pytest.approx(t.step_ms)
    assert t.stalled_forward > 0 and t.forward_stall_ms > 0


def _random_plans(profile: Profile, count: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    choices = stage_actions(profile)
    rules = ["default", "fastest", "memory_optimal"] if profile.has_conv_algos else ["default"]
    return [
        Plan(
            actions=tuple(rng.choice(acts) for acts in choices),
            prefetch_lookahead=rng.randint(0, 4),
            sync=rng.choice(["deferred", "layer", "inline"]),
            sync_delay=rng.randint(0, 3),
            conv_rule=rng.choice(rules),  # type: ignore[arg-type]
        )
        for _ in range(count)
    ]


@pytest.mark.parametrize("profile", [conv_profile()], ids=["conv"])
def test_the_parts_sum_to_the_peak_on_random_plans(profile: Profile) -> None:
    sim = Simulator(profile)
    for plan in _random_plans(profile, 200, seed=7):
        peak = peak_parts(sim, plan)  # raises where the parts and the peak disagree
        assert peak.peak_bytes == sim.run(plan).peak_bytes
        assert min(peak.parts.values()) >= 0


@pytest.mark.slow
@pytest.mark.parametrize("model", ["vgg16", "resnet50"])
def test_the_parts_sum_to_the_peak_on_zoo_chains(model: str) -> None:
    from benchmarks.common import zoo_profile

    profile = zoo_profile(model, 256)
    sim = Simulator(profile)
    for plan in _random_plans(profile, 60, seed=8):
        assert sum(peak_parts(sim, plan).parts.values()) == sim.run(plan).peak_bytes


def test_module_profiles_are_refused() -> None:
    profile = Profile.model_validate(json.loads((PROMISES / "unet.json").read_text())["profile"])
    with pytest.raises(ValueError, match="module stages"):
        peak_parts(Simulator(profile), Plan.uniform(profile.n_stages))

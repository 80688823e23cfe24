"""Module stages never change the math: every model of ``models`` under every plan gives the unplanned loss,
gradients and buffers.

Each model is profiled once (``profile_module`` on CPU, one timed round: the timings do not matter here), with the
stages ``find_stages`` finds by default, and run under the uniform plans keep, offload and recompute, one mixed plan
(the actions in turn over the stages) and, where the profile measured it, selective. Runs on CPU in fp32: the
tolerance is 1e-6 relative (``memtune.tuner.runtime.verify.relative_error``); in practice results are bitwise equal.
GPT-2 and Llama have dropout 0.1, MobileNetV2 0.2 and the tuple model 0.1, so recompute must replay the RNG.

The profiles are also checked for what they must show: the U-Net's skip connections live from an encoder stage to
the decoder stage that reads them, Hugging Face decoders are split into their layers, the simulator runs every plan,
recomputing every stage lowers the simulated peak, and the search's best plan for a tighter budget is exact too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from memtune.profiler._profile import Profile
from memtune.profiler.module_profile import profile_module
from memtune.tuner.plan import Action, Plan
from memtune.tuner.runtime._planned import load_plan
from memtune.tuner.runtime.verify import ReferenceStep, check_equivalence, reference_step
from memtune.tuner.search import tune
from memtune.tuner.simulator import Simulator
from tests.unit.modules.models import CASES, Case, build_case

RTOL = 1e-6
UNIFORM = (Action.KEEP, Action.OFFLOAD, Action.RECOMPUTE)


@dataclass(frozen=True)
class Profiled:
    case: Case
    profile: Profile
    reference: ReferenceStep


@pytest.fixture(scope="module")
def profiles() -> Callable[[str], Profiled]:
    """``profiles(name)``: the model ``name``, profiled once in this module, with its unplanned step."""
    done: dict[str, Profiled] = {}

    def get(name: str) -> Profiled:
        if name not in done:
            case = build_case(name)
            profile = profile_module(case.model, case.inputs, loss_fn=case.loss_fn, warmup=0, repeats=1)
            done[name] = Profiled(case, profile, reference_step(case.model, case.inputs, loss_fn=case.loss_fn))
        return done[name]

    return get


@pytest.fixture(params=CASES)
def profiled(request: pytest.FixtureRequest, profiles: Callable[[str], Profiled]) -> Profiled:
    return profiles(request.param)


def mixed_plan(profile: Profile) -> Plan:
    """The actions offload, recompute and keep in turn over the stages."""
    return Plan.from_actions("".join("ork"[k % 3] for k in range(profile.n_stages))).named(profile)


def plans(profile: Profile) -> dict[str, Plan]:
    out = {a.value: Plan.uniform(profile.n_stages, a).named(profile) for a in UNIFORM}
    out["mixed"] = mixed_plan(profile)
    return out


def assert_exact(p: Profiled, plan: Plan) -> None:
    c = p.case
    eq, _ = check_equivalence(c.model, plan, c.inputs, loss_fn=c.loss_fn, reference=p.reference)
    assert eq.ok(RTOL), (plan.compact(), plan.stages, eq)


@pytest.mark.parametrize("action", UNIFORM, ids=lambda a: a.value)
def test_uniform_plan_is_exact(profiled: Profiled, action: Action) -> None:
    plan = Plan.uniform(profiled.profile.n_stages, action).named(profiled.profile)
    assert plan.stages == tuple(s.name for s in profiled.profile.stages)
    assert_exact(profiled, plan)


def test_mixed_plan_is_exact(profiled: Profiled) -> None:
    plan = mixed_plan(profiled.profile)
    assert {Action.OFFLOAD, Action.RECOMPUTE} <= set(plan.actions)
    assert_exact(profiled, plan)


def test_selective_plan_is_exact(profiled: Profiled) -> None:
    profile = profiled.profile
    if not profile.has_selective:
        pytest.skip("the profile measured no stage under selective checkpointing (CPU profiles measure none)")
    actions = [Action.SELECTIVE if s.selective_measured else Action.KEEP for s in profile.stages]
    assert_exact(profiled, Plan.from_actions(actions).named(profile))


def test_selective_runtime_is_exact(profiled: Profiled) -> None:
    """The runtime's ``selective`` (a one-stage checkpoint under selective checkpointing) is exact on every stage,
    alone and beside the other actions, whether or not a profile offers it."""
    profile = profiled.profile
    assert_exact(profiled, Plan.uniform(profile.n_stages, Action.SELECTIVE).named(profile))
    assert_exact(profiled, Plan.from_actions("".join("skor"[k % 4] for k in range(profile.n_stages))).named(profile))


def test_simulator_runs_every_plan_and_recompute_lowers_the_peak(profiled: Profiled) -> None:
    profile = profiled.profile
    sim = Simulator(profile)
    results = {label: sim.run(plan) for label, plan in plans(profile).items()}
    for label, r in results.items():
        assert r.step_ms > 0 and r.peak_bytes > profile.param_bytes, (label, r)
    assert results["recompute"].peak_bytes < results["keep"].peak_bytes, {k: r.peak_bytes for k, r in results.items()}
    assert results["offload"].peak_bytes <= results["keep"].peak_bytes


def test_tuned_plan_survives_json_and_is_exact(profiled: Profiled) -> None:
    """``tune`` on a module profile, halfway between the lowest uniform plan's simulated peak and keep's: its best
    plan names the stages, reads back from JSON, and is exact."""
    profile = profiled.profile
    sim = Simulator(profile)
    peaks = {label: sim.run(plan).peak_bytes for label, plan in plans(profile).items()}
    budget = (min(peaks.values()) + peaks["keep"]) // 2
    result = tune(profile, budget, trials=20, seed=0)
    assert result.best is not None, (budget, peaks)
    plan = load_plan(result.best.plan.model_dump_json())
    assert plan == result.best.plan and plan.stages == tuple(s.name for s in profile.stages)
    assert_exact(profiled, plan)


def test_profile_names_module_stages(profiled: Profiled) -> None:
    profile = profiled.profile
    model = profiled.case.model
    assert profile.stages_from == "modules"
    assert profile.n_stages > 1
    names = [s.name for s in profile.stages]
    assert len(set(names)) == len(names)
    for name in names:
        model.get_submodule(name)  # every stage is a submodule of the model


def test_unet_skip_connection_lives_until_its_decoder(profiles: Callable[[str], Profiled]) -> None:
    unet = profiles("unet").profile
    names = [s.name for s in unet.stages]
    encoders = {k for k, n in enumerate(names) if n.startswith("enc.")}
    decoders = {k for k, n in enumerate(names) if n.startswith("dec.")}
    assert len(encoders) == 3 and len(decoders) == 3, names
    skips = [
        s
        for s in unet.storages
        if s.producer in encoders and any(r in decoders and r != s.producer + 1 for r in s.read_by)
    ]
    assert skips, [(s.producer, s.read_by) for s in unet.storages]
    # the first encoder's output is read by the last decoder: its lifetime spans every stage in between
    first = min(encoders)
    longest = [s for s in skips if s.producer == first]
    assert longest and max(decoders) in longest[0].read_by
    assert set(range(first + 1, max(decoders) + 1)) <= set(longest[0].read_by)


@pytest.mark.parametrize(
    ("name", "layers"),
    [
        ("gpt2", ["transformer.h.0", "transformer.h.1", "transformer.h.2"]),
        ("llama", ["model.layers.0", "model.layers.1"]),
    ],
)
def test_transformer_layers_are_separate_stages(
    profiles: Callable[[str], Profiled], name: str, layers: list[str]
) -> None:
    profile = profiles(name).profile
    names = [s.name for s in profile.stages]
    assert profile.n_stages > len(layers), names
    positions = [names.index(layer) for layer in layers]  # each layer a stage of its own, in order
    assert positions == sorted(positions)


def test_parameters_counted_once(profiled: Profiled) -> None:
    """Every parameter counts once in the profile, a tied one (GPT-2's and ``TiedLM``'s embedding and output
    projection, shared by two stages) too."""
    model = profiled.case.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() yields each once
    assert profiled.profile.param_bytes == total

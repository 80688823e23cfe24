"""Compiled plans (NOTE [ Compiled stages ] in ``memtune.profiler.compiled``): every stage run by ``torch.compile``
under the plan's activation budget, with keep / offload / recompute around the compiled stages.

A compiled plan never changes the compiled math: loss, gradients and buffers are bitwise those of the same model run
compiled without a plan (offload is a copy with the strides kept; recompute re-runs the same compiled graph). The
compiled run itself is the compiler's lowering of the same operations, equal to eager within floating-point
tolerance. On the CPU (inductor's C++ backend); a few seconds of compilation per model.
"""

from __future__ import annotations

import pytest
import torch

from memtune.profiler import zoo
from memtune.profiler.compiled import CompiledStage, compiled_chain
from memtune.profiler.library import find_profile, profile_filename
from memtune.profiler.measure import model_input, profile
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Action, Plan
from memtune.tuner.runtime import check_equivalence, reference_step
from memtune.tuner.search import tune
from memtune.tuner.simulator import simulate

torch.set_num_threads(1)

GPT = {"layers": 2, "width": 32, "heads": 4, "seq_len": 8, "vocab": 64}


def _plans(n: int, budget: float) -> list[Plan]:
    mixed = ("kor" * n)[:n]
    return [
        Plan.from_actions("k" * n, compile_budget=budget),
        Plan.from_actions("o" * n, compile_budget=budget, sync="layer"),
        Plan.from_actions("o" * n, compile_budget=budget, sync="deferred", sync_delay=1, prefetch_lookahead=1),
        Plan.from_actions("r" * n, compile_budget=budget),
        Plan.from_actions(mixed, compile_budget=budget, sync="inline"),
        Plan.from_actions(mixed, compile_budget=budget),
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "params", "budget"),
    [("resnet18", {"image_size": 16, "num_classes": 5}, 0.5), ("gpt", GPT, 0.0)],
)
def test_compiled_plans_equal_the_unplanned_compiled_run_bitwise(
    name: str, params: dict[str, int], budget: float
) -> None:
    torch.manual_seed(0)
    chain = zoo.build(name, params)
    x = model_input(chain, 2)
    ref = reference_step(chain, x, run=compiled_chain(chain, budget).as_sequential())
    for plan in _plans(len(chain), budget):
        eq, pm = check_equivalence(chain, plan, x, steps=2, reference=ref)
        assert (eq.loss, eq.grad, eq.buffer) == (0.0, 0.0, 0.0), (plan.compact(), plan.sync, eq)
        assert all(isinstance(m, CompiledStage) for m in pm.stage_modules())
        if Action.OFFLOAD in plan.actions:
            assert pm.stats.d2h_copies > 0, plan.compact()


@pytest.mark.slow
def test_compiled_run_is_eager_within_tolerance() -> None:
    torch.manual_seed(0)
    chain = zoo.build("gpt", GPT)
    x = model_input(chain, 2)
    eager = reference_step(chain, x)
    eq, _ = check_equivalence(chain, Plan.uniform(len(chain), compile_budget=1.0), x, steps=1, reference=eager)
    assert eq.ok(1e-4), eq


def test_a_chains_compiled_stages_take_the_layout_of_all_their_convolutions_together() -> None:
    from memtune.profiler.region_layout import regions_channels_last
    from memtune.tuner.runtime import planned

    chain = zoo.build("resnet18", {"image_size": 16, "num_classes": 5})
    assert not regions_channels_last([chain.stages[0].module])  # the stem's convolution alone: 3 to 64 channels
    profiled = [s.module for s in compiled_chain(chain, 1.0).stages]
    assert all(isinstance(m, CompiledStage) and m.channels_last for m in profiled)
    assert "convolutions channels-last" in repr(profiled[0])
    pm = planned(chain, Plan.uniform(len(chain), compile_budget=1.0))
    run = pm.stage_modules()
    assert all(isinstance(m, CompiledStage) and m.channels_last for m in run)  # as profiled
    assert pm.stage_modules()[0] is run[0]  # wrapped once, not at every call


def test_compiled_plan_rules() -> None:
    with pytest.raises(ValueError, match=r"stage 1 is 'selective'.*compiled"):
        Plan.from_actions("ks", compile_budget=0.5)
    with pytest.raises(ValueError, match="conv_rule must be 'default'"):
        Plan.from_actions("kk", compile_budget=0.5, conv_rule="fastest")
    with pytest.raises(ValueError, match="less than or equal to 1"):
        Plan.from_actions("kk", compile_budget=1.5)
    with pytest.raises(ValueError, match=r"from 0 to 1, not -0\.1"):
        CompiledStage(torch.nn.Linear(2, 2), -0.1)


@pytest.mark.slow
def test_compiled_profiles_price_compiled_plans_only(tmp_path: object) -> None:
    """A compiled profile at budget 0 saves no more than at budget 1; plans tuned on it carry its budget, and a
    compiled plan is refused on a profile of another budget or an eager one."""
    torch.manual_seed(0)
    chain = zoo.build("gpt", GPT)
    eager = profile(chain, 4, warmup=1, repeats=1)
    low = profile(chain, 4, warmup=1, repeats=1, compile_budget=0.0)
    high = profile(chain, 4, warmup=1, repeats=1, compile_budget=1.0)
    assert (low.compile_budget, high.compile_budget, eager.compile_budget) == (0.0, 1.0, None)
    assert low.compile_seconds is not None and low.compile_seconds >= 0
    blocks = [k for k, s in enumerate(low.stages) if s.name.startswith("blocks.")]
    for k in blocks:  # the partitioner at budget 0 keeps only what it cannot re-make (the block's input)
        assert low.stages[k].saved_bytes < high.stages[k].saved_bytes
    assert [s.flops for s in low.stages] == [s.flops for s in eager.stages]  # FLOPs are the eager operations'
    assert not any(s.selective_measured for s in low.stages)
    fits = simulate(high, Plan.uniform(high.n_stages, Action.RECOMPUTE)).peak_bytes  # a budget some plan fits
    result = tune(high, fits, trials=20, seed=0)
    assert result.best is not None and result.best.plan.compile_budget == 1.0
    assert all(c.plan.compile_budget == 1.0 for c in result.pareto)
    with pytest.raises(PlanError, match="activation budget 1 but the profile was measured with an eager profile"):
        simulate(eager, result.best.plan)
    with pytest.raises(PlanError, match="budget 0; price it on the compiled profile"):
        simulate(low, result.best.plan)


@pytest.mark.slow
def test_compiled_profiles_are_kept_apart(tmp_path: pytest.TempPathFactory) -> None:
    assert profile_filename("gpt", 16, "bfloat16", "h100", 0.5) == "gpt-b16-bfloat16-h100-compiled0.5.json"
    assert profile_filename("gpt", 16, "bfloat16", "h100") == "gpt-b16-bfloat16-h100.json"
    torch.manual_seed(0)
    chain = zoo.build("gpt", GPT)
    compiled = profile(chain, 2, warmup=0, repeats=1, compile_budget=0.5)
    folder = tmp_path  # type: ignore[assignment]
    path = folder / profile_filename(compiled.model, 2, "float32", compiled.device.key, 0.5)  # type: ignore[operator]
    path.write_text(compiled.to_json())
    found = find_profile(compiled.model, 2, "float32", compiled.device.key, directory=folder, compile_budget=0.5)  # type: ignore[arg-type]
    assert found is not None and found.compile_budget == 0.5
    assert find_profile(compiled.model, 2, "float32", compiled.device.key, directory=folder) is None  # type: ignore[arg-type]

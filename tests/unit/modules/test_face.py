"""The ``memtune`` face: tune a profile by the budget grammar, apply the plan, refuse what is not a budget."""

from __future__ import annotations

import pytest
import torch

import memtune
from memtune.profiler.module_profile import profile_module
from memtune.tuner._tuner_errors import BudgetError, PlanError
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import simulate
from tests.unit.modules.models import build_case


@pytest.fixture(scope="module")
def unet() -> tuple[object, memtune.Profile]:
    case = build_case("unet")
    return case, profile_module(case.model, case.inputs, loss_fn=case.loss_fn, warmup=0, repeats=1)


def test_a_budget_of_the_peak_is_of_the_simulated_unconstrained_peak(unet: tuple[object, memtune.Profile]) -> None:
    _, prof = unet
    peak = simulate(prof, Plan.uniform(prof.n_stages).named(prof)).peak_bytes
    tuned = memtune.tune(prof, "85% of peak", trials=20, progress=False, headroom=0.0)
    assert tuned.result.budget_bytes == int(0.85 * peak)
    assert tuned.plan is not None and tuned.plan.stages == tuple(s.name for s in prof.stages)
    assert "best plan" in str(tuned) and tuned.table()[0]["name"] == "none"
    assert memtune.tune(prof, 3 << 30, trials=5, progress=False).result.budget_bytes == 3 << 30


@pytest.mark.parametrize("budget", ["0.6", "2", 0.6])
def test_a_number_without_a_unit_is_refused(unet: tuple[object, memtune.Profile], budget: object) -> None:
    _, prof = unet
    with pytest.raises(BudgetError):
        memtune.tune(prof, budget, trials=5, progress=False)  # type: ignore[arg-type]


def test_planned_takes_what_tune_returned_and_refuses_no_plan(unet: tuple[object, memtune.Profile]) -> None:
    case, prof = unet
    tuned = memtune.tune(prof, "85% of peak", trials=10, progress=False, headroom=0.0)
    planned = memtune.planned(case.model, tuned)  # type: ignore[attr-defined]
    assert planned.plan == tuned.plan
    hopeless = memtune.tune(prof, "1% of peak", trials=5, progress=False)
    with pytest.raises(PlanError, match="no plan fits"):
        memtune.planned(case.model, hopeless)  # type: ignore[attr-defined]


def test_the_printout_states_the_headroom_and_no_infinite_steps(unet: tuple[object, memtune.Profile]) -> None:
    """``print(tuned)`` says the share of the budget plans must fit, lists the best once, and prints no ``inf``."""
    _, prof = unet
    tuned = memtune.tune(prof, "85% of peak", trials=10, progress=False, headroom=0.1)
    text = str(tuned)
    budget = next(line for line in text.splitlines() if line.startswith("budget "))
    assert "plans must fit" in budget and "90% of it (10% is kept free as headroom" in budget
    names = [row["name"] for row in tuned.table()]
    assert len(names) == len(set((row["name"], row["step_ms"]) for row in tuned.table()))
    assert "NOTE [" not in text and "see docs/concepts.md" in text  # words and a docs page, not the source
    assert "peak MiB" in text and "GiB" not in text  # a small model's sizes in one unit that fits, not 0.03 GiB
    nothing = memtune.tune(prof, 1 << 10, trials=5, progress=False, headroom=0.1)
    assert nothing.plan is None
    lines = str(nothing)
    assert "inf" not in lines and "no plan fits" in lines and "the budget less its headroom" in lines


def test_the_models_own_state_dict_loads_into_a_fresh_model(unet: tuple[object, memtune.Profile]) -> None:
    """docs/apply.md: the planned model's checkpoint is the model's own ``state_dict`` (no ``model.`` step)."""
    import copy

    case, prof = unet
    tuned = memtune.tune(prof, "85% of peak", trials=5, progress=False, headroom=0.0)
    run = memtune.planned(case.model, tuned)
    assert list(run.state_dict()) == list(case.model.state_dict())
    fresh = copy.deepcopy(case.model)
    fresh.load_state_dict(run.state_dict())
    assert fresh.load_state_dict(case.model.state_dict()) is not None


class _SharedEmbedding(torch.nn.Module):
    """T5's layout in small: the blocks of a stack call the model's embedding, so no block can be a stage alone."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(8, 8)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(self.embed(x))
        return self.head(x)  # type: ignore[no-any-return]


def test_a_model_planned_coarser_than_its_blocks_says_so() -> None:
    model = _SharedEmbedding()
    with pytest.warns(UserWarning, match="planned coarser than its blocks") as caught:
        prof = memtune.profile(model, torch.randn(4, 8), gpu="h100", progress=False)
    note = next(str(w.message) for w in caught if "planned coarser" in str(w.message))
    assert "its child embed runs 4 times" in note and "stages=" in note
    tuned = memtune.tune(prof, "80% of peak", trials=5, progress=False)
    assert any("planned coarser than its blocks" in line for line in str(tuned).splitlines()[1:3])
    named = memtune.profile(model, torch.randn(4, 8), gpu="h100", progress=False, stages=["blocks.*", "head"])
    assert "coarser" not in named.model_params and "planned coarser" not in str(
        memtune.tune(named, "80% of peak", trials=5, progress=False)
    )


def test_scaled_stages_are_said_in_words(unet: tuple[object, memtune.Profile]) -> None:
    """A profile whose stages were scaled to the whole step says why, not ``(stages scaled x0.636 ...)``."""
    from memtune.tuner.tuned import compute_words

    _, prof = unet
    scaled = prof.model_copy(update={"compute_source": "measured:h100 (stages scaled x0.636 to the whole step)"})
    words = compute_words(scaled)
    assert words.startswith("measured:h100; every stage's times scaled by 0.636") and "x0.636" not in words
    assert compute_words(prof) == prof.compute_source

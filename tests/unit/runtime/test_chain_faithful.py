"""The chain view computes what the model computes, and refuses stages it cannot carry with a clear error.

``memtune.profiler.chain.flatten`` splits only plain ``nn.Sequential`` containers (NOTE [ Which containers are
flattened ]): a subclass with its own ``forward`` (here a skip connection) stays one stage, so every plan
keeps the loss, every parameter gradient and every buffer of the unplanned model (CPU, fp32, 1e-6
relative). A recompute segment whose stages return a dict raises a ``PlanError`` naming the stage
(NOTE [ Chain stages return one tensor ] in ``memtune.tuner.runtime._segments``).
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

from memtune.profiler.chain import flatten
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Action, Plan
from memtune.tuner.runtime import check_equivalence, reference_step
from memtune.tuner.runtime._planned import planned

torch.set_num_threads(1)

RTOL = 1e-6


class SkipSequential(nn.Sequential):
    """A residual block written as a Sequential subclass: ``x + children(x)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + super().forward(x)


class NamedSequential(nn.Sequential):
    """A Sequential subclass that adds an attribute and keeps ``nn.Sequential.forward``: still flattened."""

    stage_kind = "named"


def skip_model() -> nn.Sequential:
    """Eight stages, one of them the whole ``SkipSequential`` (with BatchNorm buffers inside)."""
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            stem=nn.Linear(6, 8),
            block=SkipSequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 8)),
            act=nn.ReLU(),
            inner=NamedSequential(nn.Linear(8, 8), nn.BatchNorm1d(8)),
            plain=nn.Sequential(nn.GELU(), nn.Dropout(0.5)),
            head=nn.Linear(8, 3),
        )
    )


def test_a_sequential_subclass_with_its_own_forward_is_one_stage() -> None:
    model = skip_model()
    stages = flatten(model)
    assert [s.name for s in stages] == ["stem", "block", "act", "inner.0", "inner.1", "plain.0", "plain.1", "head"]
    assert stages[1].module is model.block
    assert stages[1].kind == "skipsequential"
    # the stages run in order are the model (same dropout mask from the same seed)
    x = torch.randn(4, 6)
    model.eval()
    y = x
    for s in stages:
        y = s.module(y)
    assert torch.equal(y, model(x))
    # a bare root with its own forward is one stage too
    assert [s.name for s in flatten(model.block)] == ["skipsequential"]


def faithful_plans(n: int) -> dict[str, Plan]:
    plans = {a.value: Plan.uniform(n, a) for a in Action}
    plans["alt-kr"] = Plan.from_actions(("kr" * n)[:n])
    plans["alt-or"] = Plan.from_actions(("or" * n)[:n])
    plans["alt-rs"] = Plan.from_actions(("rs" * n)[:n])
    plans["block-recompute"] = Plan.from_actions("kr" + "k" * (n - 2))
    plans["block-offload"] = Plan.from_actions("ooo" + "k" * (n - 3))
    return plans


def test_every_plan_keeps_the_math_of_a_skip_connection() -> None:
    model = skip_model()
    model.train()
    n = len(flatten(model))
    torch.manual_seed(1)
    x = torch.randn(4, 6)
    ref = reference_step(model, x)
    failures = []
    for label, plan in faithful_plans(n).items():
        eq, pm = check_equivalence(model, plan, x, steps=2, reference=ref)
        if not eq.ok(RTOL):
            failures.append(f"{label} ({plan.compact()}): {eq}")
    assert not failures, "\n".join(failures)
    assert n == 8 and pm.stage_names[1] == "block"  # the block ran as one stage


class ToDict(nn.Module):
    """A stage with a structured output, as Hugging Face blocks have."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"hidden": self.proj(x)}


class FromDict(nn.Module):
    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        return d["hidden"]


def dict_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(embed=nn.Linear(3, 4), to_dict=ToDict(), from_dict=FromDict(), head=nn.Linear(4, 2))
    )


@pytest.mark.parametrize(
    "letters",
    [
        "krkk",  # the dict is the segment's output
        "krrk",  # the dict would be the next stage's input inside the segment
        "kkrk",  # the dict is the segment's input, from a kept stage
    ],
)
def test_a_recompute_stage_returning_a_dict_is_a_plan_error(letters: str) -> None:
    model = dict_model()
    x = torch.randn(2, 3)
    model(x).sum().backward()  # the unplanned model runs
    pm = planned(model, Plan.from_actions(letters))
    with pytest.raises(PlanError, match=r"stage 1 \(to_dict\) returned a dict, not one tensor.*memtune\.planned"):
        pm(x)
